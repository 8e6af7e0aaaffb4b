"""Per-launch overhead of a commdiag sweep launch against a bare torchrun launch, measured in the same run.

A sweep starts one fresh torchrun per (config, trial), so what a launch costs
besides measuring decides how many configs fit in an hour.  Reference: torchrun
running a minimal script that only brings the process group up, does one barrier
and tears down.  Measured: a real commdiag launch (launcher.launch_worker, the
sweep's own code) with one tiny size, minus its measuring time (``measure_s``).

    python benchmarks/launch_overhead.py --backend gloo --nproc 2 --repeat 3     # CPU
    python benchmarks/launch_overhead.py --backend nccl --nproc 2 --repeat 3     # GPUs

Target: under 4 s per launch on 2 GPUs.

``--reuse N`` also measures ``reuse_process``: one commdiag process making N runs
(NCCL_PROTO set differently for each, a fresh communicator per run, as the sweep
does); its overhead per launch is (wall - total measuring) / N.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from commdiag.measure import launcher  # noqa: E402

BARE = """import os, torch, torch.distributed as dist
if os.environ["B"] == "nccl":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
else:
    dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""


def bare_launch(tmp: Path, backend: str, nproc: int) -> float:
    script = tmp / "bare.py"
    script.write_text(BARE)
    env = {**os.environ, "B": backend, launcher.MARKER: launcher.new_marker()}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc-per-node={nproc}", str(script)]
    out = launcher.run(argv, env, tmp / "bare.log", 300)
    if out.exit_code != 0:
        raise SystemExit(f"bare torchrun failed: {(tmp / 'bare.log').read_text()[-2000:]}")
    return out.wall_s


def commdiag_launch(tmp: Path, backend: str, nproc: int, n: int, reuse: int = 0) -> tuple[float, float]:
    """One commdiag process (``reuse`` > 0: making that many runs); returns (wall, overhead per launch)."""
    folder = tmp / f"launch{n}-{reuse}"
    folder.mkdir()
    plan = {"backend": backend, "dtype": "float32", "sizes": [4096], "modes": ["eager"], "warmup": 1, "iters": 1,
            "batch": 1, "window_us": 500, "vias": ["torch"], "replay_stream": "side", "watch_env": [],
            "out_dir": str(folder), "config": "default", "launch": n, "nccl_debug_file": None}
    outs = [folder]
    if reuse:
        outs = [folder / f"run{i}" for i in range(reuse)]
        for o in outs:
            o.mkdir()
        plan["runs"] = [{"config": f"c{i}", "launch": i, "out_dir": str(o), "watch_env": ["NCCL_PROTO"],
                         "set_env": {"NCCL_PROTO": ("LL", "Simple", "LL128")[i % 3]}} for i, o in enumerate(outs)]
    outcome, _ = launcher.launch_worker(folder, plan, base_env=dict(os.environ), config_env={}, extra_env={},
                                        nproc=nproc, nnodes=1, rdzv_endpoint=None, rdzv_id=f"bench-{n}-{reuse}",
                                        deadline_s=300)
    if outcome.exit_code != 0:
        raise SystemExit(f"commdiag launch failed: {(folder / 'torchrun.log').read_text()[-2000:]}")
    measure = sum(max(r["measure_s"] for r in json.loads((o / "result.json").read_text())["ranks"]) for o in outs)
    return outcome.wall_s, (outcome.wall_s - measure) / len(outs)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--reuse", type=int, default=0, metavar="N",
                    help="also time reuse_process: N runs in one commdiag process")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        bare, walls, overheads, shared = [], [], [], []
        for n in range(args.repeat):  # interleaved, as the sweep does
            bare.append(bare_launch(tmp, args.backend, args.nproc))
            wall, over = commdiag_launch(tmp, args.backend, args.nproc, n)
            walls.append(wall)
            overheads.append(over)
            if args.reuse:
                shared.append(commdiag_launch(tmp, args.backend, args.nproc, n, args.reuse)[1])
    ref, ours = statistics.median(bare), statistics.median(overheads)
    print(f"{args.backend} x{args.nproc}, {args.repeat} launches each at {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"bare torchrun launch (init + barrier + teardown): median {ref:.2f} s  [{min(bare):.2f}-{max(bare):.2f}]")
    print(f"commdiag launch overhead (wall - measuring):       median {ours:.2f} s  "
          f"[{min(overheads):.2f}-{max(overheads):.2f}]  (wall {statistics.median(walls):.2f} s)")
    print(f"ratio commdiag/bare: {ours / ref:.2f}   target: overhead < 4 s on 2 GPUs -> "
          f"{'met' if ours < 4 else 'NOT met'}")
    if shared:
        per = statistics.median(shared)
        print(f"reuse_process, {args.reuse} runs per process: overhead per launch median {per:.2f} s "
              f"[{min(shared):.2f}-{max(shared):.2f}]   ratio to bare: {per / ref:.2f}   target < 4 s -> "
              f"{'met' if per < 4 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
