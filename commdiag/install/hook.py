"""``commdiag install-hook``: put the winning NCCL settings where every worker will get them.

Three places, any combination (one invocation, one install record per place):

* the Python hook for an interpreter (``--python``, default: this one), by one of
  two methods, the default chosen from what detect's probe (pyprobe.py) finds:
  ``pth`` (``commdiag_nccl_hook.py`` + ``commdiag-nccl.pth`` in the target's
  site-packages: read at every start whichever sitecustomize wins, the robust
  way inside venvs) or ``sitecustomize`` (create one, or append a marked block to
  the one that loads; Debian's symlinked one is edited at its target, the link is
  kept; one shared with other interpreters is left alone in favour of pth);
* ``--systemd UNIT``: a drop-in with Environment= lines (or an EnvironmentFile=);
* ``--nccl-conf``: NCCL's own config file, read by NCCL in every process.

``--tuner RUN_DIR|RULES`` adds commdiag's tuner plugin and rules as one more
install (hooktuner.py: files in STATE/tuner/) and their two variables to the
settings the targets above carry.

Flow (STYLE principle 9): ``survey`` reads the system, ``hookplan`` makes the
plan (pure), ``--dry-run`` renders it, ``hookstate.apply`` applies it under a
lock and the manifest records the exact undo.  After an install the target
interpreter is started fresh (and a spawn child of it) to check that the values
arrive (hookcheck.py, which also does ``--status``).  ``uninstall`` reads the
manifest and applies the recorded undo.
"""

from __future__ import annotations

import difflib
import json
import os
import posixpath
import pwd
import sys
import textwrap
import time
from dataclasses import dataclass, replace
from pathlib import Path

from .. import __version__, readfile
from . import allowlist, hookplan, hookstate, hooktext, hooktuner, systemd
from ..nccl import ncclvars
from ..formats import profile as profile_mod
from ..environment import trust
from ..errors import CommdiagError, one_line
from .hookcheck import Verification, probe_target, render_status, status, verify_python  # noqa: F401 (the API)
from .hookplan import BLOCK, OWNED, Desired, Plan, Target
from .hookstate import Roots

installed_settings = hooktext.installed_settings  # what check-env expects; lives in the light module
METHODS = ("auto", "pth", "sitecustomize", "none")


# --------------------------------------------------------------------------- what to install

@dataclass(frozen=True)
class Settings:
    values: dict[str, str]
    source: str
    warnings: tuple[str, ...] = ()


def _no_winner_reason(run_dir: Path) -> str:
    """Why a run folder has no profile.env, from what the run folder says."""
    try:
        run = json.loads(readfile.read_text(run_dir / "run.json", what="run folder"))
    except (OSError, ValueError):
        return f"{run_dir} has no profile.env and no readable run.json (is it a commdiag run folder?)"
    verdict = run.get("verdicts", run.get("verdict"))
    bands = sorted(one_line(p.name) for p in run_dir.glob("profile-*.env"))  # names another user chose
    why = "the sweep certified no winner (keep NCCL's defaults)"
    if not run.get("confirmation"):  # no stage 2: screening alone never makes a profile
        why = (f"the run has no confirmation (stage 2), and screening alone never makes a profile: "
               f"commdiag confirm {run_dir}")
    if isinstance(verdict, dict):
        parts = [f"{k}: {v}" for k, v in verdict.items() if isinstance(v, (str, int, float)) or v is None]
        if parts:
            why = "run.json verdicts: " + one_line("; ".join(parts))  # the file's text: one inert line
    elif isinstance(verdict, (str, list)):
        why = f"run.json verdicts: {one_line(verdict)}"
    if bands:
        why += ("; per-band winners exist (" + ", ".join(bands) + ") but no single profile helps every band: "
                f"choose one with --profile {run_dir / bands[0]}")
    return why


def prepare_tuner(path: str | Path, root: str | None = None, cc: str | None = None) -> hooktuner.TunerFiles:
    """``--tuner PATH``: the rules read and checked, the plugin compiled (``cc``: ``--cc``), before
    anything changes."""
    return hooktuner.prepare(path, Roots(root).shown(hookstate.state_dir(Roots(root))), cc)


def resolve_settings(from_dir: str | None = None, profile: str | None = None, sets=(), *,
                     force: bool = False, tuner: hooktuner.TunerFiles | None = None) -> Settings:
    """The settings to install: the run's winner, a profile, then ``--set`` on top, then the two
    variables that load ``--tuner``'s plugin and rules; validated."""
    values: dict[str, str] = {}
    sources: list[str] = []
    warnings: list[str] = []
    if from_dir is not None:
        run_dir = Path(from_dir)
        path = run_dir / "profile.env"
        if os.path.lexists(path):  # a FIFO or a link there is the reader's to refuse, not "no winner"
            values.update(profile_mod.load(path).settings)
            sources.append(str(path))
        else:
            why = _no_winner_reason(run_dir)
            if not force:
                raise CommdiagError(f"--from {run_dir}: nothing to install: {why}. "
                                    "Use --force to install --set/--profile settings anyway")
            warnings.append(f"--from {run_dir}: {why}; installing the given settings anyway (--force)")
            sources.append(f"{run_dir} (no winner; --force)")
    if profile is not None:
        values.update(profile_mod.load(profile).settings)
        sources.append(str(profile))
    for item in sets:
        name, sep, value = item.partition("=")
        if not sep:
            raise CommdiagError(f"--set {item!r}: expected NAME=VALUE")
        error, warning = ncclvars.check_setting(name, value)
        if error:
            raise CommdiagError(f"--set {item!r}: {name}: {error}")
        if warning:
            warnings.append(warning)
        values[name] = value
    if sets:
        sources.append("--set " + " ".join(sets))
    if tuner is not None:
        clash = sorted(n for n in tuner.env() if n in values)
        if clash:
            raise CommdiagError(f"{', '.join(clash)}: given by --tuner and also by --from/--profile/--set; "
                                "give it once")
        values.update(tuner.env())
        sources.append(f"--tuner {tuner.source}")
        warnings += hooktuner.warnings_for(tuner)
    if not values:
        raise CommdiagError("nothing to install: give --from RUN_DIR, --profile FILE, --set NAME=VALUE "
                            "or --tuner RUN_DIR|RULES")
    hooktext.check_values(values)
    return Settings(values, " + ".join(sources), tuple(warnings))


@dataclass(frozen=True)
class Request:
    settings: Settings
    python: str | None = None  # default: this interpreter
    method: str = "auto"
    systemd_unit: str | None = None
    systemd_env_file: bool = False
    nccl_conf: str | None = None  # "system" | "user"
    override: bool = False
    force: bool = False
    root: str | None = None
    tuner: hooktuner.TunerFiles | None = None  # --tuner: its files; its variables are in settings
    allow_user_owned: bool = False  # as root: start a target another user can change as that user


# --------------------------------------------------------------------------- the Python target

_SC_FORMS = ("sitecustomize.py", "sitecustomize/__init__.py", "sitecustomize.pyc")


def sitecustomize_files(hooks, roots: Roots) -> list[str]:
    """Every sitecustomize on the target's path, the one that loads first (target-system paths).

    Under --root they are looked up in the staged tree, so a staged Debian symlink counts."""
    if hooks.hooks_disabled:
        return []
    if roots.root is None or not roots.is_rerooted(hooks.prefix):
        # No staging, or an interpreter that lives inside --root (a venv made there): it is a real
        # interpreter reading the real file system, so what its probe found is what loads.
        return ([hooks.sitecustomize] if hooks.sitecustomize else []) + list(hooks.shadowed_sitecustomize)
    import importlib.machinery

    forms = _SC_FORMS + tuple("sitecustomize" + s for s in importlib.machinery.EXTENSION_SUFFIXES)
    found = []
    for entry in hooks.sys_path:
        for form in forms:
            p = posixpath.join(entry, form)
            if os.path.lexists(roots.staged(p)):
                found.append(p)
                break
    return found


def hook_site_dir(hooks) -> str | None:
    """The site-packages a hook goes into: the first one site.py adds that is not the user site."""
    for sp in hooks.site_packages:
        if sp != hooks.user_site:
            return sp
    return None


def python_target(hooks, requested: str, settings: Settings, *, override: bool, roots: Roots,
                  sitecustomizes: list[str], meta: dict) -> Target:
    """Where the hook goes for this interpreter, by which method, and why (pure but for path lookups)."""
    exe, prefix = hooks.executable, hooks.prefix
    notes: list[str] = []
    sp = hook_site_dir(hooks)
    sitecustomize = sitecustomizes[0] if sitecustomizes else None
    sc_file = sitecustomize if sitecustomize and sitecustomize.endswith(".py") else None
    shared = sitecustomize is not None and not sitecustomize.startswith(prefix.rstrip("/") + "/")
    shadowed_own = [s for s in sitecustomizes[1:] if s.startswith(prefix.rstrip("/") + "/")]
    if hooks.hooks_disabled:
        notes.append(f"warning: {exe} starts with site processing off ({', '.join(hooks.disabled_by)}): "
                     "no sitecustomize or .pth hook runs; use --systemd or --nccl-conf")
    method = requested
    if method == "auto":
        if sp is None:
            method = "sitecustomize"
            notes.append(f"{exe} has no site-packages directory: a sitecustomize is the only Python hook")
        elif hooks.in_venv:
            method = "pth"
            notes.append(f"{exe} is a venv: a .pth file in {sp} is read at every start whichever sitecustomize wins")
        elif sitecustomize is not None:
            method = "pth"
            notes.append(f"{sitecustomize} is another party's sitecustomize: left untouched, a .pth hook "
                         "runs beside it")
        else:
            method = "sitecustomize"
            notes.append(f"no sitecustomize loads for {exe}: commdiag creates one")
    if shadowed_own:
        notes.append(f"{', '.join(shadowed_own)} is shadowed by {sitecustomize} (earlier on sys.path): "
                     "it never runs, so a hook there would not either")
    if method == "sitecustomize" and sitecustomize is not None and (shared or sc_file is None):
        if sp is None:
            raise CommdiagError(f"{sitecustomize}: cannot add a block to it and {exe} has no site-packages for a .pth")
        why = (f"{sitecustomize} is loaded by every interpreter built on {hooks.base_prefix}, not only {exe}"
               if shared else f"{sitecustomize} is not a .py source file commdiag can add a block to")
        notes.append(f"sitecustomize method: {why}; installing with the .pth method instead")
        method = "pth"
    if method == "pth" and sp is None:
        raise CommdiagError(f"{exe}: no site-packages directory for a .pth file; use --method sitecustomize")
    desired: list[Desired] = []
    info = {"target": exe, "prefix": prefix, "settings": dict(settings.values), "override": override,
            "source": settings.source}
    if method == "pth":
        module = posixpath.join(sp, hooktext.HOOK_MODULE + ".py")
        pth = posixpath.join(sp, hooktext.PTH_NAME)
        text = hooktext.hook_block(settings.values, override=override, meta=meta)
        desired += [Desired(roots.staged(module), module, OWNED, text, import_dir=roots.staged(sp),
                            module=hooktext.HOOK_MODULE),
                    Desired(roots.staged(pth), pth, OWNED, hooktext.PTH_LINE)]
        reads = hooks.pth_reads.get(pth) or (2 if hooks.in_venv else 1)
        notes.append(f"hook: {pth} (one line: import {hooktext.HOOK_MODULE}) and {module}; site.py reads "
                     f"the .pth {reads} time(s) per start, the hook is idempotent")
        info["hook_file"] = module
    elif method == "sitecustomize":
        # The prefix guard: a sitecustomize is also imported by venvs made from this interpreter.
        text = hooktext.hook_block(settings.values, override=override, meta=meta, prefix=prefix)
        if sitecustomize is None:
            path = posixpath.join(sp, "sitecustomize.py")
            desired.append(Desired(roots.staged(path), path, BLOCK, text, import_dir=roots.staged(sp),
                                   module="sitecustomize"))
            notes.append(f"creates {path} holding only commdiag's marked block")
            info["hook_file"] = path
        else:
            real = roots.resolve(sitecustomize)
            # a path inside --root that is no link is shown as it is (not as a staged system path)
            shown = sitecustomize if real == posixpath.normpath(sitecustomize) else roots.shown(real)
            if not os.path.isdir(posixpath.dirname(real)):
                raise CommdiagError(f"{sitecustomize} points to {shown}, whose directory does not exist; "
                                    "use --method pth")
            _check_compiles(real, shown)
            desired.append(Desired(real, shown, BLOCK, text, import_dir=roots.staged(posixpath.dirname(sitecustomize)),
                                   module="sitecustomize"))
            via = f" (the file the symlink {sitecustomize} points to; the link is kept)" if shown != sitecustomize else ""
            notes.append(f"appends a marked, removable commdiag block to {shown}{via}; the rest of the file is "
                         "unchanged; the block applies only when sys.prefix is " + prefix)
            info["hook_file"] = sitecustomize
    info["site_dir"] = sp
    return Target(f"python:{prefix}", "python", method, tuple(desired), info, tuple(notes))


def _check_compiles(path: str, shown: str) -> None:
    """A block appended to a sitecustomize that does not compile would never run: refuse first."""
    try:
        # the one reader: a FIFO planted as sitecustomize.py never hangs root (trust.py judged its owner)
        source = readfile.read_bytes(path, 16 << 20, check_owner=False)
    except OSError:
        return  # absent or unreadable: the plan reports it
    try:
        compile(source, shown, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        raise CommdiagError(f"{shown}: does not compile{where}, so Python stops running it before a block "
                            "commdiag appends; fix the file, or use --method pth") from None


# --------------------------------------------------------------------------- systemd and nccl.conf

def systemd_target(unit: str, settings: Settings, *, env_file: bool, roots: Roots, meta: dict) -> Target:
    unit = systemd.unit_name(unit)
    dropin = systemd.dropin_path(unit)
    desired = []
    notes = []
    if env_file:
        ef = systemd.env_file_path(unit)
        desired.append(Desired(roots.staged(ef), ef, OWNED, systemd.env_file_text(settings.values, meta=meta)))
        text = systemd.dropin_text(settings.values, meta=meta, env_file=ef)
        notes.append(f"{dropin}: EnvironmentFile={ef} (values there override the unit's Environment=)")
    else:
        text = systemd.dropin_text(settings.values, meta=meta)
        notes.append(f"{dropin}: Environment= lines (later assignments win: they override the unit's own)")
    desired.insert(0, Desired(roots.staged(dropin), dropin, OWNED, text))
    info = {"target": unit, "settings": dict(settings.values), "source": settings.source, "hook_file": dropin}
    return Target(f"systemd:{unit}", "systemd", "dropin", tuple(desired), info, tuple(notes),
                  tuple(systemd.commands(unit)))


def nccl_conf_path(which: str) -> str:
    if which == "system":
        return "/etc/nccl.conf"
    if which == "user":  # NCCL's userHomeDir: the passwd entry of the real uid
        return posixpath.join(pwd.getpwuid(os.getuid()).pw_dir, ".nccl.conf")
    raise CommdiagError(f"--nccl-conf: {which!r} is not system or user")


def nccl_conf_target(which: str, settings: Settings, *, override: bool, roots: Roots, meta: dict) -> Target:
    path = nccl_conf_path(which)
    block = hooktext.nccl_conf_block(settings.values, meta=meta)
    # NCCL applies each line with setenv(..., overwrite=0): within a file the first line for a
    # name wins, so --override puts the block first and the default appends it (existing lines win).
    notes = [f"{path}: NCCL reads it at init in every process, Python or not; the process environment "
             "always wins over it" + (" (--override only puts commdiag's lines before the file's own)"
                                      if override else "; lines already in the file win over commdiag's")]
    info = {"target": path, "settings": dict(settings.values), "source": settings.source, "hook_file": path,
            "override": override}
    return Target(f"nccl-conf:{path}", "nccl-conf", "block",
                  (Desired(roots.staged(path), path, BLOCK, block, at_top=override),), info, tuple(notes))


# --------------------------------------------------------------------------- install

@dataclass(frozen=True)
class InstallResult:
    plan: Plan
    dry_run: bool
    state_dir: str
    diff: str  # the plan rendered: new files' content, diffs of edited ones
    verification: tuple[Verification, ...] = ()
    warnings: tuple[str, ...] = ()
    named_files: tuple[str, ...] = ()  # settings whose value names a file NCCL loads, reads or writes (shown first)

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verification) and not self.plan.refused

    def to_json(self) -> dict:
        return {"format": "commdiag-install-hook", "version": 1, "action": self.plan.action,
                "dry_run": self.dry_run, "state_dir": self.state_dir, "ok": self.ok,
                "changes": [{"path": c.shown, "staged": c.path, "why": c.why, "before": c.before.kind,
                             "after": c.after.kind, "sha256": c.after.sha256} for c in self.plan.changes],
                "mkdirs": list(self.plan.mkdirs), "rmdirs": list(self.plan.rmdirs),
                "notes": list(self.plan.notes), "warnings": list(self.warnings) + list(self.plan.warnings),
                "refused": list(self.plan.refused), "named_files": list(self.named_files),
                "commands": list(self.plan.commands),
                "verification": [{"ok": v.ok, "detail": v.detail, "seen": v.seen} for v in self.verification]}


def _meta(settings: Settings, python: str | None, root: str | None) -> dict:
    remove = "commdiag install-hook --uninstall" + (f" --python {python}" if python else "") + (
        f" --root {root}" if root else "")
    return {"commdiag": __version__, "source": settings.source,
            "installed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "remove": remove}


def _targets(req: Request, roots: Roots, hooks, meta: dict) -> list[Target]:
    targets: list[Target] = []
    if hooks is not None:
        targets.append(python_target(hooks, req.method, req.settings, override=req.override, roots=roots,
                                     sitecustomizes=sitecustomize_files(hooks, roots), meta=meta))
    if req.systemd_unit:
        targets.append(systemd_target(req.systemd_unit, req.settings, env_file=req.systemd_env_file,
                                      roots=roots, meta=meta))
    if req.nccl_conf:
        targets.append(nccl_conf_target(req.nccl_conf, req.settings, override=req.override, roots=roots, meta=meta))
    if not targets:
        raise CommdiagError("nothing to install into: --method none and neither --systemd nor --nccl-conf")
    if req.tuner is not None:  # first: the files exist before any hook names them
        targets.insert(0, hooktuner.tuner_target(req.tuner, roots))
    return targets


def _real(targets: list[Target], roots: Roots) -> list[Target]:
    """The targets with their directories' links resolved: what apply walks, link-free."""
    return [replace(t, desired=tuple(replace(d, path=roots.real(d.path),
                                             import_dir=roots.real_dir(d.import_dir) if d.import_dir else None)
                                     for d in t.desired)) for t in targets]


def _inside_prefix(targets: list[Target], hooks) -> None:
    """An interpreter started as another user (--allow-user-owned) says where its site-packages
    is: root writes for it only inside its own prefix (trust.check_prefix held that against
    where it lives), after every link is resolved."""
    if hooks is None or not hooks.run_as:
        return
    for t in targets:
        if t.kind != "python":
            continue
        for d in t.desired:
            for p in (d.path, *([d.import_dir] if d.import_dir else [])):
                if not trust.inside(p, hooks.prefix):
                    raise CommdiagError(f"{d.shown}: resolves to {os.path.realpath(p)}, outside {hooks.prefix}, "
                                        f"the prefix of {hooks.executable}; started as uid {hooks.run_as[0]}, "
                                        "it is written for only inside its own tree")


def _plan(req: Request, roots: Roots, hooks, sdir: str) -> tuple[list[Target], Plan]:
    """The install plan against the manifest and the files as they are now."""
    records = {r["key"]: r for r in hookstate.load_manifest(sdir, roots)["installs"]}
    meta = _meta(req.settings, req.python, req.root)
    targets = _real(_targets(req, roots, hooks, meta), roots)
    _inside_prefix(targets, hooks)
    same = [records.get(t.key) for t in targets]
    if all(r is not None and r.get("settings") == t.info.get("settings") and r.get("source") == req.settings.source
           and r.get("override", req.override) == req.override and r.get("method") == t.method
           for r, t in zip(same, targets)):
        # The same install again: keep its date, so that the files are byte-identical and nothing changes.
        meta["installed"] = min(r["installed"] for r in same)
        targets = _real(_targets(req, roots, hooks, meta), roots)
    plan = hookplan.plan_install(targets, _survey(targets, records, roots), records, force=req.force, meta=meta)
    return targets, _drop_unused_tuners(plan, records, roots)


def _drop_unused_tuners(plan: Plan, records: dict[str, dict], roots: Roots) -> Plan:
    """An install that no longer names an earlier ``--tuner``'s files also removes them (exactly)."""
    new_keys = {r["key"] for r in plan.records}
    after = [r for k, r in records.items() if k not in new_keys] + list(plan.records)
    unused = hooktuner.unused_records(after)
    if not unused:
        return plan
    undo = _plan_uninstall(unused, force=False, roots=roots, others=[r for r in after if r not in unused])
    return replace(plan, changes=plan.changes + undo.changes, rmdirs=undo.rmdirs,
                   drop_keys=plan.drop_keys + undo.drop_keys, notes=plan.notes + tuple(
                       f"{r['target']}: the tuner files are no longer named by any install; removed" for r in unused),
                   warnings=plan.warnings + undo.warnings, refused=plan.refused + undo.refused,
                   records=plan.records + undo.records)


def _plan_uninstall(chosen: list[dict], *, force: bool, roots: Roots, others: list[dict] = ()) -> Plan:
    """The undo of ``chosen`` (``others``: the installs that stay, whose files are left to them)."""
    paths = [f["path"] for r in chosen for f in r["files"]]
    bytecode = [f["import_dir"] for r in chosen for f in r["files"] if f.get("import_dir")]
    trusted = frozenset({0, os.geteuid()})  # whose directories no one else can have swapped
    return hookplan.plan_uninstall(chosen, hookstate.snapshot(paths, bytecode, roots), force=force,
                                   others=list(others), trusted_uids=trusted)


def _survey(targets: list[Target], records: dict[str, dict], roots: Roots) -> dict:
    paths = [d.path for t in targets for d in t.desired]
    bytecode = [d.import_dir for t in targets for d in t.desired if d.import_dir]
    for t in targets:
        for f in records.get(t.key, {}).get("files", []):
            paths.append(f["path"])
            if f.get("import_dir"):
                bytecode.append(f["import_dir"])
    return hookstate.snapshot(paths, bytecode, roots)


def render_plan(plan: Plan) -> str:
    """Files and their new content, or a unified diff of an edited one (what --dry-run prints)."""
    out = []
    for d in plan.mkdirs:
        out.append(f"mkdir {d} (0755)")
    for c in plan.changes:
        # the path written (under --root: the staged one) on a line of its own, what and why below it,
        # so a line is a path or at most 100 columns; under --root, the target's path on a third line
        out.append(f"--- {c.path}:")
        out.append(f"    {c.why} ({c.before.kind} -> {c.after.kind}"
                   + (f", mode {c.after.mode:04o})" if c.after.mode is not None else ")"))
        if c.path != c.shown:
            out += ["    staged under --root; the target system's path:", f"    {c.shown}"]
        if c.path.endswith(".pyc") or c.after.kind != hookplan.FILE and c.before.kind != hookplan.FILE:
            continue
        if c.before.binary or c.after.binary:  # a compiled library: its size and hash, never its bytes
            out += [f"  {label}: {len(s.data)} bytes, sha256 {s.sha256}" for label, s in
                    (("now", c.before), ("planned", c.after)) if s.kind == hookplan.FILE]
            continue
        if c.before.kind == hookplan.FILE:
            out += [l.rstrip("\n") for l in difflib.unified_diff(
                c.before.text().splitlines(True), c.after.text().splitlines(True),
                fromfile=f"{c.path} (now)", tofile=f"{c.path} (planned)")]
        else:
            out += ["+" + l for l in c.after.text().splitlines()]
    for d in plan.rmdirs:
        out.append(f"rmdir {d} (if empty)")
    return "\n".join(out) if out else "nothing to change"


def install(req: Request, *, dry_run: bool = False, verify: bool = True) -> InstallResult:
    roots = Roots(req.root)
    if req.method not in METHODS:
        raise CommdiagError(f"--method: {req.method!r} is not one of {', '.join(METHODS)}")
    # the one install rule (allowlist.py): names NCCL reads, files root owns, no dump files system-wide
    allowlist.check(req.settings.values, system_wide=bool(req.systemd_unit) or req.nccl_conf == "system",
                    root=req.root, own=req.tuner.env() if req.tuner is not None else None)
    files = tuple(allowlist.named_files(req.settings.values))
    hooks = probe_target(req.python, allow_user_owned=req.allow_user_owned) if req.method != "none" else None
    sdir = hookstate.state_dir(roots)
    if dry_run:
        targets, plan = _plan(req, roots, hooks, sdir)
        return InstallResult(plan, True, sdir, render_plan(plan), warnings=req.settings.warnings, named_files=files)
    with hookstate.locked(sdir, roots) as state_created:
        committed = Plan("install", (), (), (), (), ())  # on any error: no record (apply rolled back)
        try:
            targets, plan = _plan(req, roots, hooks, sdir)
            created, ids = hookstate.apply(plan, roots)
            committed = plan = _with_dir_ids(_with_created_dirs(plan, created), ids)
        finally:
            # Also removes a lock and state directories this call created when nothing is installed.
            hookstate.commit_records(sdir, committed, state_created, roots)
    checks: list[Verification] = []
    if verify and hooks is not None:
        py = next(t for t in targets if t.kind == "python")
        if any(roots.is_rerooted(d.shown) for d in py.desired):
            checks.append(Verification(True, f"not started: the hook was staged under --root {req.root}, "
                                             "which the interpreter does not read"))
        else:
            checks.append(verify_python(hooks.executable, req.settings.values, override=req.override,
                                        run_as=hooks.run_as))
    return InstallResult(plan, False, sdir, render_plan(plan), tuple(checks), req.settings.warnings, files)


def _with_dir_ids(plan: Plan, ids: dict[str, list[int]]) -> Plan:
    """Record the identity of the directories apply created and wrote in (the plan has those of
    directories that existed when it was made)."""
    def entry(f: dict) -> dict:
        f = dict(f)
        if f.get("dir_id") is None:
            f["dir_id"] = ids.get(posixpath.dirname(f["path"]))
        if f.get("import_dir") and f.get("import_dir_id") is None:
            f["import_dir_id"] = ids.get(f["import_dir"])
        return f

    return replace(plan, records=tuple({**r, "files": [entry(f) for f in r["files"]]} for r in plan.records))


def _with_created_dirs(plan: Plan, created: list[str]) -> Plan:
    """Record the directories apply really created (the plan's list is what was missing when planned)."""
    # a directory an earlier install of the key created (not planned now) stays recorded
    records = tuple({**r, "dirs_created": [d for d in r["dirs_created"] if d in created or d not in plan.mkdirs]
                     + [d for d in created if d not in r["dirs_created"]
                        and any(f["path"].startswith(d + "/") for f in r["files"])]}
                    for r in plan.records)
    return replace(plan, records=records)


# --------------------------------------------------------------------------- uninstall

def _select(manifest: dict, *, keys: set[str] | None) -> list[dict]:
    return [r for r in manifest["installs"]
            if keys is None or r["key"] in keys or f"target:{r.get('target')}" in keys]


def _keys(python: str | None, method: str, unit: str | None, conf: str | None,
          allow_user_owned: bool = False) -> set[str]:
    keys = set()
    if method != "none":
        exe = python or sys.executable
        keys.add(f"target:{exe}")  # the interpreter may be gone (a deleted venv): match the recorded path too
        try:
            keys.add("python:" + probe_target(python, allow_user_owned=allow_user_owned).prefix)
        except CommdiagError:
            pass
    if unit:
        keys.add("systemd:" + systemd.unit_name(unit))
    if conf:
        keys.add("nccl-conf:" + nccl_conf_path(conf))
    return keys


def uninstall(*, python: str | None = None, method: str = "auto", systemd_unit: str | None = None,
              nccl_conf: str | None = None, all_installs: bool = False, root: str | None = None,
              force: bool = False, dry_run: bool = False, allow_user_owned: bool = False) -> InstallResult:
    """Put back every file of the selected installs exactly as it was (bytes, mode, owner, symlinks)."""
    roots = Roots(root)
    sdir = hookstate.state_dir(roots)
    keys = None if all_installs else _keys(python, method, systemd_unit, nccl_conf, allow_user_owned)

    def make(manifest):
        chosen = _select(manifest, keys=keys)
        if not chosen:
            what = "any" if keys is None else ", ".join(sorted(keys))
            raise CommdiagError(f"no commdiag install recorded for {what} in {sdir}"
                                + ("" if keys is None else " (--all removes every recorded install)"))
        # --tuner's files go with the last install that names them
        chosen += [r for r in hooktuner.unused_records([r for r in manifest["installs"] if r not in chosen])]
        return _plan_uninstall(chosen, force=force, roots=roots,
                               others=[r for r in manifest["installs"] if r not in chosen])

    if dry_run:
        plan = make(hookstate.load_manifest(sdir, roots))
        return InstallResult(plan, True, sdir, render_plan(plan))
    if not os.path.exists(os.path.join(sdir, hookstate.MANIFEST_NAME)):
        raise CommdiagError(f"no commdiag install recorded in {sdir}")
    with hookstate.locked(sdir, roots) as state_created:
        plan = make(hookstate.load_manifest(sdir, roots))
        hookstate.apply(plan, roots)
        hookstate.commit_records(sdir, plan, state_created, roots)
    return InstallResult(plan, False, sdir, render_plan(plan))


# --------------------------------------------------------------------------- rendering (the CLI prints these)

def render_install(res: InstallResult) -> str:
    head = {("install", True): "plan (dry run: nothing changed)", ("install", False): "installed",
            ("uninstall", True): "uninstall plan (dry run: nothing changed)", ("uninstall", False): "uninstalled"}
    lines = [f"{head[(res.plan.action, res.dry_run)]}; manifest: {res.state_dir}"]
    lines += [f"  names a file: {f}" for f in res.named_files]  # first: what every NCCL process will open
    if any(c.path != c.shown for c in res.plan.changes):
        lines.append("  staged under --root: every file below is written inside it; the paths after 'why' "
                     "are the target system's")
    lines += [f"  why: {n}" for n in res.plan.notes]
    lines += [f"  warning: {w}" for w in (*res.warnings, *res.plan.warnings)]
    for w in res.plan.refused:  # wrapped at 100 columns, word by word (a path is never split)
        lines += textwrap.wrap(f"  refused: {w}", 100, subsequent_indent="    ", break_long_words=False,
                               break_on_hyphens=False)
    if res.plan.refused:
        lines += ["  the manifest keeps what was refused: put the directory back (or remove it),",
                  "  then run --uninstall again"]
    if res.dry_run:
        lines.append(res.diff)
    else:
        lines += [f"  {c.why}: {c.path} ({c.before.kind} -> {c.after.kind})" for c in res.plan.changes]
        if res.plan.empty:
            lines.append("  nothing to change: already in place")
    for v in res.verification:
        lines.append(f"  verify: {'OK' if v.ok else 'FAILED'}: {v.detail}")
    if res.plan.commands:
        lines.append("then run:")
        lines += [f"  {c}" for c in res.plan.commands]
    return "\n".join(lines)
