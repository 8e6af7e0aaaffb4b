"""A sweep's expected wall time: one cost model for the start banner, the progress lines and ``--dry-run``.
Pure, no I/O.

A launch costs its **start-up** (fork or torchrun, process group and communicator init, teardown:
run.json's ``overhead_s``) plus its **measuring** (``measure_s``: every size in every mode and call path).
Stage-2 launches measure only their claims' series (``confirmation.measure``), so their measuring is
stage 1's scaled by the share of series x sizes they time.

From this run's launches on (``measured``): start-up is the median ``overhead_s`` of the launches that did
not start the launch servers (the first launch of a command carries their one-time start, seconds on a
GPU box: it is left out once another launch is in), measuring the median ``measure_s`` per series x size.

Before any launch (``recorded``, and ``commdiag sweep SPEC --dry-run``): the components recorded in
benchmarks/README.md, per backend and launch method (``STARTUP_S``), and the measuring counted all-reduce
by all-reduce as worker.py makes them (``size_s``: the correctness check, graph mode's probe, the warmup,
the calibration and the timed samples, with ``time_per_size_ms`` as many as fit the budget:
worker.timed_count and worker.warmup_count), each call's time from a model (``CALL_MODEL``: a latency
plus a ring all-reduce's bytes per rank over a bus bandwidth).  Left out: the barriers and the ranks'
agreements over gloo, capturing the graphs, building the check's buffers (1x H100: the count gave
0.87-0.89 of the measuring, benchmarks/README.md 2026-12-06).  The model's numbers are assumptions until
a launch has run; from the first launch on the measured times replace them.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import worker

# Start-up per launch (seconds), recorded: nccl on 1x H200 (benchmarks/README.md 2026-12-02, median of
# 5 after the first: forkserver 1.55 s, torchrun 9.73 s); gloo on the 2-core development machine
# (benchmarks/forkserver_cpu.txt 2026-12-02: forkserver 1.54 s, torchrun 21.9 s at load 5-7).
STARTUP_S = {("nccl", "forkserver"): 1.55, ("nccl", "torchrun"): 9.73,
             ("gloo", "forkserver"): 1.54, ("gloo", "torchrun"): 21.9}
# The launch servers' one-time start, added once per command that uses them (first launch of 1x H200:
# 4.79 s against 1.55 s after it).
SERVER_START_S = {"nccl": 3.2, "gloo": 1.0}
# sweeps/pcie8.yaml on 8 PCIe GPUs as shipped (nccl: launch forkserver, time_per_size_ms 25, via torch),
# from these components, the call model at 25-10 GB/s and the planned launches with stage 2's most
# (benchmarks/pcie8_estimate.py: 6.8-9.3 min; 27-30 min with launch: torchrun).  The README, --help and
# the spec's comment quote it (tests/test_plan_eta.py).
PCIE8_ESTIMATE = "7-9 min"
# A call's time before any launch has measured one: latency_us + bytes x 2(n-1)/n / bus bandwidth.  nccl:
# 30 us and 10 GB/s, the slow end of a PCIe Gen4 x16 box (no 8-GPU PCIe box has run yet:
# benchmarks/pcie8_estimate.py prints the 10-25 GB/s range); gloo: 2 ranks on the 2-core development
# machine, 2026-12-06 (4 KB: 0.35-0.42 ms median, 8 MB: 5.8-6.6 ms).
CALL_MODEL = {"nccl": (30.0, 10e9), "gloo": (400.0, 1.4e9)}


@dataclass(frozen=True)
class Cost:
    """What one launch is expected to cost, and where the numbers came from."""

    startup_s: float
    measure_s: float | None  # stage-1 launch; None: unknown before a launch has measured
    source: str  # "measured" (this run's launches) | "recorded" (benchmarks/README.md and the budget)
    note: str

    def launch_s(self, share: float = 1.0) -> float | None:
        """One launch measuring ``share`` of a stage-1 launch's series x sizes."""
        return None if self.measure_s is None else self.startup_s + self.measure_s * share


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def series(spec) -> int:
    """Series a stage-1 launch times per size: modes x call paths (gloo: eager via torch only)."""
    return max(1, len(spec.modes) * len(spec.vias))


def call_us(spec, size_bytes: int, latency_us: float | None = None, busbw: float | None = None) -> float:
    """One all-reduce of ``size_bytes`` before any launch has timed one (CALL_MODEL)."""
    lat, bw = CALL_MODEL.get(spec.backend, CALL_MODEL["gloo"])
    lat, bw = latency_us if latency_us is not None else lat, busbw or bw
    ranks = max(2, int(spec.nproc_per_node or 2) * int(spec.nnodes or 1))
    return lat + size_bytes * 2.0 * (ranks - 1) / ranks / bw * 1e6


def size_s(spec, one_call_us: float, modes=None, vias=None) -> float:
    """Seconds a launch spends on one size whose all-reduce takes ``one_call_us``, in ``modes`` x ``vias``
    (default: the spec's), counted call by call as worker.py makes them."""
    plan = {"warmup": spec.warmup, "iters": spec.iters, "time_per_size_ms": spec.time_per_size_ms,
            "window_us": spec.window_us, "batch": spec.batch}
    modes, vias = list(modes or spec.modes), list(vias or spec.vias)
    budget = bool(spec.time_per_size_ms)
    warm = worker.warmup_count(plan, one_call_us)
    calls = 0
    for _ in vias:
        calls += 1 + ("graph" in modes)  # the correctness check (eager, and once in a graph)
        for mode in modes:
            if spec.backend != "nccl":  # gloo: warmup (one timed call first with a budget), batch-1 samples
                calls += max(1, warm) if budget else warm
                calls += worker.timed_count(plan, one_call_us)
                continue
            batch = worker._auto_batch(plan, one_call_us)
            n = worker.timed_count(plan, one_call_us * batch)
            if mode == "graph":
                probe = 0
                if plan["batch"] == "auto":  # with a budget two timed calls first; the probe graph unless one fills the window
                    long_call = budget and one_call_us >= float(spec.window_us)
                    probe = (2 if budget else 0) + (0 if long_call else 1 + worker.PROBE_BATCH * (1 + (1 if budget else 3)))
                elif budget:  # a fixed batch: one replay says a call's time
                    probe = batch
                calls += probe + 1 + max(1, -(-warm // batch)) * batch + (2 * batch if budget else 0) + n * batch
            else:
                calls += 1 + (max(1, warm) if budget else max(1, spec.warmup)) + n * batch
    return calls * one_call_us / 1e6


def measure_s(spec, modes=None, vias=None, sizes=None, **model) -> float:
    """Seconds of measuring in a launch of ``spec`` (every size, or ``sizes`` in bytes), each call's time
    from CALL_MODEL (``latency_us``/``busbw`` override it)."""
    sizes = sizes if sizes is not None else [s.bytes for s in spec.sizes]
    return sum(size_s(spec, call_us(spec, b, **model), modes, vias) for b in sizes)


def recorded(spec, method: str) -> Cost:
    """Before any launch: the recorded start-up of this backend and method, and the measuring counted from
    the call model."""
    start = STARTUP_S.get((spec.backend, method), STARTUP_S[(spec.backend, "torchrun")]
                          if (spec.backend, "torchrun") in STARTUP_S else 10.0)
    if spec.model or not spec.sizes:
        return Cost(start, None, "recorded", f"start-up {start:.2f} s a launch ({spec.backend}, {method}; "
                    "benchmarks/README.md); measuring known from the first launch")
    lat, bw = CALL_MODEL.get(spec.backend, CALL_MODEL["gloo"])
    measure = measure_s(spec)
    budget = (f"time_per_size_ms {spec.time_per_size_ms:g}" if spec.time_per_size_ms
              else "fixed counts (time_per_size_ms: null)")
    how = (f"measuring {measure:.1f} s: {series(spec)} series x {len(spec.sizes)} sizes, {budget}, a call "
           f"{lat:g} us + bytes over {bw / 1e9:g} GB/s (assumed: eta.CALL_MODEL) until the first launch has run")
    return Cost(start, measure, "recorded",
                f"start-up {start:.2f} s a launch ({spec.backend}, {method}; benchmarks/README.md); {how}")


def measured(run: dict) -> Cost | None:
    """From this run's finished launches (None before the first)."""
    done = [l for l in run.get("launches", []) if l.get("overhead_s") is not None and l.get("measure_s") is not None
            and int(l.get("stage", 1)) == 1]
    if not done:
        return None
    warm = [l for l in done if not l.get("starts_servers")]
    measure = _median([float(l["measure_s"]) for l in done])
    if not warm:  # only the launch that started the servers: its start-up is theirs, not a launch's
        key = ((run.get("spec") or {}).get("backend"), (run.get("launch") or {}).get("method"))
        start = STARTUP_S.get(key, 10.0)
        how = f"start-up {start:.2f} s recorded (the first launch's also started the launch servers)"
    else:
        start = max(0.0, _median([float(l["overhead_s"]) for l in warm]))
        how = (f"start-up {start:.2f} s (median of {len(warm)}"
               + (", leaving out the launch that started the launch servers)" if len(warm) < len(done) else ")"))
    return Cost(start, measure, "measured", f"this run's launches: {how}, measuring {measure:.2f} s a screening launch")


def stage2_share(spec, measure: dict | None) -> float:
    """The share of a stage-1 launch's series x sizes a stage-2 launch times (confirmation.measure)."""
    if not measure:
        return 1.0
    full = series(spec) * len(spec.sizes)
    part = len(measure.get("modes") or spec.modes) * len(measure.get("vias") or spec.vias) * len(
        measure.get("sizes") or spec.sizes)
    return min(1.0, part / max(full, 1))


def remaining_s(spec, run: dict, cost: Cost, launches: list[dict] | None = None,
                stage2_planned: int = 0) -> float | None:
    """Expected seconds for ``launches`` (default: run.json's pending ones) plus ``stage2_planned`` stage-2
    launches not appended yet (timed as the confirmation measures: its claims' series only)."""
    if cost.measure_s is None:
        return None
    pend = [l for l in run.get("launches", []) if l.get("status") == "pending"] if launches is None else launches
    share2 = stage2_share(spec, (run.get("confirmation") or {}).get("measure"))
    total = 0.0
    for l in pend:
        total += cost.launch_s(share2 if int(l.get("stage", 1)) == 2 else 1.0)
    if stage2_planned:
        total += stage2_planned * cost.launch_s(stage2_graph_share(spec))
    return total


def stage2_graph_share(spec) -> float:
    """Before screening: a stage-2 launch times one series (the primary mode, the first call path) at
    every band's sizes (stages.stage2_measure): its share of a screening launch's measuring, from the call
    model (graph mode costs more than eager), or 1/series where the model has no sizes to count."""
    if spec.model or not spec.sizes:
        return 1.0 / series(spec)
    full = measure_s(spec)
    return measure_s(spec, modes=spec.modes[:1], vias=spec.vias[:1]) / full if full > 0 else 1.0 / series(spec)
