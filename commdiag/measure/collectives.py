"""The collective's math, in one small place (as nccl-tests keeps it).

All-reduce moves ``size`` bytes per rank; algbw = size / time, and the bus
bandwidth, comparable across rank counts and with ``all_reduce_perf``, is
algbw * 2(n-1)/n.
"""

from __future__ import annotations

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4}


def allreduce_busbw_factor(nranks: int) -> float:
    return 2.0 * (nranks - 1) / nranks if nranks > 0 else 0.0


def algbw_gbps(size_bytes: int, time_us: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes/s, as nccl-tests prints)."""
    return size_bytes / (time_us * 1e-6) / 1e9 if time_us > 0 else float("nan")


def busbw_gbps(size_bytes: int, time_us: float, nranks: int) -> float:
    return algbw_gbps(size_bytes, time_us) * allreduce_busbw_factor(nranks)


def fill_value(rank: int, index_mod: int) -> int:
    """Rank ``rank``'s element value at position i (index_mod = i % 4): small integers, so
    the sum over up to ~60 ranks stays exactly representable even in bfloat16 (8 bits of
    mantissa: integers up to 256 are exact)."""
    return index_mod + (rank % 3) + 1


def expected_sum(nranks: int, index_mod: int) -> int:
    return sum(fill_value(r, index_mod) for r in range(nranks))
