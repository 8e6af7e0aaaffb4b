"""#31 on one GPU, one rank: every timing path of the time budget on real CUDA (benchmarks/README.md).

    python3 benchmarks/gpu_budget_paths.py        # 1 GPU, about 1 min

Two ranks on one GPU talk over sockets (4.5 ms a call: every size skips the probe graph), so this runs
the worker's own timing functions in one process with a 1-rank NCCL group, where a 14 KB all-reduce
takes microseconds: graph mode's probe graph (one timed replay under a budget), the skipped probe (a call
of a tenth of the 500 us window or more), eager's fastest-of-two calibration, and fixed counts, at
pcie8's sizes 14 KB-117 MB.  Per size and mode: samples, batch and the median per call, with the 25 ms
budget and with fixed counts (warmup 20, iters 200), alternated three times, and each one's wall time.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from commdiag.measure import worker  # noqa: E402

TOKENS = [1, 16, 256, 1024, 4096, 8192]


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    path = worker.TorchPath(dist)
    rows: dict = {}
    for rep in range(3):
        for name, budget in (("fixed", None), ("budget", 25)):
            plan = {"iters": 200, "warmup": 20, "batch": "auto", "window_us": 500, "replay_stream": "side",
                    "modes": ["graph", "eager"], "time_per_size_ms": budget, "backend": "nccl"}
            for t in TOKENS:
                buf = torch.zeros(t * 7168, dtype=torch.bfloat16, device="cuda")
                for mode in ("graph", "eager"):
                    torch.cuda.synchronize()
                    t0 = time.monotonic()
                    if mode == "graph":
                        xs, batch = worker._time_graph(torch, path, buf, plan)
                    else:
                        xs, _, batch = worker._time_eager_cuda(torch, path.op(buf), plan)
                    wall = time.monotonic() - t0
                    rows.setdefault((t, mode, name), []).append((len(xs), batch, statistics.median(xs), wall))
                del buf
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, nccl {torch.cuda.nccl.version()}, 1 rank")
    print(f"{'tokens':>6} {'mode':6} {'method':7} {'samples':>8} {'batch':>6} {'median us per call (3 reps)':>34} {'wall s':>18}")
    for (t, mode, name), rs in sorted(rows.items()):
        print(f"{t:6d} {mode:6} {name:7} {rs[0][0]:8d} {rs[0][1]:6d} "
              f"{' '.join(f'{r[2]:10.2f}' for r in rs):>34} {' '.join(f'{r[3]:5.2f}' for r in rs):>18}")
    for t in TOKENS:
        for mode in ("graph", "eager"):
            f = [r[2] for r in rows[(t, mode, "fixed")]]
            b = [r[2] for r in rows[(t, mode, "budget")]]
            print(f"tokens {t:5d} {mode:6}: budget/fixed median per call {statistics.median(b) / statistics.median(f):.3f} "
                  f"(fixed's own spread {min(f) / statistics.median(f):.3f}-{max(f) / statistics.median(f):.3f})")
    tot = {n: sum(r[3] for (t, m, nn), rs in rows.items() if nn == n for r in rs) / 3 for n in ("fixed", "budget")}
    print(f"wall per pass: fixed {tot['fixed']:.2f} s, budget {tot['budget']:.2f} s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
