"""What runs under torchrun: one rank of one launch.

For each call path (``via``: ``torch`` = torch.distributed, ``nccl-direct`` =
libnccl through ctypes, see nccldirect.py) and each size: a correctness check
with an exactly representable expected sum (nccl-tests' #wrong), warmup, then
timing in each mode:

A sample is a window of ``batch`` back-to-back all-reduces, timed by a CUDA event
pair at its ends, divided by ``batch``.  With ``batch: auto`` (the default) the
worker estimates one all-reduce's time and picks enough calls to fill
``window_us`` of device time (at most 1000 calls): an event between every call
costs a few microseconds of its own, which at 7 us all-reduces would be 40%
of the measurement, while across a 500 us window it is under 1%.

* graph (NCCL): ``batch`` all-reduces captured in one CUDA graph; ``iters`` replays
  enqueued back to back on the replay stream with an event between replays,
  synchronised only at the end: device time, free of launch overhead.  The replay
  stream is ``replay_stream``: ``side`` (a dedicated stream; the default) or
  ``default`` (torch's default stream, which was measured 3x slower on H200s —
  frameworks that replay there pay it, so it is a measurable variable).
* eager (NCCL): ``iters`` windows of ``batch`` back-to-back calls on the current
  stream (device time, including any gap the host's dispatch leaves), plus the
  host time per call to enqueue (``enqueue_us``).
* eager (gloo): the wall time of each blocking call (monotonic clock, batch 1).

``explain`` launches time nothing: they run a few all-reduces per size with
NCCL's TUNING log on, for ``commdiag explain`` to read what NCCL chose.

Every rank's result is gathered to all ranks and LOCAL_RANK 0 of each node writes
``result.json`` (format below) into the launch folder, so a multi-node run is
complete on every node.  A failing rank writes ``rank<N>.error.txt``.

With ``reuse_process`` the plan lists ``runs``: one process makes each run in turn,
setting the run's NCCL_PROTO/NCCL_ALGO (``set_env``) before creating that run's own
communicators (a new torch group, a new nccl-direct communicator), and writes each
run's result.json into that run's launch folder, with ``nccl_applied`` read from the
NCCL log bytes written since the run began: the sweep keeps a run only if they
confirm its values.

result.json: {"format": "commdiag-launch", "version": 2, "ranks": [per rank: info,
"wrong": {via: {size: n}}, "samples": {via: {mode: {size: [us...]}}},
"enqueue_us": {via: {size: [us...]}}]}.  Version 1 (no via level) is still read.

Test-only switch, honoured only when set: ``COMMDIAG_TEST_FAULT`` = ``hang``
(rank 0 sleeps before timing), ``hang-detached`` (rank 0 leaves a grandchild in a session of its
own, then sleeps), ``crash`` (rank 0 exits 3 mid-launch),
``wrong`` (rank 0 corrupts one element, so the check counts it), or
``hang-teardown`` (all results written, then rank 0 never exits).  The tests
set it as an ordinary config variable; ``COMMDIAG_TEST_FAULT_RANK`` moves the fault to another
rank.  Nothing on this module's import path reads the environment at import time: a launch server imports it once for many launches
(docs/launch-methods.md).
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

from . import collectives
from .. import metadata
from ..nccl import ncclog, tunerlog
from ..atomic import write_json

FAULT_VAR = "COMMDIAG_TEST_FAULT"
FAULT_RANK_VAR = "COMMDIAG_TEST_FAULT_RANK"  # the rank the fault hits (default 0)
# Benchmarks only: COMMDIAG_SHARE_GPU=1 puts every rank of a one-GPU machine on GPU 0 with its own
# NCCL_HOSTID, a real multi-rank NCCL communicator over sockets (the fork server's proof 2 on 1 GPU).
SHARE_GPU_VAR = "COMMDIAG_SHARE_GPU"
LAUNCH_FORMAT_VERSION = 2
EXPLAIN_CALLS = 3  # all-reduces per size in an explain launch: NCCL logs its choice for each call
MAX_BATCH = 1000  # calls per sample with batch: auto (1000 x 7 us = 7 ms: plenty of window)
PROBE_BATCH = 10  # all-reduces in the graph that estimates one call's device time
# time_per_size_ms: the fewest samples a size is timed with; the launch value trims 5% of each end, so
# 20 samples still drop one at each end (a sample of a small NCCL message is a 500 us window of calls:
# 50 of them fit 25 ms)
MIN_TIMED = 20
# time_per_size_ms: warmup calls are at most this share of the budget (never more than ``warmup``, never
# fewer than MIN_WARMUP).  Before them every size has had its correctness check and, in graph mode, the
# probe (PROBE_BATCH calls): 20 warmup calls of a 20 ms all-reduce (117 MB on PCIe) would be 0.4 s against
# a 25 ms budget, and 20 calls of a 7 us one still fit in 0.14 ms.
WARMUP_SHARE = 0.1
MIN_WARMUP = 2


def _test_fault() -> str:
    """The test-only fault, read at each call: a launch server imports this module once for many
    launches, so a value read at import would be the server's, not the launch's."""
    return os.environ.get(FAULT_VAR, "")


def _fault(point: str, rank: int) -> None:
    fault = _test_fault()
    if rank != int(os.environ.get(FAULT_RANK_VAR) or 0) or not fault:
        return
    if fault == "hang" and point == "before-timing":
        time.sleep(10**6)
    if fault == "hang-detached" and point == "before-timing":
        # a grandchild in a session of its own (re-parented to init, out of every process tree a
        # launcher or slurmstepd follows), then hang: only the marker sweep can find it
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(10**6)
            os._exit(0)
        time.sleep(10**6)
    if fault == "crash" and point == "before-timing":
        print("commdiag test fault: crashing rank 0 on purpose", file=sys.stderr, flush=True)
        os._exit(3)
    if fault == "hang-teardown" and point == "teardown":
        time.sleep(10**6)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    plan = json.loads(Path(argv[argv.index("--plan") + 1]).read_text())
    out_dir = Path(plan["out_dir"])
    from .slurm import adopt_slurm_ranks

    adopt_slurm_ranks()  # a task srun started: Slurm's rank variables as torch's (a no-op under torchrun)
    rank = int(os.environ.get("RANK", "0"))
    try:
        return _run(plan, rank)
    except BaseException:
        (out_dir / f"rank{rank}.error.txt").write_text(traceback.format_exc())
        raise


class TorchPath:
    """torch.distributed.all_reduce, as frameworks call it."""

    name = "torch"

    def __init__(self, dist, group=None):
        self.dist, self.group = dist, group

    def op(self, buf, stream=None):
        if self.group is None:
            return functools.partial(self.dist.all_reduce, buf)
        return functools.partial(self.dist.all_reduce, buf, group=self.group)

    def close(self):
        if self.group is not None:
            self.dist.destroy_process_group(self.group)


class DirectPath:
    """libnccl's ncclAllReduce through ctypes, on the stream given (or torch's current one)."""

    name = "nccl-direct"

    def __init__(self, torch, rank, world, dtype_name, group=None):
        from . import nccldirect

        self.torch, self.dtype_name = torch, dtype_name
        self.nccl = nccldirect.Nccl(rank, world, group=group)

    def op(self, buf, stream=None):
        stream = stream if stream is not None else self.torch.cuda.current_stream()
        return self.nccl.allreduce_call(buf, self.dtype_name, stream.cuda_stream)

    def close(self):
        self.nccl.close()


def runs_of(plan: dict) -> list[dict]:
    """The measurements one process makes: ``plan["runs"]`` (reuse_process), else the plan itself."""
    if plan.get("runs"):
        return plan["runs"]
    return [{"config": plan.get("config"), "launch": plan.get("launch"), "out_dir": plan["out_dir"],
             "watch_env": plan["watch_env"], "set_env": None}]


def _apply_env(set_env: dict | None) -> None:
    """Set (or unset, value None) the per-communicator variables of one run, before its communicators
    exist: NCCL reads NCCL_PROTO and NCCL_ALGO at each communicator's init."""
    for name, value in (set_env or {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _log_size(pattern: str | None) -> int:
    if not pattern:
        return 0
    try:
        return _debug_path(pattern).stat().st_size
    except OSError:
        return 0


def _run(plan: dict, rank: int) -> int:
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    backend = plan["backend"]
    runs = runs_of(plan)
    reuse = bool(plan.get("runs"))
    t_init = time.monotonic()
    if backend == "nccl":
        gpu = local_rank
        if os.environ.get(SHARE_GPU_VAR) == "1":
            # every rank on GPU 0, each on a "host" of its own: NCCL connects them over its network
            # transport (sockets) instead of refusing a duplicate GPU (benchmarks/gpu_transports_net1.sh)
            gpu = 0
            os.environ.setdefault("NCCL_HOSTID", f"commdiag-share-gpu-rank{rank}")
        torch.cuda.set_device(gpu)
        device = torch.device("cuda", gpu)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    # Control traffic (the nccl-direct unique id, gathering results) goes over gloo, never over the
    # NCCL communicator under test: a config such as NCCL_ALGO=Tree leaves NCCL no algorithm for
    # Broadcast or AllGather ("no algorithm/protocol available"), seen on 2x H200.
    control = dist.new_group(backend="gloo") if backend == "nccl" else None
    agree = make_agree(torch, dist, control)
    init_s = time.monotonic() - t_init
    dtype = getattr(torch, plan["dtype"])
    host = {"rank": rank, "local_rank": local_rank, "world_size": world, "pid": os.getpid(),
            **metadata.collect_host(), **metadata.collect_torch()}
    if backend == "nccl":
        host.update(metadata.collect_gpu(local_rank))

    for n, run in enumerate(runs):
        t_run = time.monotonic()
        _apply_env(run.get("set_env"))
        log_from = _log_size(plan.get("nccl_debug_file"))
        paths = []
        for via in (["torch"] if plan.get("model") else plan.get("vias", ["torch"])):
            if via == "torch":
                # reuse_process: a fresh communicator per run, created after its variables were set
                group = dist.new_group(backend=backend) if reuse else None
                paths.append(TorchPath(dist, group))
            else:
                paths.append(DirectPath(torch, rank, world, plan["dtype"], control))
        info = {**host, "env_seen": metadata.env_seen(run["watch_env"]),
                "init_s": round(init_s + (time.monotonic() - t_run), 3), "run": n, "runs": len(runs)}
        for p in paths:
            if p.name == "nccl-direct":
                info["nccl_direct"] = {"library": p.nccl.path, "version": p.nccl.version()}
        result = _measure(torch, dist, plan, paths, agree, dtype, device, rank, world, backend, info)
        if plan.get("nccl_debug_file"):
            result["nccl_applied"], result["nccl_log_version"] = _nccl_applied(plan["nccl_debug_file"], log_from)
            if os.environ.get("NCCL_TUNER_PLUGIN"):
                result["nccl_tuner"] = _nccl_tuner(plan["nccl_debug_file"], log_from)
        everyone: list = [None] * world
        dist.all_gather_object(everyone, result, group=control)
        if local_rank == 0:
            write_json(Path(run["out_dir"]) / "result.json",
                       {"format": "commdiag-launch", "version": LAUNCH_FORMAT_VERSION,
                        "ranks": sorted(everyone, key=lambda r: r["rank"])})
        _fault("teardown", rank)
        for p in paths:
            p.close()
        if reuse and backend == "nccl":
            torch.cuda.synchronize()
    dist.destroy_process_group()
    return 0


def _measure(torch, dist, plan, paths, agree, dtype, device, rank, world, backend, info) -> dict:
    """The correctness check and the timings of one run: every size, call path and mode."""
    if plan.get("model"):  # commdiag step: the TP layer's step and its two ablations (tpstep.py)
        from . import tpstep
        return tpstep.measure(torch, dist, plan, paths[0], agree, dtype, device, rank, world, backend, info)
    wrong: dict = {p.name: {} for p in paths}
    samples: dict = {p.name: {m: {} for m in plan["modes"]} for p in paths}
    batches: dict = {p.name: {m: {} for m in plan["modes"]} for p in paths}
    enqueue: dict = {p.name: {} for p in paths}
    _fault("before-timing", rank)
    # gloo: the ranks agree on their sample counts over the default (gloo) group itself
    host_agree = make_agree(torch, dist, dist.group.WORLD) if backend != "nccl" else None
    t_measure = time.monotonic()
    for size_bytes in plan["sizes"]:
        numel = size_bytes // collectives.DTYPE_BYTES[plan["dtype"]]
        key = str(size_bytes)
        for p in paths:
            wrong[p.name][key] = _check(torch, p, numel, dtype, device, rank, world, plan)
            if plan.get("explain"):
                _explain(torch, dist, p, numel, dtype, device, backend)
                continue
            buf = torch.zeros(numel, dtype=dtype, device=device)  # zeros stay zeros: no overflow while timing
            for mode in plan["modes"]:
                dist.barrier()
                if mode == "graph":
                    samples[p.name][mode][key], batches[p.name][mode][key] = _time_graph(torch, p, buf, plan, agree)
                elif backend == "nccl":
                    (samples[p.name][mode][key], enqueue[p.name][key],
                     batches[p.name][mode][key]) = _time_eager_cuda(torch, p.op(buf), plan, agree)
                else:
                    samples[p.name][mode][key] = _time_eager_host(p.op(buf), plan, host_agree)
                    batches[p.name][mode][key] = 1
            del buf
    info["measure_s"] = round(time.monotonic() - t_measure, 3)
    return {**info, "wrong": wrong, "samples": samples, "enqueue_us": enqueue, "batch": batches}


def _pattern(torch, numel, dtype, device, rank):
    idx = torch.arange(numel, device=device) % 4
    return (idx + (rank % 3) + 1).to(dtype), idx


def _check(torch, path, numel, dtype, device, rank, world, plan) -> int:
    """All-reduce a known pattern (eager, and once inside a CUDA graph) and count wrong elements."""
    expected = torch.tensor([collectives.expected_sum(world, k) for k in range(4)], dtype=dtype, device=device)
    wrong = 0
    runs = ["eager"] + (["graph"] if "graph" in plan["modes"] else [])
    for how in runs:
        buf, idx = _pattern(torch, numel, dtype, device, rank)
        if how == "graph":
            g, stream = _capture(torch, path, buf, 1, plan.get("replay_stream", "side"), warm=False)
            with torch.cuda.stream(stream):
                g.replay()
            torch.cuda.synchronize()
        else:
            path.op(buf)()
            if plan["backend"] == "nccl":
                torch.cuda.synchronize()
        if rank == 0 and _test_fault() == "wrong":
            buf[0] += 1
        wrong += int((buf != expected[idx]).sum().item())
    return wrong


def _capture(torch, path, buf, count: int, replay_stream: str, warm: bool = True):
    """Capture ``count`` all-reduces; returns the graph and the stream to replay it on.

    Capture always happens on a side stream (CUDA cannot capture the legacy default
    stream); ``replay_stream`` only chooses where the graph is replayed.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    if warm:  # NCCL and the allocator must see the op once outside capture
        with torch.cuda.stream(stream):
            path.op(buf, stream)()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        op = path.op(buf, stream)
        for _ in range(count):
            op()
    torch.cuda.synchronize()
    return g, (stream if replay_stream == "side" else torch.cuda.default_stream())


def make_agree(torch, dist, group):
    """A function that makes every rank use the same count: the max over ranks (over ``group``).

    Each rank estimates its own call time, so without this the ranks would capture
    graphs of different lengths, issue different numbers of collectives and hang
    (seen on 2x H200: one rank still replaying its graph while the other had moved on).
    """
    if group is None:
        return lambda n: n

    def agree(n: int) -> int:
        t = torch.tensor([n], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return int(t.item())

    return agree


def _auto_batch(plan, one_call_us: float) -> int:
    if plan.get("batch", "auto") != "auto":
        return int(plan["batch"])
    return max(1, min(MAX_BATCH, math.ceil(float(plan.get("window_us", 500)) / max(one_call_us, 0.01))))


def warmup_count(plan, call_us: float, agree=lambda n: n) -> int:
    """Warmup calls before timing: ``warmup``, or with ``time_per_size_ms`` as many as fit WARMUP_SHARE of
    the budget (at least MIN_WARMUP, at most ``warmup``), agreed over ranks like timed_count (every rank
    must issue the same number of collectives).  Fixed counts (``time_per_size_ms: null``) keep the
    plan's ``warmup`` exactly."""
    warm = int(plan["warmup"])
    budget_ms = plan.get("time_per_size_ms")
    if not budget_ms or warm <= MIN_WARMUP:
        return warm
    fits = math.ceil(WARMUP_SHARE * float(budget_ms) * 1000.0 / max(call_us, 0.01))
    return agree(max(MIN_WARMUP, min(warm, fits)))


def timed_count(plan, sample_us: float, agree=lambda n: n) -> int:
    """How many samples to time: ``iters``, or with ``time_per_size_ms`` as many as fit that budget
    (at least MIN_TIMED, at most ``iters``), the same on every rank (the max over ranks: ranks that
    timed different counts would issue different numbers of collectives and hang).

    Calibrated in the launch itself from the warmup's time per sample, as pyperf calibrates its loops:
    with 25 ms, a 117 MB all-reduce of 20 ms is timed 20 times in 400 ms, not 200 times in 4 s, and a
    7 us one 50 windows of 500 us (70 calls each) in 25 ms, not 200 in 100 ms."""
    iters = int(plan["iters"])
    budget_ms = plan.get("time_per_size_ms")
    if not budget_ms:
        return iters
    fits = math.ceil(float(budget_ms) * 1000.0 / max(sample_us, 0.01))
    return agree(max(min(MIN_TIMED, iters), min(iters, fits)))


def _window_us(torch, stream, fn, reps: int) -> float:
    """Device time of ``reps`` back-to-back ``fn()`` on ``stream``, one event pair around them."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record(stream)
        for _ in range(reps):
            fn()
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) * 1000.0


def _time_graph(torch, path, buf, plan, agree=lambda n: n) -> tuple[list[float], int]:
    iters, where = plan["iters"], plan.get("replay_stream", "side")
    budget = bool(plan.get("time_per_size_ms"))
    if plan.get("batch", "auto") == "auto":
        one_call_us = None
        if budget:  # a call that fills the window alone (batch 1) needs no probe graph
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            op = path.op(buf, side)
            # the faster of two calls: the first also waits for the ranks that left the barrier later
            single = min(_window_us(torch, side, op, 1), _window_us(torch, side, op, 1))
            single = agree(math.ceil(single))  # every rank decides alike
            if single >= float(plan.get("window_us", 500)):
                one_call_us = float(single)
        if one_call_us is None:
            probe, stream = _capture(torch, path, buf, PROBE_BATCH, where)
            probe.replay()
            reps = 1 if budget else 3  # a budget: one timed replay of the probe is enough
            one_call_us = _window_us(torch, stream, probe.replay, reps) / (reps * PROBE_BATCH)
            del probe
        batch = agree(_auto_batch(plan, one_call_us))
    else:
        batch = int(plan["batch"])
        one_call_us = None
    g, stream = _capture(torch, path, buf, batch, where)
    if one_call_us is None and budget:  # a fixed batch: one replay says a call's time
        one_call_us = _window_us(torch, stream, g.replay, 1) / batch
    warm = warmup_count(plan, one_call_us or 0.0, agree)
    with torch.cuda.stream(stream):
        for _ in range(max(1, -(-warm // batch))):
            g.replay()
        stream.synchronize()
    if budget:
        iters = timed_count(plan, _window_us(torch, stream, g.replay, 2) / 2, agree)
    with torch.cuda.stream(stream):
        events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
        events[0].record(stream)
        for i in range(iters):
            g.replay()
            events[i + 1].record(stream)
    stream.synchronize()
    out = [events[i].elapsed_time(events[i + 1]) * 1000.0 / batch for i in range(iters)]
    del g
    return out, batch


def _time_eager_cuda(torch, op, plan, agree=lambda n: n) -> tuple[list[float], list[float], int]:
    op()
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    if plan.get("time_per_size_ms"):  # one timed call says how many warmup calls fit the budget's share
        one_call_us = _window_us(torch, stream, op, 1)
        rest = warmup_count(plan, one_call_us, agree) - 1
        if rest > 0:  # the faster of the two: a first call that waited for the other rank says too little
            one_call_us = min(one_call_us, _window_us(torch, stream, op, rest) / rest)
    else:
        warm = max(1, plan["warmup"])
        one_call_us = _window_us(torch, stream, op, warm) / warm
    batch = agree(_auto_batch(plan, one_call_us))
    iters = timed_count(plan, one_call_us * batch, agree)
    events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    host = [0.0] * iters
    clock = time.perf_counter_ns
    record = [e.record for e in events]
    calls = range(batch)
    record[0]()
    for i in range(iters):
        t0 = clock()
        for _ in calls:
            op()
        host[i] = (clock() - t0) / 1000.0 / batch
        record[i + 1]()
    torch.cuda.synchronize()
    return [events[i].elapsed_time(events[i + 1]) * 1000.0 / batch for i in range(iters)], host, batch


def _time_eager_host(op, plan, agree=lambda n: n) -> list[float]:
    clock = time.perf_counter_ns

    def calls_us(n: int) -> float:
        t0 = clock()
        for _ in range(n):
            op()
        return (clock() - t0) / 1000.0 / max(1, n)

    if plan.get("time_per_size_ms"):
        # Each warmup call timed alone, and the count calibrated from the fastest: a host's call time
        # jumps 10x while another process holds a core (2 ranks on 2 cores: 0.4 ms, and 3 ms for tens of
        # ms at a time), and a count calibrated from one such call times 20 samples inside that episode
        # where fixed counts time 200 across it (benchmarks/budget_aa.py on CPU, benchmarks/README.md).
        times = [calls_us(1) for _ in range(min(MIN_WARMUP, max(1, plan["warmup"])))]
        times += [calls_us(1) for _ in range(warmup_count(plan, min(times), agree) - len(times))]
        warm_us = min(times)
    else:
        warm_us = calls_us(plan["warmup"])
    out = []
    for _ in range(timed_count(plan, warm_us, agree)):
        t0 = clock()
        op()
        out.append((clock() - t0) / 1000.0)
    return out


def _explain(torch, dist, path, numel, dtype, device, backend) -> None:
    buf = torch.zeros(numel, dtype=dtype, device=device)
    op = path.op(buf)
    for _ in range(EXPLAIN_CALLS):
        op()
    if backend == "nccl":
        torch.cuda.synchronize()
    dist.barrier()


def _debug_path(pattern: str) -> Path:
    """This process's NCCL debug file: NCCL_DEBUG_FILE with %h and %p expanded."""
    import socket

    return Path(pattern.replace("%h", socket.gethostname()).replace("%p", str(os.getpid())))


def _nccl_applied(pattern: str, start: int = 0) -> tuple[dict, str | None]:
    """What NCCL said it applied, from this process's debug file from byte ``start`` on.

    NCCL line-buffers that file, so the bytes written since ``start`` are exactly the lines
    of the communicators created since: with reuse_process, one run's own proof."""
    try:
        data = _debug_path(pattern).read_bytes()
    except OSError:
        return {}, None
    procs = ncclog.parse(data[start:].decode(errors="replace"))
    version = next((p.version for p in ncclog.parse(data.decode(errors="replace")).values() if p.version), None)
    proc = procs.get(os.getpid()) or next(iter(procs.values()), None)
    return (dict(proc.applied) if proc else {}), version


def _nccl_tuner(pattern: str, start: int = 0) -> dict | None:
    """What NCCL and the tuner plugin said (nccl/tunerlog.py): the load from the whole file (NCCL loads
    the library once per process), rules and rule applications from this run's bytes on."""
    try:
        data = _debug_path(pattern).read_bytes()
    except OSError:
        return None
    pid = os.getpid()
    whole = tunerlog.parse(data.decode(errors="replace")).get(pid)
    part = tunerlog.parse(data[start:].decode(errors="replace")).get(pid) if start else whole
    found = tunerlog.merge_load(whole, part if part and (part.rules or part.rules_warnings) else whole)
    return found.to_json() if found else None


if __name__ == "__main__":
    sys.exit(main())
