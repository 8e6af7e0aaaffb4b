"""One torchrun launch under a deadline: argv and environment; procs.py starts and reaps it.

Every launch is a fresh ``python -P -m torch.distributed.run`` (childpython.module_argv: the
folder the sweep was started from is on no path, the workers' either) in its own session and in
its launch folder, with an explicit environment: the user's, then the config's variables, then
commdiag's own (a unique ``COMMDIAG_LAUNCH_ID`` marker, and NCCL's debug settings unless the
user set NCCL_DEBUG).  The deadline covers start, measurement and teardown (a teardown hang after
CUDA-graph capture has been seen on real GPUs).  Past it procs.run gives the whole process group
SIGTERM, a grace period, then SIGKILL; finally every process still carrying the launch's marker
in its environment is killed, which also catches workers that left the group.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path

from .. import PACKAGE_PARENT, procs
from ..childpython import module_argv
# The marker and the ladder live in procs; the launch paths (sweep, ab, slurm) take the marker names
# from here, beside the launch environment they go into.
from ..procs import KILL_GRACE_S, MARKER, carries_marker, kill_marked, marked_pids, new_marker  # noqa: F401


@dataclass
class Progress:
    """What the CLI's progress line shows after each launch (a sweep's and an ab run's)."""

    done: int
    total: int
    launch: dict
    eta_s: float | None


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


def run(argv: list[str], env: dict[str, str], log_path: Path, deadline_s: float) -> LaunchOutcome:
    """Run ``argv`` to completion or to its deadline (procs.run: SIGTERM, grace, SIGKILL, then every
    process carrying the marker); no process of it survives.  Ctrl-C is an ``interrupted`` outcome.
    It starts in the launch's folder (the log's)."""
    # No parent-death signal: after a kill -9 of commdiag the launch is left to --resume, which finds
    # it by the marker the caller recorded in run.json (runlock.reap_orphans).
    end = procs.run(argv, env=env, cwd=log_path.parent, marker=env[MARKER], deadline_s=deadline_s,
                    stdout=log_path, stderr=procs.STDOUT, report_interrupt=True, parent_death=None)
    return LaunchOutcome(end.exit_code, end.timed_out, end.wall_s, end.killed_survivors, end.interrupted)


def launch_worker(folder: Path, plan: dict, *, base_env: dict[str, str], config_env: dict[str, str],
                  extra_env: dict[str, str], nproc: int, nnodes: int, rdzv_endpoint: str | None, rdzv_id: str,
                  deadline_s: float, marker: str | None = None) -> tuple[LaunchOutcome, str]:
    """Write ``plan.json`` into ``folder`` and run the worker under torchrun; returns (outcome, marker).

    ``marker``: the launch's COMMDIAG_LAUNCH_ID, when the caller recorded it in run.json before
    launching (so that a resume after kill -9 can find the launch's orphans: runlock.reap_orphans);
    default a fresh one."""
    from ..atomic import write_json

    folder = Path(os.path.abspath(folder))  # the launch starts in it: every path it is given is absolute
    write_json(folder / "plan.json", plan)
    marker = marker or new_marker()
    env = launch_env(base_env, config_env, {**extra_env, MARKER: marker})
    argv = torchrun_argv(nproc, nnodes, rdzv_endpoint, rdzv_id, deadline_s, folder / "plan.json")
    return run(argv, env, folder / "torchrun.log", deadline_s), marker
