"""Record real Kineto traces of the TP decode step (benchmarks/tp_decode_server.py's ``step``: Megatron-style,
two all-reduces per layer) under torch.profiler, eager and as a CUDA graph, for ``commdiag trace``'s tests.

Run under torchrun (benchmarks/gpu_traces.sh does): one rank is TP=1 (its all-reduces are NCCL's
one-rank copies); two ranks may share one GPU when each has its own NCCL_HOSTID (``--hostid``: NCCL
then sees two nodes and connects them over its socket transport).  The profiler runs with a schedule
(wait 1, warmup 2, active STEPS) and ``prof.step()`` after every decode step, so the traces carry
torch.profiler's own ``ProfilerStep#N`` annotations, as a training loop's or SGLang's do.  Writes
OUT/trace-tp{N}-{mode}-rank{r}.json.gz and prints one JSON line per rank and mode with the step time
measured outside the profiler (median of 50, with its min-max).
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tp_decode_server import build, step  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--hidden", type=int, default=4096)
ap.add_argument("--layers", type=int, default=16)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--hostid", action="store_true", help="every rank on GPU 0, each its own NCCL_HOSTID")
a = ap.parse_args()
rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if a.hostid:
    os.environ["NCCL_HOSTID"] = f"commdiag-trace-host{rank}"
    local = 0
else:
    local = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
dist.init_process_group("nccl", device_id=dev)
layers = build(a.hidden, a.layers, ws, dev, torch.bfloat16)
x0 = torch.randn(a.batch, a.hidden, generator=torch.Generator().manual_seed(7)).to(dev, torch.bfloat16)
with torch.no_grad():
    for _ in range(10):
        step(x0, layers, a.hidden, ws)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step(x0, layers, a.hidden, ws)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = step(x0, layers, a.hidden, ws)
    torch.cuda.synchronize()
    for mode in ("eager", "graph"):
        fn = (lambda: step(x0, layers, a.hidden, ws)) if mode == "eager" else graph.replay
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        dist.barrier()
        times = []
        for _ in range(50):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        name = Path(a.out) / f"trace-tp{ws}{'-hostid' if a.hostid else ''}-{mode}-rank{rank}.json.gz"
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                     schedule=schedule(wait=1, warmup=2, active=a.steps, repeat=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(str(name))) as p:
            for _ in range(1 + 2 + a.steps):
                fn()
                torch.cuda.synchronize()  # a server's step ends when its tokens are read back
                p.step()
        print(json.dumps({"rank": rank, "world_size": ws, "hostid": a.hostid, "mode": mode, "trace": str(name),
                          "step_ms_median": round(statistics.median(times), 4), "step_ms_min": round(min(times), 4),
                          "step_ms_max": round(max(times), 4), "n": len(times)}), flush=True)
dist.destroy_process_group()
