"""What runs under torchrun: one rank of one launch.

Per size: a correctness check with an exactly representable expected sum
(nccl-tests' #wrong), warmup, then timing.

* graph mode (NCCL): ``graph_batch`` all-reduces are captured in one CUDA graph on
  a side stream; ``iters`` replays are enqueued back to back on that side stream
  with a CUDA event between replays, and only then synchronised.  A sample is
  one replay's event time / graph_batch: per-all-reduce device time, free of
  launch overhead.  (Replaying on torch's default stream was measured 3x slower
  on H200s, and timing single replays adds launch noise, hence both choices.)
* eager mode (NCCL): ``iters`` back-to-back ``dist.all_reduce`` calls on the
  current stream with an event between calls (device time, including any gap the
  host's dispatch leaves) and the host time each call took to enqueue.
* eager mode (gloo): the wall time of each blocking call (monotonic clock).

Every rank's result is gathered to all ranks and LOCAL_RANK 0 of each node writes
``result.json`` into the launch folder, so a multi-node run is complete on every node.
A failing rank writes ``rank<N>.error.txt`` with its traceback.

Test-only switch, honoured only when set: ``COMMDIAG_TEST_FAULT`` = ``hang``
(rank 0 sleeps before timing), ``crash`` (rank 0 exits 3 mid-launch),
``wrong`` (rank 0 corrupts one element, so the check counts it), or
``hang-teardown`` (all results written, then rank 0 never exits).  The tests
set it as an ordinary config variable.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from . import collectives, metadata, ncclog
from .atomic import write_json

FAULT = os.environ.get("COMMDIAG_TEST_FAULT", "")


def _fault(point: str, rank: int) -> None:
    if rank != 0 or not FAULT:
        return
    if FAULT == "hang" and point == "before-timing":
        time.sleep(10**6)
    if FAULT == "crash" and point == "before-timing":
        print("commdiag test fault: crashing rank 0 on purpose", file=sys.stderr, flush=True)
        os._exit(3)
    if FAULT == "hang-teardown" and point == "teardown":
        time.sleep(10**6)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    plan = json.loads(Path(argv[argv.index("--plan") + 1]).read_text())
    out_dir = Path(plan["out_dir"])
    rank = int(os.environ.get("RANK", "0"))
    try:
        return _run(plan, out_dir, rank)
    except BaseException:
        (out_dir / f"rank{rank}.error.txt").write_text(traceback.format_exc())
        raise


def _run(plan: dict, out_dir: Path, rank: int) -> int:
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    backend = plan["backend"]
    t_init = time.monotonic()
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    init_s = time.monotonic() - t_init
    dtype = getattr(torch, plan["dtype"])

    info = {
        "rank": rank, "local_rank": local_rank, "world_size": world, "pid": os.getpid(),
        **metadata.collect_host(), **metadata.collect_torch(),
        "env_seen": metadata.env_seen(plan["watch_env"]),
        "init_s": round(init_s, 3),
    }
    if backend == "nccl":
        info.update(metadata.collect_gpu(local_rank))

    wrong: dict[str, int] = {}
    samples: dict[str, dict[str, list[float]]] = {m: {} for m in plan["modes"]}
    enqueue: dict[str, list[float]] = {}
    _fault("before-timing", rank)
    for size_bytes in plan["sizes"]:
        numel = size_bytes // collectives.DTYPE_BYTES[plan["dtype"]]
        wrong[str(size_bytes)] = _check(dist, torch, numel, dtype, device, rank, world, plan)
        buf = torch.zeros(numel, dtype=dtype, device=device)  # zeros stay zeros: no overflow while timing
        for mode in plan["modes"]:
            dist.barrier()
            if mode == "graph":
                samples[mode][str(size_bytes)] = _time_graph(dist, torch, buf, plan)
            elif backend == "nccl":
                samples[mode][str(size_bytes)], enqueue[str(size_bytes)] = _time_eager_cuda(dist, torch, buf, plan)
            else:
                samples[mode][str(size_bytes)] = _time_eager_host(dist, buf, plan)
        del buf

    if plan.get("nccl_debug_file"):
        info["nccl_applied"], info["nccl_log_version"] = _nccl_applied(plan["nccl_debug_file"])
    result = {**info, "wrong": wrong, "samples": samples, "enqueue_us": enqueue}
    everyone: list = [None] * world
    dist.all_gather_object(everyone, result)
    if local_rank == 0:
        write_json(out_dir / "result.json", {"ranks": sorted(everyone, key=lambda r: r["rank"])})
    _fault("teardown", rank)
    dist.destroy_process_group()
    return 0


def _pattern(torch, numel, dtype, device, rank):
    idx = torch.arange(numel, device=device) % 4
    return (idx + (rank % 3) + 1).to(dtype), idx


def _check(dist, torch, numel, dtype, device, rank, world, plan) -> int:
    """All-reduce a known pattern (eager, and once inside a CUDA graph) and count wrong elements."""
    expected = torch.tensor([collectives.expected_sum(world, k) for k in range(4)], dtype=dtype, device=device)
    wrong = 0
    runs = ["eager"] + (["graph"] if "graph" in plan["modes"] else [])
    for how in runs:
        buf, idx = _pattern(torch, numel, dtype, device, rank)
        if how == "graph":
            g, stream = _capture(torch, dist, buf, 1, warm=False)  # capture does not run the op
            with torch.cuda.stream(stream):
                g.replay()
            torch.cuda.synchronize()
        else:
            dist.all_reduce(buf)
            if plan["backend"] == "nccl":
                torch.cuda.synchronize()
        if FAULT == "wrong" and rank == 0:
            buf[0] += 1
        wrong += int((buf != expected[idx]).sum().item())
    return wrong


def _capture(torch, dist, buf, count: int, warm: bool = True):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    if warm:  # NCCL and the allocator must see the op once outside capture
        with torch.cuda.stream(stream):
            dist.all_reduce(buf)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        for _ in range(count):
            dist.all_reduce(buf)
    torch.cuda.synchronize()
    return g, stream


def _time_graph(dist, torch, buf, plan) -> list[float]:
    batch, iters = plan["graph_batch"], plan["iters"]
    g, stream = _capture(torch, dist, buf, batch)
    with torch.cuda.stream(stream):
        for _ in range(max(1, -(-plan["warmup"] // batch))):
            g.replay()
        stream.synchronize()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
        events[0].record(stream)
        for i in range(iters):
            g.replay()
            events[i + 1].record(stream)
    stream.synchronize()
    out = [events[i].elapsed_time(events[i + 1]) * 1000.0 / batch for i in range(iters)]
    del g
    return out


def _time_eager_cuda(dist, torch, buf, plan) -> tuple[list[float], list[float]]:
    for _ in range(plan["warmup"]):
        dist.all_reduce(buf)
    torch.cuda.synchronize()
    iters = plan["iters"]
    events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    host = [0.0] * iters
    clock = time.perf_counter_ns
    events[0].record()
    for i in range(iters):
        t0 = clock()
        dist.all_reduce(buf)
        host[i] = (clock() - t0) / 1000.0
        events[i + 1].record()
    torch.cuda.synchronize()
    return [events[i].elapsed_time(events[i + 1]) * 1000.0 for i in range(iters)], host


def _time_eager_host(dist, buf, plan) -> list[float]:
    for _ in range(plan["warmup"]):
        dist.all_reduce(buf)
    clock = time.perf_counter_ns
    out = []
    for _ in range(plan["iters"]):
        t0 = clock()
        dist.all_reduce(buf)
        out.append((clock() - t0) / 1000.0)
    return out


def _nccl_applied(pattern: str) -> tuple[dict, str | None]:
    """Read this process's NCCL debug file (NCCL_DEBUG_FILE with %h/%p expanded)."""
    import socket

    path = Path(pattern.replace("%h", socket.gethostname()).replace("%p", str(os.getpid())))
    try:
        procs = ncclog.parse(path.read_text(errors="replace"))
    except OSError:
        return {}, None
    proc = procs.get(os.getpid()) or next(iter(procs.values()), None)
    return (dict(proc.applied), proc.version) if proc else ({}, None)


if __name__ == "__main__":
    sys.exit(main())
