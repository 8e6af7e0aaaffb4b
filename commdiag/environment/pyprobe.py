"""Which startup hooks a Python interpreter will run, found without running them.

A hook that sets NCCL variables only helps if the interpreter that runs the
worker loads it.  Three things commonly get in the way: another
``sitecustomize`` earlier on ``sys.path`` (Debian's /usr/lib/python3.X/
sitecustomize.py shadows a venv's own), a flag or variable that turns site
processing off (-S, -I, -s, PYTHONNOUSERSITE), and a different site-packages
than the one the hook was put in.

``probe(python)`` starts the target interpreter with ``-S`` (no site module,
so no sitecustomize, usercustomize or .pth code runs), then replays site.py's
own path set-up by calling the target's ``site.main()`` with the parts that
execute code stubbed out: ``execsitecustomize``/``execusercustomize`` do
nothing and ``addpackage`` records the ``import`` lines of .pth files instead
of executing them (it still adds their path lines).  It then asks the import
system what ``import sitecustomize`` would load and lists every other
sitecustomize on the path.  The environment is kept (no ``-E``): PYTHONPATH,
PYTHONNOUSERSITE and PYTHONUSERBASE change the answer, so the probe answers for
the environment it is given (the caller's by default).

A second, normal start of the interpreter (``cross_check=True``) reports which
sitecustomize was really imported; that does run the target's hooks, exactly as
any start of that interpreter would.  The probe script runs on Python 3.8+.

Both scripts start with childpython's path guard: the folder the probe was started
from is never on their path, and they import only from the target's standard
library.  As root, a target whose tree another user can change is refused, or
with ``allow_user_owned`` started as that user (trust.py), cross-check included.

Known limit: a meta-path finder installed by a .pth ``import`` line (editable
installs do this) is not installed during the replay, so a sitecustomize that
only such a finder provides is not seen by the replay; the cross-check sees it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field, replace

from .. import procs
from ..childpython import child_env, guarded
from ..errors import CommdiagError, brief
from . import trust

PROBE_TIMEOUT_S = 30.0  # a cold interpreter on a loaded machine starts in well under a second
_MARK = "COMMDIAG-PYPROBE "

# Runs inside the target interpreter (started with -S).  Python 3.8+ syntax only.  childpython's
# guard runs first: the modules below come from the target's standard library and nowhere else.
_PROBE = guarded(r'''
import json, os
import importlib.machinery, importlib.util
out = {"error": None}
try:
    try:
        import site
    except ImportError:
        site = None
    # The path without the folder: -c puts it first, after site ran; a real start does not see it
    # then.  From here on nothing is imported: the path is only searched (find_spec).
    sys.path[:] = _commdiag_path
    out["sys_path_before_site"] = list(sys.path)
    out["has_site"] = site is not None
    pth_exec = []
    pth_files = []
    if site is not None:
        def addpackage(sitedir, name, known_paths):
            # site.addpackage, minus the exec of "import" lines: those are recorded.
            reset = known_paths is None
            if reset:
                known_paths = site._init_pathinfo()
            fullname = os.path.join(sitedir, name)
            try:
                with open(fullname, "rb") as f:
                    raw = f.read()
            except OSError:
                return None if reset else known_paths
            pth_files.append(fullname)
            try:
                text = raw.decode("utf-8-sig")
            except UnicodeDecodeError:
                text = raw.decode("latin-1")
            for n, line in enumerate(text.splitlines(), 1):
                if line.startswith("#") or not line.strip():
                    continue
                if line.startswith(("import ", "import\t")):
                    pth_exec.append([fullname, n, line.rstrip("\r\n")])
                    continue
                line = line.rstrip()
                d, dcase = site.makepath(sitedir, line)
                if dcase not in known_paths and os.path.exists(d):
                    sys.path.append(d)
                    known_paths.add(dcase)
            return None if reset else known_paths
        site.addpackage = addpackage
        site.execsitecustomize = lambda: None
        site.execusercustomize = lambda: None
        site.main()
    out["sys_path"] = list(sys.path)
    out["pth_exec"] = pth_exec
    out["pth_files"] = pth_files
    out["executable"] = sys.executable
    out["version"] = "%d.%d.%d" % sys.version_info[:3]
    out["prefix"] = sys.prefix
    out["base_prefix"] = getattr(sys, "base_prefix", sys.prefix)
    out["flags"] = {k: getattr(sys.flags, k, 0) for k in ("ignore_environment", "isolated", "no_user_site", "safe_path")}
    out["env_nousersite"] = bool(os.environ.get("PYTHONNOUSERSITE"))
    if site is not None:
        out["user_site"] = getattr(site, "USER_SITE", None) or site.getusersitepackages()
        out["user_site_enabled"] = bool(site.ENABLE_USER_SITE)
        out["user_site_flag"] = site.ENABLE_USER_SITE  # None: uid/gid differ from euid/egid
        try:
            sp = list(site.getsitepackages())
        except Exception:
            sp = []
        if site.ENABLE_USER_SITE and out["user_site"]:
            sp.insert(0, out["user_site"])
        out["site_packages"] = [p for p in sys.path if p in sp]
        venv_cfg = None
        for d in (os.path.dirname(sys.executable), os.path.dirname(os.path.dirname(sys.executable))):
            if os.path.isfile(os.path.join(d, "pyvenv.cfg")):
                venv_cfg = os.path.join(d, "pyvenv.cfg")
                break
        out["venv_cfg"] = venv_cfg
    else:
        out["user_site"] = None
        out["user_site_enabled"] = False
        out["user_site_flag"] = False
        out["site_packages"] = []
        out["venv_cfg"] = None
    def origin(spec):
        if spec is None:
            return None
        if spec.origin and spec.origin not in ("built-in", "frozen", "namespace"):
            return spec.origin
        locs = list(spec.submodule_search_locations or [])
        return locs[0] if locs else (spec.origin or spec.name)
    for mod in ("sitecustomize", "usercustomize"):
        out[mod] = origin(importlib.util.find_spec(mod))
        every = []
        for entry in sys.path:
            try:
                spec = importlib.machinery.PathFinder.find_spec(mod, [entry])
            except Exception:
                spec = None
            o = origin(spec)
            if o and o not in every:
                every.append(o)
        out["all_" + mod] = every
except Exception as e:
    out["error"] = "%s: %s" % (type(e).__name__, e)
sys.stdout.write("\n''' + _MARK + r'''" + json.dumps(out) + "\n")
''')

_CROSS = guarded(
    "import json\n"
    "def f(n):\n"
    "    m = sys.modules.get(n)\n"
    "    return getattr(m, '__file__', None) or (repr(m) if m is not None else None)\n"
    f"sys.stdout.write('\\n{_MARK}' + json.dumps({{'sitecustomize': f('sitecustomize'), "
    "'usercustomize': f('usercustomize')}) + '\\n')\n"
)


@dataclass(frozen=True)
class PythonHooks:
    """What one interpreter's startup will run, as found by the probe."""

    executable: str
    version: str
    prefix: str
    base_prefix: str
    in_venv: bool
    sys_path: list[str]
    site_packages: list[str]  # the site dirs site.py adds, in sys.path order
    user_site: str | None
    user_site_enabled: bool
    sitecustomize: str | None  # the file `import sitecustomize` will load, as found on sys.path
    usercustomize: str | None  # None also when the user site is disabled (then it is not imported)
    shadowed_sitecustomize: list[str]  # other sitecustomize on the path that will NOT load
    pth_exec: list[tuple[str, int, str]]  # (.pth file, line number, line) for lines that execute code
    disabled_by: list[str]  # what turns hooks off: "-S", "-I", "-E", "-s", "PYTHONNOUSERSITE", ...
    sitecustomize_target: str | None = None  # symlink-resolved sitecustomize (Debian: /etc/python3.X/...)
    usercustomize_target: str | None = None
    shadowed_usercustomize: list[str] = field(default_factory=list)
    pth_files: list[str] = field(default_factory=list)  # every .pth file site.py reads, in order
    # times site.py reads each .pth per start: 2 in a venv (site.venv() and addsitepackages both add
    # the venv's site-packages), so a .pth hook's code runs twice and must be idempotent
    pth_reads: dict[str, int] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)  # interpreter flags the probe assumed the target runs with
    venv_cfg: str | None = None
    loaded_sitecustomize: str | None = None  # from a normal start (cross-check), None if none or skipped
    loaded_usercustomize: str | None = None
    cross_check: str = "skipped"  # "agrees", "skipped", or what differs
    # as root, for a tree another user can change (--allow-user-owned): [uid, gid] every start of it uses
    run_as: list[int] | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        d["pth_exec"] = [list(t) for t in self.pth_exec]
        return d

    @property
    def hooks_disabled(self) -> bool:
        """True when sitecustomize is not imported at all (site off)."""
        return any(x in ("-S", "no site module") for x in self.disabled_by)


def _run(argv: list[str], env: dict | None, stdin: str | None = None, run_as=None) -> dict:
    """Start the target, read its reply; a hostile or broken interpreter costs at most
    PROBE_TIMEOUT_S and procs.OUTPUT_CAP bytes of memory per stream, leaves no process behind (its
    whole process group is killed when it is done or out of time), and ends in one CommdiagError."""
    try:
        rc, out, err, timed_out = run_bounded(argv, env=env, stdin=stdin, run_as=run_as)
    except FileNotFoundError:
        if os.path.lexists(argv[0]):  # the file is there: its #! interpreter (or loader) is not
            raise CommdiagError(f"{argv[0]}: cannot start: the interpreter named on its #! line "
                                "(or its dynamic loader) does not exist") from None
        raise CommdiagError(f"{argv[0]}: no such interpreter") from None
    except PermissionError:
        raise CommdiagError(f"{argv[0]}: not executable") from None
    except OSError as e:
        raise CommdiagError(f"{argv[0]}: cannot start: {e.strerror}"
                            + (" (no #! line, not a program)" if e.errno == errno.ENOEXEC else "")) from None
    if timed_out:
        raise CommdiagError(f"{argv[0]}: did not answer within {PROBE_TIMEOUT_S:.0f}s")
    text = out.decode("utf-8", "replace")
    for line in reversed(text.splitlines()):
        if line.startswith(_MARK):
            try:
                reply = json.loads(line[len(_MARK):])
            except ValueError:
                break
            if not isinstance(reply, dict):
                break
            return reply
    tail = (err or out).decode("utf-8", "replace").strip().splitlines()[-3:]
    shown = _clip(" | ".join(tail)) or "no output"
    raise CommdiagError(f"{argv[0]}: probe failed (exit {rc}): {shown}")


def run_bounded(argv: list[str], *, env: dict | None, stdin: str | None = None, cwd: str | None = None,
                timeout: float | None = None, run_as=None) -> tuple[int | None, bytes, bytes, bool]:
    """Run an untrusted interpreter: (exit code, stdout tail, stderr tail, timed out).

    A procs.run group: in its own session and in ``cwd`` (default ``/``); at most ``timeout``
    seconds (default PROBE_TIMEOUT_S) and procs.OUTPUT_CAP bytes kept per stream; afterwards its
    whole process group, and whatever it started that carries its marker, gets SIGKILL (no grace:
    nothing of it is worth waiting for), so no child it started outlives the call.  ``run_as``
    (trust.RunAs): started as that user, with no other group.  OSError from starting it is raised
    as it is."""
    end = procs.run(argv, env=env, cwd=cwd or "/", deadline_s=PROBE_TIMEOUT_S if timeout is None else timeout,
                    stdin=stdin.encode() if stdin is not None else None, ladder=(), run_as=run_as)
    return end.exit_code, end.stdout, end.stderr, end.timed_out


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + " [...]"


# What the probe script replies, by key: checked before use (the reply comes from the target).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_REPLY = {"executable": (str, type(None)), "version": (str,), "prefix": (str,), "base_prefix": (str,),
          "sys_path": (list,), "site_packages": (list,), "user_site": (str, type(None)),
          "user_site_enabled": (bool, type(None)), "sitecustomize": (str, type(None)),
          "usercustomize": (str, type(None)), "all_sitecustomize": (list,), "all_usercustomize": (list,),
          "pth_exec": (list,), "pth_files": (list,)}


def _check_reply(raw: dict, exe: str) -> None:
    for key, types in _REPLY.items():
        v = raw.get(key)
        ok = isinstance(v, types) and (not isinstance(v, list) or all(
            isinstance(x, str) if key != "pth_exec" else (isinstance(x, list) and len(x) == 3) for x in v))
        if not ok:
            raise CommdiagError(f"{exe}: probe reply is not what commdiag's probe script sends ({key}: "
                                f"{brief(v)}); is this a Python 3.8+ interpreter?")
    if not isinstance(raw.get("flags", {}), dict):
        raise CommdiagError(f"{exe}: probe reply is not what commdiag's probe script sends (flags)")
    for key in _REPLY:  # paths with terminal escapes are printed by detect and used by install-hook
        v = raw.get(key)
        for x in (v if isinstance(v, list) else [v]):
            for text in (x if isinstance(x, list) else [x]):
                if isinstance(text, str) and _CONTROL.search(text):
                    raise CommdiagError(f"{exe}: probe reply has control characters in {key} ({brief(text)}); "
                                        "commdiag will not print or use such a path")


def _disabled_by(flags: list[str], raw: dict) -> list[str]:
    out: list[str] = []
    f = raw.get("flags", {})
    if "-S" in flags:
        out.append("-S")
    if not raw.get("has_site", True):
        out.append("no site module")
    if "-I" in flags or f.get("isolated"):
        out.append("-I")
    if "-E" in flags or (f.get("ignore_environment") and "-I" not in out):
        out.append("-E")
    if "-s" in flags:
        out.append("-s")
    elif f.get("no_user_site") and raw.get("env_nousersite") and not f.get("ignore_environment"):
        out.append("PYTHONNOUSERSITE")
    if raw.get("user_site_flag") is None and not f.get("no_user_site"):
        out.append("user site off: uid/gid differ from euid/egid")
    elif raw.get("user_site_flag") is False and not f.get("no_user_site") and raw.get("venv_cfg"):
        out.append("user site off: venv without system site packages")
    return out


def probe(python: str | None = None, *, root: str | None = None, flags: list[str] | tuple[str, ...] = (),
          env: dict | None = None, cross_check: bool = True, allow_user_owned: bool = False) -> PythonHooks:
    """Probe ``python`` (default: this interpreter) without running its hooks.

    ``flags``: interpreter flags the target is started with (e.g. ``["-I"]``), so
    the answer is for that start.  ``env``: the environment the target starts
    with (default: this process's).  ``root``: a staged filesystem root; an
    absolute ``python`` is looked up under it (tests).  As root, an interpreter
    whose tree another user can change is refused, or with ``allow_user_owned``
    started as that user (trust.py; ``PythonHooks.run_as`` then says whom).
    """
    exe = python or sys.executable
    if root is not None and os.path.isabs(exe):
        exe = os.path.join(root, exe.lstrip("/"))
    flags = list(flags)
    env = child_env(env)
    run_as = None
    if os.geteuid() == 0:
        exe = trust.absolute(exe)
        before = trust.interpreter_findings(exe)
        run_as = trust.decide(before, exe, allow_user_owned)
    # -S stays in the user's flags list for reporting; the probe itself always needs it.
    probe_flags = [f for f in flags if f != "-S"]
    raw = _run([exe, *probe_flags, "-S", "-c", _PROBE], env, run_as=run_as)
    if raw.get("error"):
        raise CommdiagError(f"{exe}: probe failed inside the interpreter: {_clip(str(raw['error']))}")
    _check_reply(raw, exe)
    disabled = _disabled_by(flags, raw)
    site_off = "-S" in disabled or "no site module" in disabled

    sitecustomize = None if site_off else raw["sitecustomize"]
    # site imports usercustomize only when the user site is enabled.
    usercustomize = None if site_off or not raw["user_site_enabled"] else raw["usercustomize"]
    shadowed = [p for p in raw["all_sitecustomize"] if p != raw["sitecustomize"]]
    shadowed_user = [p for p in raw["all_usercustomize"] if p != raw["usercustomize"]]

    hooks = PythonHooks(
        executable=raw["executable"] if run_as is None and raw["executable"] else exe,
        version=raw["version"],
        prefix=raw["prefix"],
        base_prefix=raw["base_prefix"],
        in_venv=raw["prefix"] != raw["base_prefix"],
        sys_path=raw["sys_path"],
        site_packages=raw["site_packages"],
        user_site=raw["user_site"],
        user_site_enabled=bool(raw["user_site_enabled"]) and not site_off,
        sitecustomize=sitecustomize,
        usercustomize=usercustomize,
        shadowed_sitecustomize=shadowed,
        pth_exec=_unique((p, int(n), line) for p, n, line in raw["pth_exec"]) if not site_off else [],
        disabled_by=disabled,
        sitecustomize_target=os.path.realpath(sitecustomize) if sitecustomize else None,
        usercustomize_target=os.path.realpath(usercustomize) if usercustomize else None,
        shadowed_usercustomize=shadowed_user,
        pth_files=_unique(raw["pth_files"]) if not site_off else [],
        pth_reads={p: raw["pth_files"].count(p) for p in _unique(raw["pth_files"])} if not site_off else {},
        flags=flags,
        venv_cfg=raw.get("venv_cfg"),
    )
    if os.geteuid() == 0:
        # what a normal start runs, now that the probe named it; the later starts run as decided here
        run_as = trust.decide(before + trust.hooks_findings(hooks), exe, allow_user_owned)
        if run_as is not None:
            trust.check_prefix(hooks, exe)
            hooks = replace(hooks, run_as=[run_as.uid, run_as.gid])

    loaded_s = loaded_u = None
    verdict = "skipped"
    if cross_check:
        try:
            real = _run([exe, *flags, "-c", _CROSS], env, run_as=run_as)
            loaded_s, loaded_u = (v if isinstance(v, str) else None
                                  for v in (real.get("sitecustomize"), real.get("usercustomize")))
            diffs = []
            if not _same(loaded_s, sitecustomize):
                diffs.append(f"sitecustomize: probe says {sitecustomize}, a normal start imported {loaded_s}"
                             + (" (it may have raised on import)" if loaded_s is None else ""))
            if not _same(loaded_u, usercustomize):
                diffs.append(f"usercustomize: probe says {usercustomize}, a normal start imported {loaded_u}")
            verdict = "; ".join(diffs) if diffs else "agrees"
        except CommdiagError as e:
            verdict = f"normal start failed: {e}"

    return replace(hooks, loaded_sitecustomize=loaded_s, loaded_usercustomize=loaded_u, cross_check=verdict)


def _unique(items) -> list:
    out: list = []
    for x in items:
        if x not in out:
            out.append(x)
    return out


def _same(loaded: str | None, predicted: str | None) -> bool:
    """Compare a module's __file__ with the predicted origin (a .pyc or a package dir may differ in form)."""
    if loaded is None or predicted is None:
        return loaded is None and predicted is None
    a, b = os.path.realpath(loaded), os.path.realpath(predicted)
    if a == b:
        return True
    # a package: __file__ is .../sitecustomize/__init__.py, the predicted origin may be the directory
    return os.path.dirname(a) == b or os.path.dirname(b) == a
