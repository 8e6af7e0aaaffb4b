"""One torchrun launch under a deadline: argv, environment, supervision, and cleanup.

Every launch is a fresh ``python -P -m torch.distributed.run`` (childpython.module_argv: the
folder the sweep was started from is on no path, the workers' either) in its own session, with
an explicit environment: the user's, then the config's variables, then commdiag's
own (a unique ``COMMDIAG_LAUNCH_ID`` marker, and NCCL's debug settings unless the
user set NCCL_DEBUG).  The deadline covers start, measurement and teardown (a
teardown hang after CUDA-graph capture has been seen on real GPUs).  Past it the
whole process group gets SIGTERM, a grace period, then SIGKILL; finally every
process still carrying the launch's marker in its environment is killed, which
also catches workers that left the group.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from .. import PACKAGE_PARENT
from ..childpython import module_argv

KILL_GRACE_S = 5.0  # torchrun forwards SIGTERM to its workers; give them this long to exit
MARKER = "COMMDIAG_LAUNCH_ID"


@dataclass
class Progress:
    """What the CLI's progress line shows after each launch (a sweep's and an ab run's)."""

    done: int
    total: int
    launch: dict
    eta_s: float | None


def take_back_sigint() -> None:
    """The default Ctrl-C handler in the main thread.  Started with SIGINT ignored (nohup, a
    background job of a script, some service managers), Ctrl-C and `kill -INT` would do nothing,
    and a sweep, an ab run or a hung p2p probe could not be interrupted and resumed."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def utc_now() -> str:
    """The time stamps of run.json (created, finished, a launch's start)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class LaunchOutcome:
    exit_code: int | None
    timed_out: bool
    wall_s: float
    killed_survivors: int
    interrupted: bool = False


def torchrun_argv(nproc: int, nnodes: int, rdzv_endpoint: str | None, rdzv_id: str,
                  join_timeout_s: float, plan_path: Path) -> list[str]:
    """torchrun, and its workers, started so that neither imports from the working folder.

    ``--no-python``: torchrun runs the worker command as given, with the -P (or 3.10 runner) of
    childpython.module_argv, instead of its own ``python -u -m``, which would put the folder the
    sweep was started from first on every worker's path."""
    args = [f"--nproc-per-node={nproc}", "--max-restarts=0"]
    if nnodes > 1:
        args += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                 f"--rdzv-id={rdzv_id}", f"--rdzv-conf=join_timeout={int(join_timeout_s)}"]
    else:
        args += ["--standalone", "--nnodes=1"]
    worker = module_argv("commdiag.measure.worker", ["--plan", str(plan_path)])
    return module_argv("torch.distributed.run", [*args, "--no-python", worker[0], "-u", *worker[1:]])


def launch_env(base: dict[str, str], config_env: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    env.update(config_env)
    env.update(extra)
    # The worker is started with -m commdiag.measure.worker: make sure it imports this very commdiag.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, base.get("PYTHONPATH", "")) if p)
    return env


def new_marker() -> str:
    return uuid.uuid4().hex


def run(argv: list[str], env: dict[str, str], log_path: Path, deadline_s: float) -> LaunchOutcome:
    """Run ``argv`` to completion or to its deadline; no process of it survives."""
    marker = env[MARKER]
    t0 = time.monotonic()
    # a new file, never through a link (a 0600 file of root's is not truncated by a planted link)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        timed_out = interrupted = False
        try:
            try:
                proc.wait(timeout=deadline_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _terminate_group(proc)
            except KeyboardInterrupt:
                interrupted = True
                _terminate_group(proc)
        except KeyboardInterrupt:  # a second Ctrl-C during the grace period: stop waiting, kill now
            interrupted = True
        finally:
            if proc.poll() is None:
                _kill_group(proc)
            killed = kill_marked(marker)  # whatever left the group, also on a second Ctrl-C
        wall = time.monotonic() - t0
    return LaunchOutcome(None if timed_out or interrupted else proc.returncode, timed_out, wall, killed,
                         interrupted)


def launch_worker(folder: Path, plan: dict, *, base_env: dict[str, str], config_env: dict[str, str],
                  extra_env: dict[str, str], nproc: int, nnodes: int, rdzv_endpoint: str | None, rdzv_id: str,
                  deadline_s: float, marker: str | None = None) -> tuple[LaunchOutcome, str]:
    """Write ``plan.json`` into ``folder`` and run the worker under torchrun; returns (outcome, marker).

    ``marker``: the launch's COMMDIAG_LAUNCH_ID, when the caller recorded it in run.json before
    launching (so that a resume after kill -9 can find the launch's orphans: runlock.reap_orphans);
    default a fresh one."""
    from ..atomic import write_json

    write_json(folder / "plan.json", plan)
    marker = marker or new_marker()
    env = launch_env(base_env, config_env, {**extra_env, MARKER: marker})
    argv = torchrun_argv(nproc, nnodes, rdzv_endpoint, rdzv_id, deadline_s, folder / "plan.json")
    return run(argv, env, folder / "torchrun.log", deadline_s), marker


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass


def _terminate_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def marked_pids(marker: str) -> list[int]:
    """Processes whose environment carries ``COMMDIAG_LAUNCH_ID=marker`` (Linux /proc)."""
    return [int(e.name) for e in os.scandir("/proc")
            if e.name.isdigit() and int(e.name) != os.getpid() and carries_marker(int(e.name), marker)]


def carries_marker(pid: int, marker: str) -> bool:
    """Whether process ``pid`` belongs to the launch ``marker`` (its environment says so); False
    for a process this user cannot read (another user's is never one of ours)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{MARKER}={marker}".encode() in f.read().split(b"\0")
    except (OSError, ValueError):
        return False


def kill_marked(marker: str) -> int:
    pids = marked_pids(marker)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)
