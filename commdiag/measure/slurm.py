"""Launches across nodes on the cluster's own engine: one Slurm job step per launch.

Inside an allocation (``salloc``/``sbatch``: ``SLURM_JOB_ID`` is set) a launch of ``nnodes`` nodes
x ``nproc_per_node`` ranks is one ``srun`` over the allocation's nodes.  Slurm starts every rank
(``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``; the worker maps them to torch's RANK,
LOCAL_RANK, WORLD_SIZE), on every node, with the launch's environment: ``srun`` is started with
exactly that environment and ``--export=ALL``, so what reaches the tasks is what commdiag chose,
and a site's prolog that drops a variable on one node shows up in that node's ``env_seen``.
``MASTER_ADDR`` is the first host of the allocation's node list, ``MASTER_PORT`` a fresh port per
launch (drawn, not probed: the port is bound on another node; a clash fails that one launch).

The deadline is commdiag's, not Slurm's: past it the ``srun`` gets SIGTERM (srun forwards it to
every task and ends the step), a grace, SIGKILL; then the step is cancelled if Slurm still lists
it, and a reaper step (``srun --overlap``, one task per node) kills on every node whatever still
carries the launch's marker in its environment (a detached grandchild of a rank, which
proctrack/linuxproc does not follow).  ``--kill-on-bad-exit=1``: one failed task ends the step,
as torchrun ends a launch when one rank fails.

Why not a launcher of commdiag's own: clusters already run Slurm; its steps are accounted, fenced
(cgroups, containers through pyxis) and cancelled by the site's tools.  docs/multinode.md.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from .. import procs
from ..childpython import module_argv
from ..errors import CommdiagError
from . import launcher

# Ports for MASTER_PORT: above the usual services, below Linux's ephemeral range (32768-60999), so
# that an outgoing connection of the node never holds the one a launch is about to bind.
PORT_RANGE = (20000, 32000)
REAP_DEADLINE_S = 30.0  # the reaper step: one short python per node
SCONTROL_DEADLINE_S = 10.0


def _ask(argv: list[str], deadline_s: float = SCONTROL_DEADLINE_S, env: dict | None = None):
    """A Slurm client command through the one supervisor (procs.run: its own session, a deadline, cwd
    /); returns (exit code or None, stdout text, stderr text)."""
    try:
        end = procs.run(argv, env=dict(os.environ if env is None else env), cwd="/", deadline_s=deadline_s)
    except OSError as e:
        return None, "", str(e)
    return end.exit_code, end.stdout.decode(errors="replace"), end.stderr.decode(errors="replace")


@dataclass(frozen=True)
class Allocation:
    """The Slurm allocation commdiag runs in: its job id and its nodes, in Slurm's order."""

    job_id: str
    nodes: tuple[str, ...]

    @property
    def master_addr(self) -> str:
        return self.nodes[0]

    def to_json(self) -> dict:
        return {"job_id": self.job_id, "nodes": list(self.nodes)}


def in_allocation(env: dict | None = None) -> bool:
    return bool((os.environ if env is None else env).get("SLURM_JOB_ID"))


def _tool(name: str) -> str:
    found = procs.which(name)  # as root never from a folder of PATH another user can change
    if not found:
        raise CommdiagError(f"launch: slurm needs Slurm's `{name}` on PATH (SLURM_JOB_ID is set, but "
                            f"`{name}` is not found)")
    return found


def allocation(env: dict | None = None, command: str = "commdiag sweep SPEC") -> Allocation:
    """This allocation's nodes (``scontrol show hostnames $SLURM_JOB_NODELIST``); one clear error
    outside an allocation, naming ``command`` as the line to run inside one."""
    env = dict(os.environ if env is None else env)
    job = env.get("SLURM_JOB_ID")
    if not job:
        raise CommdiagError(not_in_allocation_text(command=command))
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    if not nodelist:
        raise CommdiagError(f"SLURM_JOB_ID={job} is set but SLURM_JOB_NODELIST is not: "
                            "run commdiag inside salloc or an sbatch script")
    code, stdout, stderr = _ask([_tool("scontrol"), "show", "hostnames", nodelist], env=env)
    if code is None and not stderr:
        raise CommdiagError(f"scontrol show hostnames {nodelist} did not answer within "
                            f"{SCONTROL_DEADLINE_S:g} s (is slurmctld reachable?)")
    nodes = tuple(line.strip() for line in stdout.splitlines() if line.strip())
    if code != 0 or not nodes:
        raise CommdiagError(f"scontrol show hostnames {nodelist} failed: {stderr.strip()[:200]}")
    return Allocation(job, nodes)


def not_in_allocation_text(nnodes: int | None = None, command: str = "commdiag sweep SPEC") -> str:
    what = f"nnodes: {nnodes}" if nnodes else f"`{command}`"
    text = (f"{what} needs the nodes of a cluster allocation, and SLURM_JOB_ID is not set. Run it "
            f"inside Slurm: `salloc -N {nnodes or 2} {command}` (or the same line in an sbatch script)")
    if command.startswith("commdiag sweep") or command.startswith("commdiag step"):
        text += ("; each launch then runs as one srun job step over the allocation's nodes. Without Slurm, "
                 "set `launch: torchrun` with `hosts: [node1, node2]` and `node_command: [ssh, \"{host}\"]` "
                 "(commdiag starts one torchrun agent per host through that command), or with `rdzv_endpoint` "
                 "and start the same `commdiag sweep` on every node yourself")
    return text + " (docs/multinode.md)"


def check_fits(alloc: Allocation, nnodes: int, where: str = "nnodes") -> None:
    if nnodes > len(alloc.nodes):
        raise CommdiagError(f"{where}: {nnodes} nodes, but Slurm job {alloc.job_id} has {len(alloc.nodes)} "
                            f"({', '.join(alloc.nodes)}): run inside `salloc -N {nnodes}`")


def step_name(marker: str) -> str:
    return f"commdiag-{marker[:12]}"


def srun_argv(alloc: Allocation, nnodes: int, ntasks_per_node: int, command: list[str], marker: str) -> list[str]:
    """One job step over the first ``nnodes`` nodes of the allocation, ``ntasks_per_node`` each."""
    check_fits(alloc, nnodes)
    return [_tool("srun"), f"--job-name={step_name(marker)}", f"--nodes={nnodes}",
            f"--ntasks-per-node={ntasks_per_node}", f"--nodelist={','.join(alloc.nodes[:nnodes])}",
            # no --unbuffered: slurmstepd then forwards each task's output a whole line at a time; with it,
            # two tasks' lines interleave mid-line (check-env --nodes lost both nodes' answers that way)
            "--kill-on-bad-exit=1", "--export=ALL", "--mpi=none", *command]


def rank_env(alloc: Allocation, nnodes: int, nproc: int) -> dict[str, str]:
    """What every rank needs beyond Slurm's own variables: the rendezvous address and a fresh port."""
    return {"MASTER_ADDR": alloc.master_addr,
            "MASTER_PORT": str(random.SystemRandom().randrange(*PORT_RANGE)),
            "COMMDIAG_SLURM_NNODES": str(nnodes), "COMMDIAG_SLURM_NPROC": str(nproc)}


def torch_rank_env(env: dict | None = None) -> dict[str, str]:
    """torch.distributed's rank variables from Slurm's, for a task that srun started (the worker and
    check-env's workers call this first).  Empty when torchrun (RANK set) or nothing started it."""
    env = os.environ if env is None else env
    if "RANK" in env or "SLURM_PROCID" not in env:
        return {}
    local_world = env.get("COMMDIAG_SLURM_NPROC") or env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]
    return {"RANK": env["SLURM_PROCID"], "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
            "WORLD_SIZE": env.get("SLURM_NTASKS", "1"), "LOCAL_WORLD_SIZE": local_world,
            "GROUP_RANK": env.get("SLURM_NODEID", "0")}


def adopt_slurm_ranks() -> None:
    os.environ.update(torch_rank_env())


def launch_worker(folder: Path, plan: dict, *, alloc: Allocation, base_env: dict[str, str],
                  config_env: dict[str, str], extra_env: dict[str, str], nproc: int, nnodes: int,
                  deadline_s: float, marker: str) -> launcher.LaunchOutcome:
    """Write ``plan.json`` and run the worker as one srun job step; nothing survives on any node."""
    from ..atomic import write_json

    write_json(folder / "plan.json", plan)
    env = launcher.launch_env(base_env, config_env,
                              {**extra_env, **rank_env(alloc, nnodes, nproc), launcher.MARKER: marker})
    command = module_argv("commdiag.measure.worker", ["--plan", str(folder / "plan.json")])
    return run_step(alloc, nnodes, nproc, command, env, folder / "srun.log", deadline_s)


def run_step(alloc: Allocation, nnodes: int, ntasks_per_node: int, command: list[str], env: dict[str, str],
             log_path: Path, deadline_s: float) -> launcher.LaunchOutcome:
    """``command`` on every task of one step, under the deadline; then the step is gone on every node."""
    marker = env[launcher.MARKER]
    argv = srun_argv(alloc, nnodes, ntasks_per_node, command, marker)
    try:
        outcome = launcher.run(argv, env, log_path, deadline_s)
    finally:  # every exit path: a normal end leaves nothing, a deadline or Ctrl-C may
        cancel_step(alloc, marker)
        survivors = reap(alloc, nnodes, marker, env)
    if survivors:
        outcome = launcher.LaunchOutcome(outcome.exit_code, outcome.timed_out, outcome.wall_s,
                                         outcome.killed_survivors + survivors, outcome.interrupted)
    return outcome


def alive(alloc: Allocation) -> bool:
    """Whether the allocation still runs (a time limit or scancel ends it mid-run: every later srun
    would fail at once).  True when Slurm cannot be asked: a failed launch is then judged as such."""
    squeue = procs.which("squeue")
    if not squeue:
        return True
    code, stdout, _ = _ask([squeue, "-h", "-j", alloc.job_id, "-o", "%T"])
    if code is None:
        return True
    return code == 0 and stdout.strip() in ("RUNNING", "CONFIGURING")


def cancel_step(alloc: Allocation, marker: str) -> None:
    """scancel the launch's step if Slurm still lists it (srun killed before the step ended)."""
    squeue, scancel = procs.which("squeue"), procs.which("scancel")
    if not (squeue and scancel):
        return
    _, stdout, _ = _ask([squeue, "--steps", "-h", "-o", "%i %j", "-j", alloc.job_id])
    steps = [line.split()[0] for line in stdout.splitlines()
             if len(line.split()) == 2 and line.split()[1] == step_name(marker)]
    for step in steps:
        _ask([scancel, "--signal=KILL", "--full", step])


def reap(alloc: Allocation, nnodes: int, marker: str, env: dict[str, str]) -> int:
    """One task per node kills what still carries ``marker``; returns how many it found in all.

    The reaper's own environment does not carry the marker (it is passed as an argument), so it never
    counts or kills itself or its slurmstepd."""
    reap_env = {k: v for k, v in env.items() if k != launcher.MARKER}
    # the same reaper as across hosts (measure/hosts.py --reap: kill by marker, wait for the kills)
    argv = srun_argv(alloc, nnodes, 1, module_argv("commdiag.measure.hosts", ["--reap", marker]),
                     "reap" + marker)
    argv.insert(1, "--overlap")
    _, stdout, _ = _ask(argv, REAP_DEADLINE_S, reap_env)
    return sum(int(w.split("=", 1)[1]) for w in stdout.split() if w.startswith("reaped=")
               and w.split("=", 1)[1].isdigit())


