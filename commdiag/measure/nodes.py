"""``commdiag nodes``: which node or link of a Slurm allocation is slow, certified at 1% family-wise.

Each round is one fresh launch: one srun step, one rank per node (measure/slurm.py: the deadline,
the marker sweep on every node), in which every node pair in turn times the same all-reduce
between its two nodes (measure/nodeworker.py), in an order shuffled per round.  After the rounds,
analyse/nodeverdict.py compares each node's pairs with the others' within every round (an exact
randomization test, so drift, tails and a slow first pair cannot make a false alarm) and names the
nodes and links that are slower than the rest by more than ``min_effect``, at 1% for the whole
fleet.  Why not a fixed floor (nccl-tests' NCCL_TESTS_MIN_BW, a health check's GB/s): a floor that
is right for one fabric is a false alarm on a busy one; the fleet is its own reference.

Writes RUN_DIR/nodes.json (format ``commdiag-nodes``, version 1: docs/multinode.md) after every
round, so Ctrl-C or a failed round loses nothing measured, and RUN_DIR/launches/NNNN/ per round.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..analyse import nodeverdict
from ..errors import CommdiagError
from . import launcher, slurm

NODES_FORMAT, NODES_VERSION = "commdiag-nodes", 1
DEFAULT_BYTES = 4 << 20
TRIM = 0.05


@dataclass(frozen=True)
class NodesResult:
    run_dir: Path
    record: dict
    findings: list[nodeverdict.Finding]

    @property
    def slow(self) -> list[nodeverdict.Finding]:
        return [f for f in self.findings if f.slow]


def _value(samples: list[float]) -> float:
    """A pair's launch value: the 5%-trimmed mean of ln(time) of its calls (as a sweep's launch)."""
    logs = sorted(math.log(s) for s in samples if s > 0)
    cut = int(len(logs) * TRIM)
    kept = logs[cut:len(logs) - cut] or logs
    return sum(kept) / len(kept)


def run_nodes(*, run_dir: Path, backend: str = "gloo", nbytes: int = DEFAULT_BYTES, warmup: int = 3,
              iters: int = 20, rounds: int | None = None, deadline_s: float = 300.0,
              env: dict | None = None, min_effect: float = nodeverdict.MIN_EFFECT,
              on_round: Callable[[int, int, dict], None] | None = None) -> NodesResult:
    env = dict(os.environ if env is None else env)
    alloc = slurm.allocation(env, command="commdiag nodes")
    n = len(alloc.nodes)
    if n < 2:
        raise CommdiagError(f"commdiag nodes: Slurm job {alloc.job_id} has one node ({alloc.nodes[0]}); "
                            "it compares nodes: run it inside `salloc -N 3` or more")
    if backend not in ("gloo", "nccl"):
        raise CommdiagError(f"--backend: {backend!r} is not one of gloo, nccl")
    pairs = nodeverdict.pairs_of(n)
    planned = rounds or nodeverdict.rounds_needed(n, pairs)
    if (run_dir / "nodes.json").exists():
        raise CommdiagError(f"{run_dir}: already holds a nodes run; choose another --out")
    from ..atomic import make_dirs
    from .runlock import check_folder

    check_folder(run_dir)  # as root: before anything is made, no folder behind another user's link
    make_dirs(run_dir)  # the one writer: never through a link
    seed = random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    record = {"format": NODES_FORMAT, "version": NODES_VERSION,
              "created_utc": launcher.utc_now(), "slurm": alloc.to_json(), "backend": backend,
              "bytes": nbytes, "warmup": warmup, "iters": iters, "seed": seed, "min_effect": min_effect,
              "alpha": nodeverdict.ALPHA, "pairs": [list(p) for p in pairs], "rounds_planned": planned,
              "rounds": [], "findings": None, "state": "running"}
    save = lambda: _save(run_dir, record)  # noqa: E731
    save()
    try:
        for r in range(planned):
            order = list(range(len(pairs)))
            rng.shuffle(order)
            record["rounds"].append(_one_round(run_dir, r, alloc, [pairs[i] for i in order], order, backend,
                                               nbytes, warmup, iters, deadline_s, env))
            save()
            if on_round:
                on_round(r + 1, planned, record["rounds"][-1])
    except KeyboardInterrupt:
        record["state"] = "interrupted"
        save()
        raise
    findings = judge(record)
    record["findings"] = [f.to_json() for f in findings]
    record["state"] = "finished"
    record["finished_utc"] = launcher.utc_now()
    save()
    return NodesResult(run_dir, record, findings)


def _one_round(run_dir, r, alloc, ordered_pairs, order, backend, nbytes, warmup, iters, deadline_s, env) -> dict:
    from ..atomic import make_dirs, write_json
    from ..childpython import module_argv

    folder = run_dir / "launches" / f"{r:04d}"
    make_dirs(folder)
    plan = {"backend": backend, "bytes": nbytes, "warmup": warmup, "iters": iters,
            "pairs": [list(p) for p in ordered_pairs], "out_dir": str(folder.resolve())}
    write_json(folder / "plan.json", plan)
    marker = launcher.new_marker()
    step_env = launcher.launch_env(env, {}, {**slurm.rank_env(alloc, len(alloc.nodes), 1), launcher.MARKER: marker})
    command = module_argv("commdiag.measure.nodeworker", ["--plan", str(folder / "plan.json")])
    outcome = slurm.run_step(alloc, len(alloc.nodes), 1, command, step_env, folder / "srun.log", deadline_s)
    entry = {"round": r, "order": order, "marker": marker, "exit_code": outcome.exit_code,
             "timed_out": outcome.timed_out, "wall_s": round(outcome.wall_s, 3), "values": None}
    result_path = folder / "result.json"
    if outcome.exit_code == 0 and result_path.exists():
        import json

        result = json.loads(result_path.read_text())
        values = [None] * len(order)
        for position, pair in zip(order, result["pairs"]):
            values[position] = _value(pair["samples_us"])  # back in the fixed pair order
        entry.update(values=values, hosts=result["hosts"])
    return entry


def judge(record: dict) -> list[nodeverdict.Finding]:
    """The verdicts of a nodes.json record (pure: report and tests call it on stored records)."""
    complete = [r["values"] for r in record["rounds"] if r.get("values") and None not in r["values"]]
    if not complete:
        return []
    pairs = [tuple(p) for p in record["pairs"]]
    names = record["slurm"]["nodes"]
    return nodeverdict.judge(complete, len(names), pairs, names, min_effect=record["min_effect"],
                             seed=record["seed"])


def _save(run_dir: Path, record: dict) -> None:
    from ..atomic import write_json

    write_json(run_dir / "nodes.json", record)


def default_run_dir(root: Path = Path("reports")) -> Path:
    return root / f"nodes-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def render(result: NodesResult) -> list[str]:
    rec = result.record
    names = rec["slurm"]["nodes"]
    done = [r for r in rec["rounds"] if r.get("values")]
    lines = [f"commdiag nodes: {len(names)} nodes of Slurm job {rec['slurm']['job_id']}, {rec['backend']} "
             f"all-reduce of {rec['bytes']} B, {len(rec['pairs'])} pair(s), {len(done)} of "
             f"{len(rec['rounds'])} rounds complete (one launch each)"]
    for i, (a, b) in enumerate(rec["pairs"]):
        vals = sorted(math.exp(r["values"][i]) for r in done)
        if vals:
            lines.append(f"  {names[a]}-{names[b]}: median {vals[len(vals) // 2]:.1f} us "
                         f"[{vals[0]:.1f}-{vals[-1]:.1f}] over {len(vals)} launches")
    if len(names) < 3:
        lines.append("two nodes: one link, nothing to compare it with; no node can be named (use 3 or more)")
    slow = result.slow
    for f in slow:
        lines.append(f"SLOW {f.kind} {f.name}: {f.ratio:.2f}x the rest's time (certified: p = {f.p:.2g} "
                     f"<= {f.threshold:.2g}, more than {rec['min_effect']:.0%} slower)")
    if result.findings and not slow:
        lines.append(f"no node or link is certified slower than the rest by more than {rec['min_effect']:.0%} "
                     f"(1% family-wise over {len(result.findings)} claims)")
    failed = [r for r in rec["rounds"] if not r.get("values")]
    if failed:
        lines.append(f"{len(failed)} round(s) failed or timed out and are not counted (launches/ has their logs)")
    return lines
