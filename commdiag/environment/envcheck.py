"""Expected vs observed NCCL environment: in this process, across process starts, and inside NCCL.

Checks, each a library function that returns a frozen result (only the
CLI prints):

- ``check_env``: every NCCL_* variable (and any named one) as ``os.environ``
  has it and as libc ``getenv`` sees it (NCCL reads getenv; the two differ after
  ``os.putenv`` or a C-level setenv), compared with an expectation.  A variable
  missing from the environment but set to the expected value by an NCCL config
  file (/etc/nccl.conf, ~/.nccl.conf or NCCL_CONF_FILE) counts as arriving:
  NCCL loads those files with setenv(..., overwrite=0) at init.
- ``check_propagation`` (propagation.py): what arrives in children started the
  ways frameworks do.
- ``check_nccl``: brings NCCL up under torchrun (one process per visible GPU)
  with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ENV,INIT and compares what NCCL says it
  applied, per rank, with the expectation (``compare_nccl`` is the pure part,
  tested on recorded logs); the INIT lines give the transport NCCL connected
  each GPU pair with (``transports``).  With NCCL_TUNER_PLUGIN set it also logs INIT and
  TUNING and proves, per rank, that the plugin loaded and which rule fired for
  which size (``compare_tuner``; a plugin asked for but not loaded fails).

Imports are light on purpose: ``commdiag check-env`` and ``commdiag.check_env``
run at the top of inference workers and must not import torch; multiprocessing,
subprocess and tempfile are imported only by the checks that start processes
(benchmarks/check_env_startup.py measures the cost).
"""

from __future__ import annotations

import ctypes
import os
import pwd
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..nccl import ncclog, ncclvars, transports, tunerlog
from .. import readfile
from ..errors import EXIT_USAGE, CommdiagError
from ..metadata import libc_getenv

# Statuses of one variable; the first three make a check fail.
MISSING, MISMATCH, DIVERGED = "missing", "mismatch", "diverged"
OK, FROM_CONF, INFO = "ok", "from-conf", "info"
FAILING = (MISSING, MISMATCH, DIVERGED)

NCCL_TIMEOUT_S = 300.0  # NCCL init on 8 GPUs takes ~10-30 s; a hang must not block forever


# --------------------------------------------------------------------------- expectations


def installed_settings() -> dict[str, str]:
    """Settings of the commdiag hook installed for this interpreter, {} when none is found.

    Read from the hook file itself (``commdiag_nccl_hook.py``, or commdiag's block in a
    ``sitecustomize.py``) on this interpreter's sys.path, in import order: what its start runs.
    """
    from ..install.hooktext import installed_settings as from_hook_files

    return from_hook_files()


def resolve_expectation(expect: dict[str, str] | None = None, profile: str | os.PathLike | None = None,
                        use_installed: bool = True) -> tuple[dict[str, str], str]:
    """The expectation and where it came from: a profile, then --expect on top; else the installed hook."""
    settings: dict[str, str] = {}
    sources = []
    if profile is not None:
        from ..formats import profile as profile_mod

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


def describe_expectation(source: str) -> str:
    """The words a renderer uses for ``resolve_expectation``'s source: "none" is no expectation at all."""
    if source == "none":
        return "no expectation given (--expect, --profile) and no commdiag hook installed: listing only"
    return f"expectation from {source}"


def parse_assignments(items, what: str = "--expect") -> dict[str, str]:
    """``["NAME=VALUE", ...]`` -> dict, validated like sweep specs (errors name the item)."""
    from ..nccl import ncclvars

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
            # the one reader: a FIFO or /dev/zero named as nccl.conf is skipped, never waited on or read
            # without end; only compared against (check_env never raises): no owner check
            text = readfile.read_bytes(path, 1 << 20, check_owner=False).decode("utf-8", "replace")
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
        _, warning = ncclvars.check_setting(name, getenv or "")
        return VarCheck(name, None, environ, getenv, INFO, warning.split("; ")[0] if warning else "")
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
    tuner: dict | None = None  # compare_tuner's result when NCCL_TUNER_PLUGIN was set (format commdiag-tuner-proof)
    transports: dict | None = None  # the transport per GPU pair from the INIT lines (nccl/transports.py)

    @property
    def ok(self) -> bool:
        return bool(self.ranks) and all(r.ok for r in self.ranks) and (self.tuner is None or self.tuner["ok"])

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


TUNER_PROOF_FORMAT, TUNER_PROOF_VERSION = "commdiag-tuner-proof", 1
CHECK_BYTES = 4096  # check-env's own all-reduce: 1024 float32
MAX_CHECK_BYTES = 256 << 20  # a rule's ends above this are not exercised (GPU memory, time)


def check_sizes(env: dict[str, str]) -> list[int]:
    """The all-reduce sizes (bytes, float32) check-env runs: 4096, and with a readable commdiag rules file
    (NCCL_TUNER_CONFIG_FILE) both ends of every all-reduce rule, so each rule gets a chance to fire."""
    sizes = {CHECK_BYTES}
    path = env.get("NCCL_TUNER_CONFIG_FILE")
    if path and env.get("NCCL_TUNER_PLUGIN"):
        from ..tuner import rules

        try:
            found = rules.load(path)
        except CommdiagError:
            found = []  # the plugin's WARN says why, per rank
        for r in found:
            if r.coll != "allreduce":
                continue
            lo, hi = -(-max(r.min_bytes, 4) // 4) * 4, r.max_bytes // 4 * 4
            sizes.update(b for b in (lo, hi) if lo <= b <= hi and b <= MAX_CHECK_BYTES)
    return sorted(sizes)


def compare_tuner(text: str, requested: str | None, rank_of_pid: dict[int, int] | None = None,
                  sizes: list[int] | tuple[int, ...] = (), pids: list[int] | tuple[int, ...] = ()) -> dict | None:
    """Pure: NCCL debug output (SUBSYS with INIT, TUNING) -> per rank, did the requested tuner plugin load,
    with which rules, and which rule fired for each of ``sizes``.  None when no plugin was requested.

    ``pids``: every rank's process (from the ranks' own lines); a rank whose NCCL said nothing about the
    plugin fails too.  A plugin requested but not loaded is ``ok: false`` with NCCL's reason."""
    if not requested or requested.lower() == "none":
        return None
    rank_of_pid = rank_of_pid or {}
    found = tunerlog.parse(text)
    out = []
    for pid in sorted(set(found) | set(pids), key=lambda p: (rank_of_pid.get(p, 1 << 30), p)):
        t = found.get(pid) or tunerlog.TunerLog("?", pid, -1)
        if t.requested is None:
            t.requested = requested  # NCCL logs it under ENV: asked for all the same
        fired = t.rule_by_size()
        entry = {"rank": rank_of_pid.get(pid), "pid": pid, "device": t.device, **t.to_json(),
                 "summary": t.summary(),
                 "sizes": {str(b): ({"line": fired[b].line, "applied": fired[b].applied, "algo": fired[b].algo,
                                     "proto": fired[b].proto} if b in fired else None) for b in sizes}}
        if found.get(pid) is None:
            entry["problems"] = [f"NCCL_TUNER_PLUGIN={requested} but this rank's NCCL printed no tuner line"]
        out.append(entry)
    if not out:
        out_ok, why = False, f"NCCL_TUNER_PLUGIN={requested} but no rank's NCCL printed a tuner line"
    else:
        out_ok, why = all(not r["problems"] for r in out), None
    return {"format": TUNER_PROOF_FORMAT, "version": TUNER_PROOF_VERSION, "requested": requested, "ok": out_ok,
            "error": why, "sizes": list(sizes), "ranks": out}


def render_tuner(proof: dict) -> list[str]:
    """check-env --nccl's lines for the tuner: per rank loaded or FAILED, rules, and the rule per size."""
    lines = [f" tuner plugin {proof['requested']}: {'ok' if proof['ok'] else 'FAILED'}"]
    if proof.get("error"):
        lines.append(f"  FAILED: {proof['error']}")
    for r in proof["ranks"]:
        rank = r["rank"] if r["rank"] is not None else "?"
        lines.append(f"  rank {rank} pid {r['pid']}: {r['summary']}")
        for p in r["problems"]:
            lines.append(f"   FAILED: {p}")
        if r["loaded"]:
            for size, hit in r["sizes"].items():
                what = ("no rule" if hit is None else f"rule line {hit['line']} "
                        + ("applied" if hit["applied"] else "NOT applied") + f" -> {hit['algo']}/{hit['proto']}")
                lines.append(f"   all-reduce {size:>10} B: {what}")
    return lines


_NCCL_WORKER = """import os, sys
import torch, torch.distributed as dist
rank = int(os.environ["RANK"]); local = int(os.environ["LOCAL_RANK"])
print("COMMDIAG-NCCL-RANK %d %d" % (rank, os.getpid()), flush=True)
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
for nbytes in (int(b) for b in sys.argv[1:] or ["4096"]):
    t = torch.ones(nbytes // 4, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
dist.destroy_process_group()
"""


def gpu_count() -> int:
    """Visible CUDA GPUs, via torch (imports torch: only for --nccl); 0 at once without a driver."""
    from . import gpusigns

    if gpusigns.no_cuda_driver():
        return 0
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
    from .. import procs
    from ..childpython import module_argv

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
                    "were replaced for this check")
    requested = env.get("NCCL_TUNER_PLUGIN")
    requested = None if requested and requested.lower() == "none" else requested
    # INIT: the connection lines (transport per GPU pair) and the plugin's load and rules lines;
    # TUNING: NCCL's choice per call (check-env times nothing)
    env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="ENV,INIT,TUNING" if requested else "ENV,INIT")
    sizes = check_sizes(env)
    env.pop("NCCL_DEBUG_FILE", None)  # the log must come to stdout to be parsed
    with procs.private_folder("commdiag-nccl-") as d:
        script = d / "nccl_worker.py"
        script.write_text(_NCCL_WORKER)
        argv = module_argv("torch.distributed.run", ["--standalone", "--nnodes=1", f"--nproc-per-node={n}",
                                                     "--max-restarts=0", str(script), *map(str, sizes)])
        # cwd: a Python child puts its working folder first on its path; this one holds only the worker.
        # torchrun starts each worker in a session of its own: past the deadline procs ends the agent's
        # group, then the workers by their marker, and stops reading the pipe they hold.
        end = procs.run(argv, env=env, cwd=d, deadline_s=NCCL_TIMEOUT_S, stdout=procs.PIPE, stderr=procs.STDOUT)
        out = end.stdout
        if end.timed_out:
            raise CommdiagError(f"check-env --nccl: NCCL did not come up within {NCCL_TIMEOUT_S:.0f}s; "
                                f"last output: {out.decode(errors='replace')[-500:]}", exit_code=1)
    text = out.decode(errors="replace")
    ranks = {}
    for line in text.splitlines():
        if line.startswith("COMMDIAG-NCCL-RANK "):
            _, r, p = line.split()
            ranks[int(p)] = int(r)
    return NcclCheck(expected, source, compare_nccl(text, expected, ranks), nccl_conf_files(env, conf_root), note,
                     end.exit_code, "\n".join(text.splitlines()[-20:]) if end.exit_code else "", text,
                     compare_tuner(text, requested, ranks, sizes, list(ranks)),
                     transports.summary_json(transports.parse(text).values()))


if __name__ == "__main__":  # pragma: no cover - used as `python -m commdiag.environment.envcheck` for a quick look
    print(check_env().summary())
    sys.exit(0 if check_env().ok else 1)
