"""Propagation: which variables arrive in children started the ways frameworks start workers.

``check_propagation`` starts children every way inference servers and trainers do
(multiprocessing fork/spawn/forkserver, subprocess with env=None and with
env=os.environ.copy(), a torchrun worker and a spawn grandchild of it) and reports
what arrived in each, including sentinels commdiag sets itself: one before the
mechanism started, one after (the late-change case: a forkserver keeps the
environment of the moment it started), and one set with os.putenv only (in
getenv, not in os.environ).  multiprocessing and procs are imported
only here, so ``check-env`` without ``--propagation`` stays light.

Every child starts in a private temporary folder (and the spawn and forkserver children while
this process works in it): a child Python puts its working folder first on its path, and the
folder commdiag was started from may hold a json.py of someone else's (childpython.py).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import PACKAGE_PARENT
from ..childpython import isolated_argv, module_argv
from .envcheck import describe_expectation, resolve_expectation
from ..metadata import libc_getenv

EARLY_VAR = "COMMDIAG_PROPAGATION_EARLY"  # set by commdiag before each mechanism starts
LATE_VAR = "COMMDIAG_PROPAGATION_LATE"  # set by commdiag after each mechanism started
PUTENV_VAR = "COMMDIAG_PROPAGATION_PUTENV"  # set with os.putenv only: in getenv, not in os.environ
CHILD_TIMEOUT_S = 60.0  # a Python child that only reads its environment answers in ~1 s even on 2 busy cores
TORCHRUN_TIMEOUT_S = 180.0  # torchrun imports torch in the agent and in no worker; ~5 s here, generous for busy CI


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


_CHILD_CMD = ("import sys, json; sys.path.insert(0, {parent!r}); from commdiag.environment.propagation import _observe; "
              "print(json.dumps(_observe(sys.argv[1:])))")


def _subprocess_path(copy_env: bool, names, tmp: Path, late_value: str) -> dict:
    from .. import procs

    env = os.environ.copy() if copy_env else None  # the framework copies its environment at start-up
    os.environ[LATE_VAR] = late_value
    # -I: the child imports this commdiag (PACKAGE_PARENT) and the standard library, nothing else.
    # env=None: procs starts it with this process's own environment, putenv included (as subprocess does).
    end = procs.run(isolated_argv(_CHILD_CMD.format(parent=PACKAGE_PARENT), names), env=env, cwd=tmp,
                    deadline_s=CHILD_TIMEOUT_S)
    if end.timed_out:
        raise TimeoutError(f"child did not answer within {CHILD_TIMEOUT_S:.0f}s")
    if end.exit_code != 0:
        raise RuntimeError(f"child exited with {end.exit_code}: {end.stderr.decode(errors='replace').strip()[-300:]}")
    return json.loads(end.stdout.decode().strip().splitlines()[-1])


_TORCHRUN_SCRIPT = """import sys
sys.path.insert(0, {parent!r})
from commdiag.environment.propagation import _torchrun_worker
if __name__ == "__main__":
    _torchrun_worker(sys.argv[1], sys.argv[2:])
"""


def _torchrun_paths(names, tmp: Path, late_value: str) -> tuple[dict, dict]:
    from .. import procs

    script = tmp / "torchrun_worker.py"
    script.write_text(_TORCHRUN_SCRIPT.format(parent=PACKAGE_PARENT))
    argv = module_argv("torch.distributed.run", ["--standalone", "--nnodes=1", "--nproc-per-node=1",
                                                 "--max-restarts=0", str(script), str(tmp), *names])
    # env=None: torchrun inherits this process's environment as a shell-started torchrun would.  Its
    # worker runs in a session of its own: past the deadline procs ends it by the marker.
    group = procs.start(argv, env=None, cwd=tmp, stdout=procs.PIPE, stderr=procs.STDOUT)
    os.environ[LATE_VAR] = late_value  # after the agent started: it cannot reach the agent or its workers
    end = procs.finish(group, deadline_s=TORCHRUN_TIMEOUT_S)
    if end.timed_out:
        raise TimeoutError(f"torchrun did not finish within {TORCHRUN_TIMEOUT_S:.0f}s")
    if end.exit_code != 0:
        tail = end.stdout.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"torchrun exited with {end.exit_code}: {' | '.join(tail)}")
    return (json.loads((tmp / "torchrun-rank0.json").read_text()),
            json.loads((tmp / "grandchild-rank0.json").read_text()))


@contextlib.contextmanager
def _working_folder(path: str):
    """Work in ``path`` meanwhile: multiprocessing's spawn and forkserver children start with
    ``python -c`` in this process's working folder, which their path then begins with."""
    here = os.open(".", getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.chdir(path)
        yield
    finally:
        try:
            os.fchdir(here)
        finally:
            os.close(here)


@contextlib.contextmanager
def _scratch_tempdir():
    """Meanwhile ``tempfile``'s folder is procs.scratch_root(): multiprocessing's forkserver keeps its
    socket in a ``pymp-*`` folder made there, which as root must not be a TMPDIR of another user's."""
    import tempfile

    from .. import procs

    saved, tempfile.tempdir = tempfile.tempdir, procs.scratch_root()
    try:
        yield
    finally:
        tempfile.tempdir = saved


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

    from .. import procs

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

    with procs.private_folder("commdiag-prop-") as tmp, _working_folder(tmp), _scratch_tempdir():
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
        add("subprocess env=None", "late var set before Popen",
            lambda late: _subprocess_path(False, names, tmp, late))
        add("subprocess env=os.environ.copy()", "late var set after the copy was taken",
            lambda late: _subprocess_path(True, names, tmp, late))
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
                 LATE_VAR: "set in os.environ after each mechanism started (value: the path)",
                 PUTENV_VAR: "set with os.putenv only (getenv has it, os.environ does not)"}
    return Propagation(expected, source, sentinels, results)


def _lost_sentinels(p: PathResult) -> list[str]:
    """Sentinels a child path did not receive (in getenv, which is what NCCL reads)."""
    short = {EARLY_VAR: "EARLY", LATE_VAR: "LATE", PUTENV_VAR: "PUTENV"}
    return [short[n] for n in short if p.vars and (p.vars.get(n) or {}).get("getenv") is None]


def unset_in_parent(r: Propagation) -> list[str]:
    """Expected variables this process (the launching shell's child) does not have: no child can get them."""
    here = next((p for p in r.paths if p.path == "this process"), None)
    if here is None:
        return []
    return [n for n in r.expected if (here.vars.get(n) or {}).get("getenv") is None
            and (here.vars.get(n) or {}).get("environ") is None]


def render(r: Propagation) -> str:
    """Text for ``check-env --propagation``: a warning for what the shell lacks, every path, a summary."""
    import textwrap

    lines = []
    unset = unset_in_parent(r)
    if unset:
        export = " ".join(f"{n}={r.expected[n]}" for n in unset)
        lines += textwrap.wrap(f"warning: {', '.join(unset)} not set in the shell that ran this command: commdiag "
                               "does not set expected variables itself, so no child can receive them and every "
                               "path fails for them. Export them first:", 100, subsequent_indent="  ")
        lines.append(f"  {export} commdiag check-env --propagation ...")
    names = list(r.expected) + list(r.sentinels)
    lines.append(describe_expectation(r.source) + (": " + " ".join(f"{k}={v}" for k, v in r.expected.items())
                                                   if r.expected else ""))
    lines.append("sentinels (set by commdiag itself):")
    for n, what in r.sentinels.items():
        lines.append(f"  {n}: {what}")
    for p in r.paths:
        lines.append(f"{'ok  ' if p.ok else 'FAIL'} {p.path}" + (f"  [{p.how}]" if p.how and p.how != "-" else ""))
        if p.error:
            lines.append(f"      error: {p.error}")
        for n in names:
            v = p.vars.get(n)
            if v is not None:
                lines.append(f"      {n:32} environ={v['environ']!s:24} getenv={v['getenv']!s}")
    width = max(len(p.path) for p in r.paths) if r.paths else 0
    lines.append("")
    lines.append("summary per path (expected variables in os.environ and getenv; sentinels the child lost):")
    for p in r.paths:
        missing = [n for n, v in r.expected.items() if not _arrived(p.vars, {n: v})]
        what = []
        if p.error:
            what.append("did not run")
        elif r.expected:
            what.append("missing " + ", ".join(missing) if missing else "every expected variable arrived")
        lost = [] if p.path == "this process" or p.error else _lost_sentinels(p)
        if lost:
            what.append("lost " + ", ".join(lost))
        lines.append(f"  {'ok  ' if p.ok else 'FAIL'} {p.path:<{width}}  {'; '.join(what) or 'nothing expected'}")
    ok = sum(p.ok for p in r.paths)
    if r.expected:
        tail = f"{ok} of {len(r.paths)} paths carried every expected variable"
        if unset:
            tail += f" ({', '.join(unset)} not set in this shell: see the warning)"
    else:
        tail = ("nothing expected: only the sentinels were followed; give --expect NAME=VALUE or --profile FILE\n"
                "(exported in this shell) to check your own settings")
    lines.append(tail)
    return "\n".join(lines)
