"""Expected vs observed NCCL environment: in this process, across process starts, and inside NCCL.

Three checks, each a library function that returns a frozen result (only the
CLI prints):

- ``check_env``: every NCCL_* variable (and any named one) as ``os.environ``
  has it and as libc ``getenv`` sees it (NCCL reads getenv; the two differ after
  ``os.putenv`` or a C-level setenv), compared with an expectation.  A variable
  missing from the environment but set to the expected value by an NCCL config
  file (/etc/nccl.conf, ~/.nccl.conf or NCCL_CONF_FILE) counts as arriving:
  NCCL loads those files with setenv(..., overwrite=0) at init.
- ``check_propagation``: starts children the ways frameworks do (multiprocessing
  fork/spawn/forkserver, subprocess with env=None and env=os.environ.copy(), a
  torchrun worker and a spawn grandchild of it) and reports what arrived in each,
  including two sentinels commdiag sets itself: one before the mechanism started,
  one after (the late-change case), and one set with os.putenv only.
- ``check_nccl``: brings NCCL up under torchrun (one process per visible GPU)
  with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ENV and compares what NCCL says it
  applied, per rank, with the expectation (``compare_nccl`` is the pure part,
  tested on recorded logs).

Imports are light on purpose: ``commdiag check-env`` and ``commdiag.check_env``
run at the top of inference workers and must not import torch; multiprocessing,
subprocess and tempfile are imported only by the checks that start processes
(benchmarks/check_env_startup.py measures the cost).
"""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import ncclog
from .errors import EXIT_USAGE, CommdiagError
from .metadata import libc_getenv

# Statuses of one variable; the first three make a check fail.
MISSING, MISMATCH, DIVERGED = "missing", "mismatch", "diverged"
OK, FROM_CONF, INFO = "ok", "from-conf", "info"
FAILING = (MISSING, MISMATCH, DIVERGED)

EARLY_VAR = "COMMDIAG_PROPAGATION_EARLY"  # set by commdiag before each mechanism starts
LATE_VAR = "COMMDIAG_PROPAGATION_LATE"  # set by commdiag after each mechanism started
PUTENV_VAR = "COMMDIAG_PROPAGATION_PUTENV"  # set with os.putenv only: in getenv, not in os.environ
CHILD_TIMEOUT_S = 60.0  # a Python child that only reads its environment answers in ~1 s even on 2 busy cores
TORCHRUN_TIMEOUT_S = 180.0  # torchrun imports torch in the agent and in no worker; ~5 s here, generous for busy CI
NCCL_TIMEOUT_S = 300.0  # NCCL init on 8 GPUs takes ~10-30 s; a hang must not block forever
_PKG_PARENT = str(Path(__file__).resolve().parent.parent)


# --------------------------------------------------------------------------- expectations


def installed_settings() -> dict[str, str]:
    """Settings of the commdiag hook installed for this interpreter, {} when none is found.

    Read from the hook file itself (``commdiag_nccl_hook.py``, or commdiag's block in a
    ``sitecustomize.py``) on this interpreter's sys.path, in import order: what its start runs.
    """
    from .hooktext import installed_settings as from_hook_files

    return from_hook_files()


def resolve_expectation(expect: dict[str, str] | None = None, profile: str | os.PathLike | None = None,
                        use_installed: bool = True) -> tuple[dict[str, str], str]:
    """The expectation and where it came from: a profile, then --expect on top; else the installed hook."""
    settings: dict[str, str] = {}
    sources = []
    if profile is not None:
        from . import profile as profile_mod

        settings.update(profile_mod.load(profile).settings)
        sources.append(f"profile {profile}")
    if expect:
        settings.update(expect)
        sources.append("--expect")
    if not sources and use_installed:
        settings = dict(installed_settings())
        if settings:
            sources.append("installed hook")
    return settings, " + ".join(sources) or "none"


def parse_assignments(items, what: str = "--expect") -> dict[str, str]:
    """``["NAME=VALUE", ...]`` -> dict, validated like sweep specs (errors name the item)."""
    from . import ncclvars

    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CommdiagError(f"{what} {item!r}: expected NAME=VALUE")
        error, _ = ncclvars.check_setting(name, value)
        if error:
            raise CommdiagError(f"{what} {item!r}: {name}: {error}")
        out[name] = value
    return out


# --------------------------------------------------------------------------- NCCL config files


@dataclass(frozen=True)
class ConfFile:
    path: str
    role: str  # "NCCL_CONF_FILE", "~/.nccl.conf" or "/etc/nccl.conf"
    exists: bool
    settings: dict[str, str] = field(default_factory=dict)


def nccl_conf_files(env: dict | None = None, root: str | None = None) -> list[ConfFile]:
    """NCCL's config files in NCCL's load order (src/misc/param.cc initEnvFunc).

    NCCL_CONF_FILE if set and non-empty, else ``<home>/.nccl.conf`` (home from the
    passwd entry, as NCCL's userHomeDir does), then /etc/nccl.conf.  Each line
    ``NAME=VALUE`` becomes setenv(NAME, VALUE, 0): an earlier file and the process
    environment win.  ``root`` stages a filesystem root (tests).
    """
    env = os.environ if env is None else env

    def rooted(p: str) -> str:
        return os.path.join(root, p.lstrip("/")) if root else p

    files: list[tuple[str, str]] = []
    user_file = env.get("NCCL_CONF_FILE")
    if user_file:
        files.append((user_file, "NCCL_CONF_FILE"))  # an explicit path: used as given, also under ``root``
    else:
        try:
            home = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:
            home = None
        if home:
            files.append((rooted(os.path.join(home, ".nccl.conf")), "~/.nccl.conf"))
    files.append((rooted("/etc/nccl.conf"), "/etc/nccl.conf"))
    out = []
    for path, role in files:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            out.append(ConfFile(path, role, False))
            continue
        out.append(ConfFile(path, role, True, parse_nccl_conf(text)))
    return out


def parse_nccl_conf(text: str) -> dict[str, str]:
    """NCCL's parser: skip lines starting with '#', name up to the first '=', value verbatim to end of line."""
    out: dict[str, str] = {}
    for line in text.split("\n"):
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        out.setdefault(name, value)  # setenv(..., 0): the first line for a name wins within a file too
    return out


def conf_effective(conf: list[ConfFile]) -> dict[str, tuple[str, str]]:
    """NAME -> (value, file) that the config files contribute (before the process environment)."""
    out: dict[str, tuple[str, str]] = {}
    for c in conf:
        for k, v in c.settings.items():
            out.setdefault(k, (v, c.path))
    return out


# --------------------------------------------------------------------------- check_env


@dataclass(frozen=True)
class VarCheck:
    name: str
    expected: str | None  # None: nothing expected, reported for information
    environ: str | None
    getenv: str | None
    status: str  # ok, from-conf, info, missing, mismatch, diverged
    detail: str = ""


@dataclass(frozen=True)
class EnvCheck:
    """One process's NCCL environment against an expectation."""

    pid: int
    executable: str
    source: str  # where the expectation came from
    vars: list[VarCheck]
    conf_files: list[ConfFile] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(v.status in FAILING for v in self.vars)

    @property
    def failures(self) -> list[VarCheck]:
        return [v for v in self.vars if v.status in FAILING]

    def summary(self) -> str:
        """One line for a worker's log."""
        expected = [v for v in self.vars if v.expected is not None]
        head = f"commdiag check-env pid {self.pid}: "
        if not self.ok:
            return head + "FAIL " + "; ".join(f"{v.name} {v.status}: {v.detail}" for v in self.failures)
        if expected:
            return head + f"OK {len(expected)} expected ({self.source}): " + " ".join(
                f"{v.name}={v.getenv if v.getenv is not None else v.expected}" for v in expected)
        seen = " ".join(f"{v.name}={v.getenv}" for v in self.vars) or "no NCCL_* variables"
        return head + f"OK (nothing expected): {seen}"

    __str__ = summary

    def to_json(self) -> dict:
        return {"ok": self.ok, **asdict(self)}


def c_environ_names() -> list[str]:
    """Names in the C environment (what getenv searches), which may hold names os.environ lacks."""
    try:
        environ = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    except (ValueError, OSError):
        return []
    names = []
    i = 0
    while environ[i] is not None:
        names.append(environ[i].split(b"=", 1)[0].decode(errors="replace"))
        i += 1
    return names


def _judge(name: str, expected: str | None, environ: str | None, getenv: str | None,
           conf: dict[str, tuple[str, str]]) -> VarCheck:
    if environ != getenv:
        return VarCheck(name, expected, environ, getenv, DIVERGED,
                        f"os.environ has {environ!r} but getenv (what NCCL reads) has {getenv!r}: "
                        "set it before the process starts, or with os.environ (not os.putenv)")
    if expected is None:
        return VarCheck(name, None, environ, getenv, INFO)
    if getenv is None:
        if name in conf and conf[name][0] == expected:
            return VarCheck(name, expected, environ, getenv, FROM_CONF,
                            f"not in the environment; NCCL takes {expected!r} from {conf[name][1]}")
        hint = f" ({conf[name][1]} sets {conf[name][0]!r})" if name in conf else ""
        return VarCheck(name, expected, environ, getenv, MISSING, f"expected {expected!r}, not set{hint}")
    if getenv != expected:
        return VarCheck(name, expected, environ, getenv, MISMATCH, f"expected {expected!r}, got {getenv!r}")
    return VarCheck(name, expected, environ, getenv, OK)


def check_env(expect: dict[str, str] | None = None, *, profile: str | os.PathLike | None = None,
              names=(), use_installed: bool = True, conf_root: str | None = None) -> EnvCheck:
    """Check this process's environment; never prints, never imports torch.

    ``expect``: NAME -> VALUE; ``profile``: a commdiag profile file; with neither,
    the installed commdiag hook's settings (if any) are the expectation.  Every
    NCCL_* variable in os.environ or in the C environment is reported; ``names``
    adds others.
    """
    expected, source = resolve_expectation(expect, profile, use_installed)
    conf_files = nccl_conf_files(root=conf_root)
    conf = conf_effective(conf_files)
    seen = [n for n in os.environ if n.startswith("NCCL_")]
    seen += [n for n in c_environ_names() if n.startswith("NCCL_")]
    all_names = list(dict.fromkeys([*expected, *names, *sorted(seen)]))
    checks = [_judge(n, expected.get(n), os.environ.get(n), libc_getenv(n), conf) for n in all_names]
    return EnvCheck(os.getpid(), sys.executable, source, checks, conf_files)


# --------------------------------------------------------------------------- propagation


def _observe(names) -> dict:
    return {"pid": os.getpid(), "vars": {n: {"environ": os.environ.get(n), "getenv": libc_getenv(n)} for n in names}}


def _child_write(path: str, names: list[str]) -> None:
    """Runs in a multiprocessing child: write what it sees."""
    Path(path).write_text(json.dumps(_observe(names)))


def _torchrun_worker(out_dir: str, names: list[str]) -> None:
    """Runs as a torchrun worker: write what it sees, then what a spawn grandchild sees."""
    import multiprocessing

    rank = os.environ.get("RANK", "?")
    Path(out_dir, f"torchrun-rank{rank}.json").write_text(json.dumps(_observe(names)))
    ctx = multiprocessing.get_context("spawn")
    gpath = str(Path(out_dir, f"grandchild-rank{rank}.json"))
    p = ctx.Process(target=_child_write, args=(gpath, names))
    p.start()
    p.join(CHILD_TIMEOUT_S)
    if p.is_alive():
        p.kill()


@dataclass(frozen=True)
class PathResult:
    path: str  # the mechanism, e.g. "multiprocessing spawn"
    how: str  # what the late change means for this path
    ok: bool  # every expected variable arrived (os.environ and getenv)
    pid: int | None
    vars: dict[str, dict]  # name -> {"environ": v, "getenv": v}
    error: str | None = None


@dataclass(frozen=True)
class Propagation:
    expected: dict[str, str]
    source: str
    sentinels: dict[str, str]
    paths: list[PathResult]

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.paths)

    def to_json(self) -> dict:
        return {"ok": self.ok, **asdict(self)}


def _arrived(seen: dict, expected: dict[str, str]) -> bool:
    return all(seen.get(n, {}).get("environ") == v and seen.get(n, {}).get("getenv") == v for n, v in expected.items())


def _mp_path(method: str, names, tmp: Path, late_value: str) -> dict:
    import multiprocessing

    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()  # the mechanism "starts": the server freezes its environment now
    os.environ[LATE_VAR] = late_value
    out = tmp / f"{method}.json"
    p = ctx.Process(target=_child_write, args=(str(out), list(names)))
    p.start()
    p.join(CHILD_TIMEOUT_S)
    if p.is_alive():
        p.kill()
        raise TimeoutError(f"child did not answer within {CHILD_TIMEOUT_S:.0f}s")
    if p.exitcode != 0:
        raise RuntimeError(f"child exited with {p.exitcode}")
    return json.loads(out.read_text())


_CHILD_CMD = ("import sys, json; sys.path.insert(0, {parent!r}); from commdiag.envcheck import _observe; "
              "print(json.dumps(_observe(sys.argv[1:])))")


def _subprocess_path(copy_env: bool, names, late_value: str) -> dict:
    import subprocess

    env = os.environ.copy() if copy_env else None  # the framework copies its environment at start-up
    os.environ[LATE_VAR] = late_value
    cp = subprocess.run([sys.executable, "-c", _CHILD_CMD.format(parent=_PKG_PARENT), *names], env=env,
                        capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
    if cp.returncode != 0:
        raise RuntimeError(f"child exited with {cp.returncode}: {cp.stderr.strip()[-300:]}")
    return json.loads(cp.stdout.strip().splitlines()[-1])


_TORCHRUN_SCRIPT = """import sys
sys.path.insert(0, {parent!r})
from commdiag.envcheck import _torchrun_worker
if __name__ == "__main__":
    _torchrun_worker(sys.argv[1], sys.argv[2:])
"""


def _torchrun_paths(names, tmp: Path, late_value: str) -> tuple[dict, dict]:
    import subprocess

    script = tmp / "torchrun_worker.py"
    script.write_text(_TORCHRUN_SCRIPT.format(parent=_PKG_PARENT))
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=1",
            "--max-restarts=0", str(script), str(tmp), *names]
    # env=None: torchrun inherits this process's environment as a shell-started torchrun would.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    os.environ[LATE_VAR] = late_value  # after the agent started: it cannot reach the agent or its workers
    try:
        out, _ = proc.communicate(timeout=TORCHRUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        raise TimeoutError(f"torchrun did not finish within {TORCHRUN_TIMEOUT_S:.0f}s")
    if proc.returncode != 0:
        tail = out.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"torchrun exited with {proc.returncode}: {' | '.join(tail)}")
    return (json.loads((tmp / "torchrun-rank0.json").read_text()),
            json.loads((tmp / "grandchild-rank0.json").read_text()))


def check_propagation(expect: dict[str, str] | None = None, *, profile=None, use_installed: bool = True,
                      torchrun: bool = True) -> Propagation:
    """Start children every way frameworks do; report, per path, which expected variables arrived.

    The expected variables are not set by commdiag: they arrive only if this
    process has them.  Three sentinels are set by commdiag itself:
    EARLY_VAR before anything starts, PUTENV_VAR with os.putenv only, and
    LATE_VAR after each mechanism started (a fresh value per path).  This
    process's os.environ is restored afterwards.
    """
    import multiprocessing
    import tempfile

    expected, source = resolve_expectation(expect, profile, use_installed)
    names = list(dict.fromkeys([*expected, EARLY_VAR, LATE_VAR, PUTENV_VAR]))
    saved = {n: os.environ.get(n) for n in (EARLY_VAR, LATE_VAR)}
    os.environ[EARLY_VAR] = "1"
    os.environ.pop(LATE_VAR, None)
    os.environ.pop(PUTENV_VAR, None)
    os.putenv(PUTENV_VAR, "1")  # after the pop: os.environ.pop unsets it in C too
    results: list[PathResult] = []

    def add(path: str, how: str, fn):
        late = path.replace(" ", "-")
        try:
            seen = fn(late)
            results.append(PathResult(path, how, _arrived(seen["vars"], expected), seen.get("pid"), seen["vars"]))
        except Exception as e:  # a path that cannot run is reported, the others still run
            results.append(PathResult(path, how, False, None, {}, f"{type(e).__name__}: {e}"))
        finally:
            os.environ.pop(LATE_VAR, None)

    with tempfile.TemporaryDirectory(prefix="commdiag-prop-") as d:
        tmp = Path(d)
        results.append(PathResult("this process", "-", _arrived(_observe(names)["vars"], expected), os.getpid(),
                                  _observe(names)["vars"]))
        for method in ("fork", "spawn", "forkserver"):
            if method not in multiprocessing.get_all_start_methods():
                results.append(PathResult(f"multiprocessing {method}", "", False, None, {},
                                          "start method not available on this platform"))
                continue
            how = {"fork": "late var set before Process.start()", "spawn": "late var set before Process.start()",
                   "forkserver": "late var set after the fork server started"}[method]
            add(f"multiprocessing {method}", how, lambda late, m=method: _mp_path(m, names, tmp, late))
        add("subprocess env=None", "late var set before Popen", lambda late: _subprocess_path(False, names, late))
        add("subprocess env=os.environ.copy()", "late var set after the copy was taken",
            lambda late: _subprocess_path(True, names, late))
        if torchrun:
            pair: dict = {}

            def tr(late):
                pair["w"], pair["g"] = _torchrun_paths(names, tmp, late)
                return pair["w"]

            add("torchrun worker", "late var set after torchrun started", tr)
            if "g" in pair:
                add("spawn grandchild of a torchrun worker", "late var set after torchrun started",
                    lambda late: pair["g"])
            else:
                results.append(PathResult("spawn grandchild of a torchrun worker", "", False, None, {},
                                          "torchrun worker did not run"))
    os.unsetenv(PUTENV_VAR)
    for n, v in saved.items():
        if v is None:
            os.environ.pop(n, None)
        else:
            os.environ[n] = v
    sentinels = {EARLY_VAR: "set in os.environ before any child starts",
                 LATE_VAR: "set in os.environ after each mechanism started (value: the path's name)",
                 PUTENV_VAR: "set with os.putenv only (getenv has it, os.environ does not)"}
    return Propagation(expected, source, sentinels, results)


# --------------------------------------------------------------------------- NCCL's own view


@dataclass(frozen=True)
class RankApplied:
    rank: int | None
    pid: int
    device: int
    version: str | None
    applied: dict[str, str]  # what NCCL said it set, NAME -> value
    checks: list[VarCheck]  # expected vs applied (environ/getenv columns hold NCCL's value)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(c.status in FAILING for c in self.checks)


@dataclass(frozen=True)
class NcclCheck:
    expected: dict[str, str]
    source: str
    ranks: list[RankApplied]
    conf_files: list[ConfFile] = field(default_factory=list)
    debug_note: str = ""  # e.g. the user's NCCL_DEBUG was replaced for this check
    exit_code: int | None = None
    log_tail: str = ""
    log: str = ""  # the whole torchrun output (ENV subsystem only: a few lines per rank), kept as evidence

    @property
    def ok(self) -> bool:
        return bool(self.ranks) and all(r.ok for r in self.ranks)

    def to_json(self) -> dict:
        return {"ok": self.ok, **asdict(self)}


UNCONFIRMED = "unconfirmed"  # expected but NCCL did not print it: it prints a variable only when it reads it


def compare_nccl(text: str, expected: dict[str, str], rank_of_pid: dict[int, int] | None = None) -> list[RankApplied]:
    """Pure: NCCL debug output (NCCL_DEBUG_SUBSYS=ENV) -> per-rank applied settings vs expectation."""
    rank_of_pid = rank_of_pid or {}
    out = []
    for pid, proc in sorted(ncclog.parse(text).items(), key=lambda kv: (rank_of_pid.get(kv[0], kv[1].device), kv[0])):
        checks = []
        for name, value in expected.items():
            got = proc.applied.get(name)
            if got is None:
                checks.append(VarCheck(name, value, None, None, UNCONFIRMED,
                                       "NCCL did not report it (NCCL prints a variable when it first reads it; "
                                       "some are read only on some code paths)"))
            elif got != value:
                checks.append(VarCheck(name, value, got, got, MISMATCH, f"NCCL applied {got!r}, expected {value!r}"))
            else:
                checks.append(VarCheck(name, value, got, got, OK))
        for name, got in proc.applied.items():
            if name not in expected:
                checks.append(VarCheck(name, None, got, got, INFO, "applied by NCCL, not in the expectation"))
        out.append(RankApplied(rank_of_pid.get(pid), pid, proc.device, proc.version, dict(proc.applied), checks,
                               list(proc.warnings)))
    return out


_NCCL_WORKER = """import os, sys
import torch, torch.distributed as dist
rank = int(os.environ["RANK"]); local = int(os.environ["LOCAL_RANK"])
print("COMMDIAG-NCCL-RANK %d %d" % (rank, os.getpid()), flush=True)
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
t = torch.ones(1024, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
dist.destroy_process_group()
"""


def gpu_count() -> int:
    """Visible CUDA GPUs, via torch (imports torch: only for --nccl)."""
    try:
        import torch
    except ImportError:
        return 0
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def check_nccl(expect: dict[str, str] | None = None, *, profile=None, use_installed: bool = True,
               nproc: int | None = None, conf_root: str | None = None) -> NcclCheck:
    """Bring NCCL up under torchrun (one process per visible GPU) and compare what it applied."""
    import subprocess
    import tempfile

    n = nproc or gpu_count()
    if n < 1:
        raise CommdiagError("check-env --nccl needs CUDA GPUs and a CUDA build of torch, and this machine has "
                            "none visible; without GPUs use `commdiag check-env` or `commdiag check-env "
                            "--propagation`", exit_code=EXIT_USAGE)
    expected, source = resolve_expectation(expect, profile, use_installed)
    env = dict(os.environ)
    note = ""
    if env.get("NCCL_DEBUG", "").upper() != "INFO" or "NCCL_DEBUG_SUBSYS" in env:
        if "NCCL_DEBUG" in env or "NCCL_DEBUG_SUBSYS" in env:
            note = (f"your NCCL_DEBUG={env.get('NCCL_DEBUG')!r} NCCL_DEBUG_SUBSYS={env.get('NCCL_DEBUG_SUBSYS')!r} "
                    "were replaced by INFO/ENV for this check")
    env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="ENV")
    env.pop("NCCL_DEBUG_FILE", None)  # the log must come to stdout to be parsed
    with tempfile.TemporaryDirectory(prefix="commdiag-nccl-") as d:
        script = Path(d, "nccl_worker.py")
        script.write_text(_NCCL_WORKER)
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                f"--nproc-per-node={n}", "--max-restarts=0", str(script)]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=NCCL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out, _ = proc.communicate()
            raise CommdiagError(f"check-env --nccl: NCCL did not come up within {NCCL_TIMEOUT_S:.0f}s; "
                                f"last output: {out.decode(errors='replace')[-500:]}", exit_code=1)
    text = out.decode(errors="replace")
    ranks = {}
    for line in text.splitlines():
        if line.startswith("COMMDIAG-NCCL-RANK "):
            _, r, p = line.split()
            ranks[int(p)] = int(r)
    return NcclCheck(expected, source, compare_nccl(text, expected, ranks), nccl_conf_files(env, conf_root), note,
                     proc.returncode, "\n".join(text.splitlines()[-20:]) if proc.returncode else "", text)


if __name__ == "__main__":  # pragma: no cover - used as `python -m commdiag.envcheck` for a quick look
    print(check_env().summary())
    sys.exit(0 if check_env().ok else 1)
