"""Did the settings reach every node? ``check-env`` across a Slurm allocation.

The classic multi-node failure: a variable exported on the submit (login) node arrives on the
first node and not on the others (an ``--export=NONE`` in a script, a site's task prolog, a
container that starts with a clean environment, a dotfile read only on one host).  This starts
one task per node of the allocation (one ``srun`` step, measure/slurm.py: deadline, marker sweep
on every node), each runs ``check_env`` against the same expectation in the process Slurm
started, and the answer is per node.

The expectation: ``--expect``/``--profile`` when given; otherwise every NCCL_* variable of the
process that runs this check (what the user exported where they typed the command) plus the
installed hook's settings: "what I have here, did it arrive there?".

Each task prints one line ``commdiag-node-check <json>`` (its host name and check_env's result);
nothing else is parsed.  Imports no torch (the tasks run in seconds).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import CommdiagError
from . import envcheck

LINE_TAG = "commdiag-node-check "
DEADLINE_S = 60.0


@dataclass(frozen=True)
class NodeResult:
    """One node's answer (``check`` None: its task printed nothing: it did not run, or crashed)."""

    node: str
    check: dict | None

    @property
    def ok(self) -> bool:
        return self.check is not None and bool(self.check.get("ok"))

    def failures(self) -> list[dict]:
        if self.check is None:
            return []
        return [v for v in self.check["vars"] if v["status"] in envcheck.FAILING]


@dataclass(frozen=True)
class NodesCheck:
    job_id: str
    expected: dict
    source: str
    nodes: list[NodeResult]
    exit_code: int | None
    timed_out: bool
    log_tail: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.nodes) and all(n.ok for n in self.nodes)

    def to_json(self) -> dict:
        return {"ok": self.ok, "job_id": self.job_id, "expected": self.expected, "source": self.source,
                "exit_code": self.exit_code, "timed_out": self.timed_out,
                "nodes": [{"node": n.node, "ok": n.ok, "check": n.check} for n in self.nodes]}


def expectation(expect: dict | None, profile, env: dict | None = None) -> tuple[dict, str]:
    """--expect/--profile; else this process's NCCL_* variables and the installed hook's."""
    if expect or profile is not None:
        return envcheck.resolve_expectation(expect, profile)
    env = os.environ if env is None else env
    here = {k: v for k, v in env.items() if k.startswith("NCCL_")}
    installed, source = envcheck.resolve_expectation(None, None)
    merged = {**installed, **here}
    parts = ([source] if installed else []) + (["the NCCL_* variables of this shell"] if here else [])
    return merged, " + ".join(parts) or "none"


def check_nodes(expect: dict | None = None, *, profile=None, env: dict | None = None,
                deadline_s: float = DEADLINE_S) -> NodesCheck:
    """One task per node of this allocation checks its environment; never prints."""
    from ..measure import launcher, slurm

    env = dict(os.environ if env is None else env)
    alloc = slurm.allocation(env, command="commdiag check-env --nodes")
    expected, source = expectation(expect, profile, env)
    marker = launcher.new_marker()
    task_env = {**launcher.launch_env(env, {}, {}), launcher.MARKER: marker}
    from ..childpython import module_argv

    command = module_argv("commdiag.environment.nodecheck",
                          ["--task", json.dumps(expected, sort_keys=True)])
    from .. import procs

    # (as root under sudo -E, never in a $TMPDIR another user can change: procs.scratch_root)
    with procs.private_folder("commdiag-nodes-") as tmp:
        log = Path(tmp, "srun.log")
        outcome = slurm.run_step(alloc, len(alloc.nodes), 1, command, task_env, log, deadline_s)
        text = log.read_text(errors="replace") if log.exists() else ""
    seen: dict[str, dict] = {}
    for line in text.splitlines():
        if line.startswith(LINE_TAG):
            try:
                record = json.loads(line[len(LINE_TAG):])
            except ValueError:
                continue
            seen[str(record.get("node"))] = record.get("check")
    nodes = [NodeResult(n, seen.get(n)) for n in alloc.nodes]
    tail = "\n".join(l for l in text.splitlines() if not l.startswith(LINE_TAG))[-2000:]
    return NodesCheck(alloc.job_id, expected, source, nodes, outcome.exit_code, outcome.timed_out, tail)


def render(r: NodesCheck) -> list[str]:
    lines = [f"check-env on every node of Slurm job {r.job_id} ({len(r.nodes)} nodes), "
             f"{envcheck.describe_expectation(r.source)}:"]
    for name, value in sorted(r.expected.items()):
        lines.append(f"  expected {name}={value}")
    for n in r.nodes:
        if n.check is None:
            lines.append(f" {n.node}: NO ANSWER (its task did not run or printed nothing)")
            continue
        failures = n.failures()
        lines.append(f" {n.node}: {'ok' if n.ok else 'FAIL'}")
        for v in failures:
            lines.append(f"  {v['status'].upper():9} {v['name']}: {v['detail']}")
    if r.timed_out:
        lines.append(f" the check did not finish within its deadline ({DEADLINE_S:g} s)")
    if any(n.check is None for n in r.nodes) and r.log_tail.strip():
        lines.append(f" srun said (exit {r.exit_code}):")
        lines += ["   " + l for l in r.log_tail.strip().splitlines()[-8:]]
    missing = [n.node for n in r.nodes if not n.ok]
    if missing and r.expected:
        lines.append(f"not every node has the settings ({', '.join(missing)}): a variable exported where you "
                     "typed the command reaches a node only if srun exports it (no --export=NONE) and nothing "
                     "on that node (a task prolog, a container's entry point) drops it; set it in the job "
                     "script, or install it on every node (commdiag install-hook)")
    elif r.ok:
        lines.append("every node has the expected settings")
    return lines


def _task(expected_json: str) -> int:
    """On one node: check_env against the expectation; one tagged line on stdout."""
    from .. import errors

    try:
        result = envcheck.check_env(json.loads(expected_json), use_installed=False).to_json()
    except errors.CommdiagError as e:
        result = {"ok": False, "vars": [], "error": str(e)}
    print(LINE_TAG + json.dumps({"node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
                                 "check": result}), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--task":
        raise SystemExit(_task(sys.argv[2]))
    raise SystemExit(f"usage: python -m commdiag.environment.nodecheck --task EXPECTED_JSON "
                     f"({CommdiagError.__name__}s are reported per node)")
