"""Measurement fidelity of commdiag's timing paths against a bare NCCL floor, measured in the same run.

Run on a multi-GPU machine (one process per GPU):

    NCCL_NVLS_ENABLE=0 python -m torch.distributed.run --standalone --nproc-per-node=2 \
        benchmarks/fidelity.py --out fidelity.json

Reference ("floor"): libnccl's ncclAllReduce bound through ctypes on its own
communicator, nothing else in the loop.
  * graph floor: ``batch`` calls captured in one CUDA graph on a side stream, ``replays``
    replays back to back, ONE pair of events around the whole window.
  * eager floor: ``calls`` back-to-back foreign calls with pre-converted arguments,
    one pair of events around the whole window.
Measured: commdiag's own worker functions (the code a sweep runs), medians of their
per-sample times, for torch.distributed and nccl-direct, plus graph replay on torch's
default stream (``replay_stream: default``).

Printed ratios (targets): graph / graph floor within 5% at 14 KB-0.9 MB
and 3% at 14 MB and up, for both call paths; eager nccl-direct / eager floor <= 1.5.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SIZES = [14336, 57344, 917504, 14680064, 58720256, 117440512]  # hidden 7168 bf16: 1, 4, 64, 1024, 4096, 8192 tokens


def floor_graph(torch, call_for, buf, batch: int, replays: int) -> float:
    stream = torch.cuda.Stream()
    call_for(buf, stream).checked()  # warm, outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        call = call_for(buf, stream)
        for _ in range(batch):
            call()
    with torch.cuda.stream(stream):
        for _ in range(3):
            g.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        stream.synchronize()
        start.record(stream)
        for _ in range(replays):
            g.replay()
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / (replays * batch)


def floor_eager(torch, call, calls: int) -> float:
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / calls


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--batch", type=int, default=10)
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    from commdiag.measure import nccldirect, worker

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    control = dist.new_group(backend="gloo")  # as the worker: control traffic never over NCCL
    agree = worker.make_agree(torch, dist, control)
    floor_nccl = nccldirect.Nccl(rank, world, group=control)  # the reference's own communicator
    torch_path = worker.TorchPath(dist)
    direct_path = worker.DirectPath(torch, rank, world, "bfloat16", control)
    plan = {"batch": "auto", "window_us": 500, "iters": args.iters, "warmup": 20, "replay_stream": "side"}
    rows = []
    for size in SIZES:
        buf = torch.zeros(size // 2, dtype=torch.bfloat16, device="cuda")
        call_for = lambda b, s: floor_nccl.allreduce_call(b, "bfloat16", s.cuda_stream)  # noqa: E731
        row = {"size_bytes": size}
        dist.barrier()
        row["floor_graph_us"] = floor_graph(torch, call_for, buf, args.batch, args.iters)
        dist.barrier()
        row["floor_eager_us"] = floor_eager(torch, call_for(buf, torch.cuda.current_stream()), args.iters)
        for p in (torch_path, direct_path):
            dist.barrier()
            row[f"{p.name}_graph_us"] = statistics.median(worker._time_graph(torch, p, buf, plan, agree)[0])
            dist.barrier()
            row[f"{p.name}_eager_us"] = statistics.median(worker._time_eager_cuda(torch, p.op(buf), plan, agree)[0])
        dist.barrier()
        row["torch_graph_default_stream_us"] = statistics.median(
            worker._time_graph(torch, torch_path, buf, {**plan, "replay_stream": "default"}, agree)[0])
        rows.append(row)
        del buf
    floor_nccl.close()
    direct_path.close()
    if rank == 0:
        out = {"machine": os.uname().nodename, "gpus": [torch.cuda.get_device_name(i) for i in range(world)],
               "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
               "libnccl": direct_path.nccl.path, "libnccl_version": direct_path.nccl.version(),
               "iters": args.iters, "batch": args.batch, "rows": rows, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        args.out.write_text(json.dumps(out, indent=1))
        print(f"libnccl {out['libnccl']} ({out['libnccl_version']}), torch {out['torch']}, {world} x {out['gpus'][0]}")
        print(f"{'size(B)':>10} {'floor g':>8} {'torch g':>8} {'ratio':>6} {'direct g':>8} {'ratio':>6} "
              f"{'dflt-strm':>9} {'ratio':>6} | {'floor e':>8} {'direct e':>8} {'ratio':>6} {'torch e':>8} {'ratio':>6}")
        for r in rows:
            fg, fe = r["floor_graph_us"], r["floor_eager_us"]
            print(f"{r['size_bytes']:>10} {fg:>8.2f} {r['torch_graph_us']:>8.2f} {r['torch_graph_us'] / fg:>6.3f} "
                  f"{r['nccl-direct_graph_us']:>8.2f} {r['nccl-direct_graph_us'] / fg:>6.3f} "
                  f"{r['torch_graph_default_stream_us']:>9.2f} {r['torch_graph_default_stream_us'] / fg:>6.3f} | "
                  f"{fe:>8.2f} {r['nccl-direct_eager_us']:>8.2f} {r['nccl-direct_eager_us'] / fe:>6.3f} "
                  f"{r['torch_eager_us']:>8.2f} {r['torch_eager_us'] / fe:>6.3f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
