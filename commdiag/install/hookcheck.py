"""Starting the target interpreter to see what arrives: install's verification and ``--status``.

Nothing here writes to the target: the fresh processes run with
PYTHONDONTWRITEBYTECODE=1, from a script in a temporary directory (a file, so that
a multiprocessing spawn child can re-import it), and report one JSON line.
``status`` reads the install manifests (hookstate.py) and, for a Python hook,
probes the target (pyprobe.py) and starts it fresh, with the flags a service
uses (``--python-flag -S``), to say whether the hook loads and, if not, why;
that process also runs check-env (envcheck.py, imported from this commdiag
checkout, so the target needs nothing installed).  A target the probe decided to
start as its owner (root, ``--allow-user-owned``; ``PythonHooks.run_as``) is
started so here too, with the script's folder readable but not writable by it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import PACKAGE_PARENT, procs
from ..childpython import child_env
from . import hookplan, hookstate
from ..formats import profile as profile_mod
from ..errors import CommdiagError
from .hookstate import Roots
from ..environment import trust
from ..environment.pyprobe import run_bounded

VERIFY_TIMEOUT_S = 60.0  # a cold interpreter plus one spawn child: ~1 s; generous for a loaded machine


def probe_target(python: str | None, flags=(), allow_user_owned: bool = False):
    from ..environment import pyprobe

    return pyprobe.probe(python, flags=list(flags), cross_check=False, allow_user_owned=allow_user_owned)


def _run_as(hooks_run_as) -> trust.RunAs | None:
    return trust.RunAs(*hooks_run_as, "its tree is another user's") if hooks_run_as else None


@dataclass(frozen=True)
class Verification:
    ok: bool
    detail: str
    seen: dict = field(default_factory=dict)  # process -> name -> {environ, getenv}


# --------------------------------------------------------------------------- verification

# Runs inside the target interpreter, which may not have commdiag (or anything) installed: stdlib only,
# so it reads getenv through ctypes itself rather than through commdiag.metadata.
_VERIFY = r'''
import ctypes, json, multiprocessing, os, sys

def observe(names):
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    out = {}
    for n in names:
        g = libc.getenv(n.encode())
        out[n] = {"environ": os.environ.get(n), "getenv": None if g is None else g.decode("utf-8", "replace")}
    return out

def child(conn, names):
    conn.send(observe(names))
    conn.close()

if __name__ == "__main__":
    names = json.loads(sys.argv[1])
    result = {"fresh": observe(names), "no_site": sys.flags.no_site,
              "hook_module": getattr(sys.modules.get("commdiag_nccl_hook"), "__file__", None),
              "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None)}
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=child, args=(send, names))
    p.start()
    send.close()
    result["spawn child"] = recv.recv() if recv.poll(50) else None
    p.join(10)
    sys.stdout.write("\nCOMMDIAG-VERIFY " + json.dumps(result) + "\n")
'''


def run_fresh(python: str, script: str, args: list[str], *, env: dict, flags=(), run_as=None) -> dict:
    """Run ``script`` (a file, so that spawn children can re-import it) in a fresh ``python``
    (``run_as``: as that user, who may read but not change the script or its folder)."""
    with procs.private_folder("commdiag-verify-") as tmp:  # as root: never under a TMPDIR of another user
        path = os.path.join(tmp, "commdiag_verify.py")
        Path(path).write_text(script)
        if run_as is not None:
            os.chmod(tmp, 0o755)
            os.chmod(path, 0o644)
        try:  # bounded: time, output kept, and no process of it left behind
            rc, out, err, timed_out = run_bounded([python, *flags, path, *args], env=env, cwd=tmp,
                                                  timeout=VERIFY_TIMEOUT_S, run_as=run_as)
        except OSError as e:
            return {"error": f"{python} did not run: {e.strerror or e}"}
    if timed_out:
        return {"error": f"{python} did not finish within {VERIFY_TIMEOUT_S:.0f}s"}
    stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    for line in reversed(stdout.splitlines()):
        if line.startswith("COMMDIAG-VERIFY "):
            try:
                reply = json.loads(line[len("COMMDIAG-VERIFY "):])
            except ValueError:
                break
            if isinstance(reply, dict):
                return reply
            break
    tail = " | ".join((stderr or stdout).strip().splitlines()[-3:])
    tail = tail if len(tail) <= 300 else tail[:300] + " [...]"
    return {"error": f"{python} exited {rc} without a result: {tail or 'no output'}"}


def _fresh_env(names) -> dict:
    # The managed names are removed so that what arrives comes from the hook, not from this shell;
    # no bytecode is written into the target's site-packages by this check.
    env = {k: v for k, v in child_env().items() if k not in names}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def verify_python(python: str, settings: dict[str, str], *, override: bool = False,
                  run_as: list[int] | None = None) -> Verification:
    """Start ``python`` fresh and a spawn child of it; do the values arrive (os.environ and getenv)?
    (``run_as``: the probe's ``PythonHooks.run_as``, [uid, gid] to start it as.)"""
    names = list(settings)
    seen = run_fresh(python, _VERIFY, [json.dumps(names)], env=_fresh_env(names), run_as=_run_as(run_as))
    if "error" in seen:
        return Verification(False, seen["error"])
    bad = []
    for proc in ("fresh", "spawn child"):
        got = seen.get(proc)
        if got is None:
            bad.append(f"{proc}: no answer")
            continue
        for n, v in settings.items():
            if got[n]["environ"] != v or got[n]["getenv"] != v:
                bad.append(f"{proc}: {n} is {got[n]['environ']!r} (getenv {got[n]['getenv']!r}), expected {v!r}")
    if bad:
        return Verification(False, f"a fresh {python} does NOT get the settings: " + "; ".join(bad), seen)
    who = f" (started as uid {run_as[0]})" if run_as else ""
    return Verification(True, f"a fresh {python}{who} and a spawn child of it see all {len(names)} settings "
                              "(os.environ and getenv)", seen)


# --------------------------------------------------------------------------- status

@dataclass(frozen=True)
class FileStatus:
    path: str
    state: str  # "as installed", "changed since install", "missing"


@dataclass(frozen=True)
class InstallStatus:
    record: dict
    files: tuple[FileStatus, ...]
    matches_profile: bool | None  # None: no profile to compare with
    profile_detail: str
    loads: bool | None  # Python hook: does a fresh start of the target run it? None: not checked
    why_not: tuple[str, ...] = ()
    check_env: dict | None = None
    rules_ok: bool | None = None  # a --tuner install: do the installed rules parse as the plugin reads them?
    rules_detail: str | None = None

    @property
    def ok(self) -> bool:
        return (all(f.state == "as installed" for f in self.files) and self.matches_profile is not False
                and self.loads is not False and (self.check_env is None or self.check_env.get("ok", True))
                and self.rules_ok is not False)


@dataclass(frozen=True)
class StatusResult:
    state_dirs: tuple[str, ...]
    installs: tuple[InstallStatus, ...]
    missing_for: str | None = None  # --python X was given and nothing is installed for X
    asked: bool = False  # --python or expected settings were given: "nothing installed" fails the check

    @property
    def ok(self) -> bool:
        # Plain --status is a question, and "nothing installed" an answer (exit 0); asked about an
        # interpreter or settings, nothing installed is a failed check (exit 1)
        return ((bool(self.installs) or not self.asked) and all(i.ok for i in self.installs)
                and self.missing_for is None)

    def to_json(self) -> dict:
        return {"format": "commdiag-hook-status", "version": 1, "ok": self.ok, "state_dirs": list(self.state_dirs),
                "missing_for": self.missing_for,
                "installs": [{"key": i.record["key"], "kind": i.record["kind"], "method": i.record["method"],
                              "target": i.record.get("target"), "settings": i.record.get("settings"),
                              "source": i.record.get("source"), "installed": i.record.get("installed"),
                              "files": [{"path": f.path, "state": f.state} for f in i.files],
                              "matches_profile": i.matches_profile, "profile_detail": i.profile_detail,
                              "loads": i.loads, "why_not": list(i.why_not), "check_env": i.check_env,
                              "rules_ok": i.rules_ok, "rules_detail": i.rules_detail}
                             for i in self.installs]}


_STATUS = _VERIFY.replace('if __name__ == "__main__":', 'def _unused():') + r'''
if __name__ == "__main__":
    names = json.loads(sys.argv[1])
    result = {"no_site": sys.flags.no_site, "fresh": observe(names),
              "hook_module": getattr(sys.modules.get("commdiag_nccl_hook"), "__file__", None),
              "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None)}
    try:
        sys.path.insert(0, sys.argv[2])  # commdiag's own package, importable in any target interpreter
        from commdiag.environment import envcheck
        result["check_env"] = envcheck.check_env(expect=json.loads(sys.argv[3])).to_json()
    except Exception as e:
        result["check_env"] = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
    sys.stdout.write("\nCOMMDIAG-VERIFY " + json.dumps(result) + "\n")
'''


def _file_states(record: dict, roots: Roots) -> tuple[FileStatus, ...]:
    out = []
    for f in record["files"]:
        if f["role"] == hookplan.CACHE:
            continue
        cur = hookstate.read_state(f["path"], roots)
        if cur.kind == hookplan.ABSENT:
            state = "missing"
        elif cur.kind == hookplan.BLOCKED:
            state = "its directory is a symbolic link now"
        elif hookplan._unchanged_since(cur, f):
            state = "as installed"
        else:
            state = "changed since install"
        out.append(FileStatus(f["shown"], state))
    return tuple(out)


def why_not_loaded(record: dict, hooks, fresh: dict, roots: Roots) -> list[str]:
    """Reasons a fresh start of the target does not run the hook (empty when it does)."""
    reasons = []
    if hooks.hooks_disabled or fresh.get("no_site"):
        off = [d for d in hooks.disabled_by if d in ("-S", "no site module")] or ["-S"]
        reasons.append(f"site processing is off ({', '.join(off)}): no sitecustomize or .pth runs at all")
        return reasons
    hook_file = record.get("hook_file")
    if record["method"] == "pth":
        site_dir = record.get("site_dir")
        if site_dir not in hooks.site_packages:
            reasons.append(f"{site_dir} is not a site-packages directory of {hooks.executable} "
                           f"(its site dirs: {', '.join(hooks.site_packages) or 'none'})")
        elif not fresh.get("hook_module"):
            reasons.append(f"{hook_file} did not run at start (missing, or changed since install)")
    else:
        loaded = fresh.get("sitecustomize")
        if hooks.sitecustomize != hook_file:
            reasons.append(f"{hook_file} is shadowed by {hooks.sitecustomize} (first on sys.path)"
                           if hooks.sitecustomize else f"{hook_file} is not on {hooks.executable}'s sys.path")
        elif loaded is None:
            reasons.append(f"{hook_file} failed to import at start")
    return reasons


def _compare_profile(record: dict, expected: dict | None) -> tuple[bool | None, str]:
    installed = record.get("settings") or {}
    if expected is None:
        src = record.get("source", "")
        first = src.split(" + ")[0]
        if first.endswith(".env") and os.path.isfile(first):
            try:
                expected = profile_mod.load(first).settings
            except CommdiagError as e:
                return None, f"cannot compare with {first}: {e}"
            label = first
        else:
            return None, "no profile to compare with (give --from/--profile/--set)"
    else:
        label = "the given settings"
    if installed == expected:
        return True, f"matches {label}"
    diff = [f"{k}: installed {installed.get(k)!r}, profile {expected.get(k)!r}"
            for k in sorted(set(installed) | set(expected)) if installed.get(k) != expected.get(k)]
    return False, f"differs from {label}: " + "; ".join(diff)


def status(*, python: str | None = None, flags=(), root: str | None = None,
           expected: dict[str, str] | None = None, allow_user_owned: bool = False) -> StatusResult:
    """What commdiag installed where, whether it matches, whether the target will load it now."""
    roots = Roots(root)
    dirs = [hookstate.state_dir(roots)]
    if root is None and os.geteuid() != 0 and os.path.isdir("/var/lib/commdiag"):
        dirs.append("/var/lib/commdiag")
    records = [r for d in dirs for r in hookstate.load_manifest(d, roots)["installs"]]
    hooks = probe_target(python, flags, allow_user_owned)
    out = []
    for r in records:
        files = _file_states(r, roots)
        match, detail = _compare_profile(r, expected)
        loads, why, check = None, [], None
        if r["kind"] == "python" and r.get("prefix") == hooks.prefix:
            if any(roots.is_rerooted(f["shown"]) for f in r["files"]):
                why = [f"staged under --root {root}: the interpreter reads /, not the staged tree"]
            else:
                fresh = run_fresh(hooks.executable, _STATUS,
                                  [json.dumps(list(r["settings"])), PACKAGE_PARENT, json.dumps(r["settings"])],
                                  env=child_env(PYTHONDONTWRITEBYTECODE="1"), flags=flags,
                                  run_as=_run_as(hooks.run_as))
                if "error" in fresh:
                    loads, why = False, [fresh["error"]]
                else:
                    why = why_not_loaded(r, hooks, fresh, roots)
                    loads = not why
                    check = fresh.get("check_env")
        elif r["kind"] == "python":
            if python is not None:
                continue  # --python X asks about X: another interpreter's hook is not its answer
            why = [f"for {r.get('target')}, not {hooks.executable} (use --python {r.get('target')})"]
        rules_ok = rules_detail = None
        if r["kind"] == "tuner":
            from . import hooktuner

            rules_ok, rules_detail = hooktuner.check_installed_rules(r)
            match, detail = None, "'as installed' above: the same sha256 and mode as commdiag wrote"
        out.append(InstallStatus(r, files, match, detail, loads, tuple(why), check, rules_ok, rules_detail))
    missing = None
    if python is not None and not any(i.record["kind"] == "python" for i in out):
        missing = hooks.executable
    return StatusResult(tuple(dirs), tuple(out), missing, asked=python is not None or expected is not None)


def render_status(res: StatusResult) -> str:
    lines = []
    if res.missing_for is not None:
        lines.append(f"python {res.missing_for}: nothing installed for this interpreter")
    if not res.installs:
        return "\n".join(lines + ["no commdiag install recorded (manifests looked for in "
                                   + ", ".join(res.state_dirs) + ")"])
    for i in res.installs:
        r = i.record
        lines.append(f"{r['kind']} {r.get('target')} [{r['method']}]: "
                     + " ".join(f"{k}={v}" for k, v in (r.get("settings") or {}).items()))
        lines.append(f"  source: {r.get('source')}; installed {r.get('installed')} by commdiag {r.get('commdiag')}")
        lines += [f"  {f.path}: {f.state}" for f in i.files]
        if i.rules_detail is not None:
            lines.append(f"  rules: {'OK' if i.rules_ok else 'FAIL'}: {i.rules_detail}")
        lines.append(f"  {'files' if r['kind'] == 'tuner' else 'profile'}: {i.profile_detail}")
        if i.loads is not None or i.why_not:
            lines.append("  loads at start: " + ("yes" if i.loads else "NO") + "".join(f"; {w}" for w in i.why_not))
        if i.check_env is not None:
            if "error" in i.check_env:
                lines.append(f"  check-env in a fresh process: could not run: {i.check_env['error']}")
            else:
                bad = [f"{v['name']} {v['status']}" for v in i.check_env.get("vars", [])
                       if v.get("expected") is not None and v.get("status") not in ("ok", "from-conf")]
                lines.append("  check-env in a fresh process: " + ("OK" if i.check_env.get("ok") else "FAIL")
                             + (": " + ", ".join(bad) if bad else ""))
        for c in r.get("commands", []):
            lines.append(f"  after changes: {c}")
    return "\n".join(lines)
