"""One round of ``commdiag nodes``: one rank per node, every node pair's all-reduce in turn.

Started by srun (one task per node of the allocation: measure/slurm.py).  All ranks join one
process group; for each pair of the round's order (shuffled per round by the parent), every rank
creates that pair's group (torch requires every rank to call new_group, in the same order), the
pair's two ranks run ``warmup`` then ``iters`` timed all-reduces of ``bytes`` between themselves
while the others wait, then everyone meets at a barrier.  One pair is measured at a time, so a
pair's time is its own link's (and its two nodes'), not shared with another pair's traffic.

Times: the wall time of each blocking call (gloo: monotonic clock; nccl: the call then a device
synchronise, on GPU 0 of the node: LOCAL_RANK's).  Rank 0 writes ``result.json``:
{"format": "commdiag-nodes-round", "version": 1, "hosts": [host per rank],
 "pairs": [{"ranks": [a, b], "samples_us": [...]}]} in the round's order.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

ROUND_FORMAT, ROUND_VERSION = "commdiag-nodes-round", 1


def main(argv: list[str]) -> int:
    from .slurm import adopt_slurm_ranks
    from ..atomic import write_json

    plan = json.loads(Path(argv[argv.index("--plan") + 1]).read_text())
    adopt_slurm_ranks()
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = plan["backend"]
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    control = dist.new_group(backend="gloo") if backend == "nccl" else None
    elements = max(1, plan["bytes"] // 4)
    measured = []
    for a, b in plan["pairs"]:
        group = dist.new_group([a, b])
        samples = []
        if rank in (a, b):
            buf = torch.ones(elements, dtype=torch.float32, device=device)
            for n in range(plan["warmup"] + plan["iters"]):
                t0 = time.perf_counter()
                dist.all_reduce(buf, group=group)
                if backend == "nccl":
                    torch.cuda.synchronize()
                if n >= plan["warmup"]:
                    samples.append((time.perf_counter() - t0) * 1e6)
                buf.fill_(1.0)
        measured.append(samples)
        dist.barrier(group=control)
        dist.destroy_process_group(group)
    everyone: list = [None] * world
    dist.all_gather_object(everyone, {"rank": rank, "host": socket.gethostname(), "samples": measured},
                           group=control)
    if rank == 0:
        by_rank = sorted(everyone, key=lambda r: r["rank"])
        pairs = []
        for n, (a, b) in enumerate(plan["pairs"]):
            # the pair's time: the max over its two ranks per call (the call ends when both have it)
            pairs.append({"ranks": [a, b], "samples_us": [round(max(x, y), 3) for x, y in
                                                          zip(by_rank[a]["samples"][n], by_rank[b]["samples"][n])]})
        write_json(Path(plan["out_dir"]) / "result.json",
                   {"format": ROUND_FORMAT, "version": ROUND_VERSION,
                    "hosts": [r["host"] for r in by_rank], "pairs": pairs})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
