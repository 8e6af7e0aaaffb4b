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
benchmarks/README.md, per backend and launch method (``STARTUP_S``), and per size the time budget:
with ``time_per_size_ms`` each size x mode x call path is timed for about the budget (worker.timed_count:
as many samples as fit, at least 20, at most ``iters``), so the measuring of a launch is at most
``series x sizes x budget`` plus the warmup (WARMUP_SHARE of it), and less where ``iters`` samples take
less than the budget (small messages); fixed counts (``time_per_size_ms: null``) have no bound before a
launch has measured them.
"""

from __future__ import annotations

from dataclasses import dataclass

# Start-up per launch (seconds), recorded: nccl on 1x H200 (benchmarks/README.md 2026-12-02, median of
# 5 after the first: forkserver 1.55 s, torchrun 9.73 s); gloo on the 2-core development machine
# (benchmarks/forkserver_cpu.txt 2026-12-02: forkserver 1.54 s, torchrun 21.9 s at load 5-7).
STARTUP_S = {("nccl", "forkserver"): 1.55, ("nccl", "torchrun"): 9.73,
             ("gloo", "forkserver"): 1.54, ("gloo", "torchrun"): 21.9}
# The launch servers' one-time start, added once per command that uses them (first launch of 1x H200:
# 4.79 s against 1.55 s after it).
SERVER_START_S = {"nccl": 3.2, "gloo": 1.0}
# sweeps/pcie8.yaml on 8 PCIe GPUs as shipped (nccl: launch forkserver), from these components, the time
# budget and the planned launches (benchmarks/pcie8_estimate.py; 41-47 min with launch: torchrun).  The
# README, --help and the spec's comment quote it (tests/test_plan_eta.py).
PCIE8_ESTIMATE = "20-26 min"
WARMUP_SHARE = 0.1  # warmup + calibration: 20 calls against a budget's worth (a 20 ms call: 0.4 s of 0.25 s + ...)


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


def recorded(spec, method: str) -> Cost:
    """Before any launch: the recorded start-up of this backend and method, and the time budget."""
    start = STARTUP_S.get((spec.backend, method), STARTUP_S[(spec.backend, "torchrun")]
                          if (spec.backend, "torchrun") in STARTUP_S else 10.0)
    cells = series(spec) * len(spec.sizes)
    if spec.time_per_size_ms:
        measure = cells * spec.time_per_size_ms / 1000.0 * (1 + WARMUP_SHARE)
        how = (f"measuring at most {series(spec)} series x {len(spec.sizes)} sizes x {spec.time_per_size_ms:g} ms "
               f"budget (+{WARMUP_SHARE:.0%} warmup), less where small messages reach iters first")
    else:
        measure, how = None, "fixed counts (time_per_size_ms: null): measuring time known from the first launch"
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
    """Before screening: a stage-2 launch times one series (the primary mode, one call path) at every
    band's sizes (sweep._stage2_measure), so 1/series of a screening launch."""
    return 1.0 / series(spec)
