"""The result of ``commdiag trace``: per rank and step the GPU time split, the collectives' sizes and what
NCCL chose for them, the straggler per step, the one-line answer; and its versioned JSON
(``commdiag-trace``).

Format history of the ``commdiag-trace`` JSON (bump TRACE_VERSION on any incompatible change):
    1  first version: ``headline``, ``verdict``, ``typical`` (shares of a typical step), ``ranks``
       [{rank, path, world_size, nccl_version, device, step_source, steps [{index, name, start_us,
       split {...}}], sizes [...], notes}], ``stragglers``, ``savings`` (with --sweep), ``notes``.
Times are microseconds of GPU time; shares are fractions of the step (0..1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

TRACE_FORMAT = "commdiag-trace"
TRACE_VERSION = 1

# Verdicts: where the time of a typical step is.
LAUNCH_BOUND, COMM_BOUND, COMPUTE_BOUND, MEMORY_BOUND, IDLE_OTHER = (
    "launch-bound", "communication-bound", "compute-bound", "memory-copy-bound", "idle")


@dataclass(frozen=True)
class Split:
    """One step's GPU time, split into parts that add up to ``step_us``: compute, exposed communication
    (NCCL and custom all-reduce kernels while no compute kernel runs), exposed memory copies, idle.

    ``comm_us`` is all communication time (exposed + overlapped with compute); ``host_idle_us`` the part
    of ``idle_us`` where the GPU had nothing queued because the CPU had not launched the next kernel
    yet (HTA's host_wait); ``by_collective`` per collective (AllReduce, ...): (name, us, exposed_us)."""

    step_us: float
    compute_us: float
    comm_exposed_us: float
    memory_us: float
    idle_us: float
    comm_us: float
    comm_overlapped_us: float
    host_idle_us: float
    kernels: int
    by_collective: tuple = ()

    def share(self, what: str) -> float:
        return getattr(self, what) / self.step_us if self.step_us > 0 else 0.0

    def to_json(self) -> dict:
        return {"step_us": round(self.step_us, 3), "compute_us": round(self.compute_us, 3),
                "comm_exposed_us": round(self.comm_exposed_us, 3), "memory_us": round(self.memory_us, 3),
                "idle_us": round(self.idle_us, 3), "comm_us": round(self.comm_us, 3),
                "comm_overlapped_us": round(self.comm_overlapped_us, 3), "host_idle_us": round(self.host_idle_us, 3),
                "kernels": self.kernels,
                "by_collective": [{"collective": c, "us": round(us, 3), "exposed_us": round(ex, 3)}
                                  for c, us, ex in self.by_collective]}


@dataclass(frozen=True)
class Step:
    index: int  # 0.. in the order the steps ran on this rank
    name: str  # the annotation's name (ProfilerStep#12, decode_step_3) or "graph replay N"
    start_us: float  # the step's first GPU activity, on the trace's clock
    split: Split
    cpu_us: float | None = None  # the CPU annotation's duration (None for graph replays / the whole trace)
    segments: tuple = field(default=(), compare=False, repr=False)  # (start, end, part) for the timeline picture

    def to_json(self) -> dict:
        return {"index": self.index, "name": self.name, "start_us": round(self.start_us, 3),
                "cpu_us": None if self.cpu_us is None else round(self.cpu_us, 3), "split": self.split.to_json()}


@dataclass(frozen=True)
class Size:
    """One message size of one collective on one rank: how often, how long, what NCCL chose."""

    collective: str
    dtype: str  # torch's name from record_param_comms ("BFloat16"), or the kernel name's ("bfloat16")
    nelems: int | None  # None: the trace does not say (CUDA graph replays record no record_param_comms)
    bytes: int | None
    algorithm: str
    protocol: str
    count: int
    total_us: float
    median_us: float
    group_size: int | None = None

    def to_json(self) -> dict:
        return {"collective": self.collective, "dtype": self.dtype, "nelems": self.nelems, "bytes": self.bytes,
                "algorithm": self.algorithm, "protocol": self.protocol, "count": self.count,
                "total_us": round(self.total_us, 3), "median_us": round(self.median_us, 3),
                "group_size": self.group_size}


@dataclass(frozen=True)
class RankTrace:
    rank: int
    path: str
    world_size: int | None
    nccl_version: str | None
    device: str | None
    step_source: str  # how the steps were found (docs/trace.md, "Steps")
    steps: tuple
    sizes: tuple
    notes: tuple = ()

    def typical(self) -> Step:
        """The step of median duration (the lower median): a first step's warm-up wait never sets it."""
        order = sorted(self.steps, key=lambda s: (s.split.step_us, s.index))
        return order[(len(order) - 1) // 2]

    def to_json(self) -> dict:
        return {"rank": self.rank, "path": self.path, "world_size": self.world_size, "nccl_version": self.nccl_version,
                "device": self.device, "step_source": self.step_source, "typical_step": self.typical().index,
                "steps": [s.to_json() for s in self.steps], "sizes": [s.to_json() for s in self.sizes],
                "notes": list(self.notes)}


@dataclass(frozen=True)
class Straggler:
    """Step ``index`` across ranks: the slowest rank and by how much; the rank the others waited for
    (the least time inside collectives: it arrived last) and how long the others waited at most."""

    index: int
    slowest_rank: int
    slowest_us: float
    fastest_rank: int
    fastest_us: float
    late_rank: int | None
    waited_us: float

    @property
    def excess(self) -> float:
        return self.slowest_us / self.fastest_us - 1 if self.fastest_us > 0 else 0.0

    def to_json(self) -> dict:
        return {"index": self.index, "slowest_rank": self.slowest_rank, "slowest_us": round(self.slowest_us, 3),
                "fastest_rank": self.fastest_rank, "fastest_us": round(self.fastest_us, 3),
                "excess": round(self.excess, 4), "late_rank": self.late_rank, "waited_us": round(self.waited_us, 3)}


@dataclass(frozen=True)
class Saving:
    """What a sweep's certified winner of one band would save of the typical step at most."""

    band: str
    mode: str
    config: str | None  # None: no certified winner in this band (keep NCCL defaults)
    ratio: float | None
    sizes: tuple  # the trace's message sizes (bytes) in the band
    band_share: float  # the band's communication time / step (all ranks' typical steps, mean)
    at_most: float  # (1 - ratio) x band_share; 0 without a winner
    note: str = ""

    def to_json(self) -> dict:
        return {"band": self.band, "mode": self.mode, "config": self.config, "ratio": self.ratio,
                "sizes": list(self.sizes), "band_share": round(self.band_share, 5), "at_most": round(self.at_most, 5),
                "note": self.note}


@dataclass(frozen=True)
class TraceReport:
    headline: str
    verdict: str
    typical: dict  # shares of a typical step, mean over ranks: compute, comm, comm_exposed, memory, idle, host_idle
    ranks: tuple
    stragglers: tuple
    savings: tuple | None = None
    sweep: str | None = None
    notes: tuple = ()

    def to_json(self) -> dict:
        return {"format": TRACE_FORMAT, "version": TRACE_VERSION, "headline": self.headline, "verdict": self.verdict,
                "typical": {k: round(v, 5) for k, v in self.typical.items()},
                "ranks": [r.to_json() for r in self.ranks], "stragglers": [s.to_json() for s in self.stragglers],
                "sweep": self.sweep, "savings": None if self.savings is None else [s.to_json() for s in self.savings],
                "notes": list(self.notes)}
