"""sweeps/pcie8.yaml's wall time on 8 PCIe GPUs, estimated from measured components (#31).

    .venv/bin/python benchmarks/pcie8_estimate.py

Components:
- start-up per launch (wall minus measuring; nccl's default is forkserver since 2026-12-04): 1x H200, 2026-12-02 (benchmarks/README.md): forkserver 1.55 s,
  torchrun 9.73 s (median of 5 after the first launch); commdiag/measure/eta.py STARTUP_S;
- measuring: per size, mode and call path (warmup + count) samples of max(window_us, one call); count =
  iters, or with time_per_size_ms as many as fit the budget, 20..iters (worker.timed_count).  This
  reproduces 2x H200's measured 6.9 s a launch for nvlink2 (window-bound: every sample >= 500 us).
  A call on 8 PCIe GPUs is 30 us + bytes x 2(n-1)/n / busbw; busbw 10-25 GB/s is an assumption (no
  8-GPU PCIe box measured yet): the range it gives is printed;
- launches: 81 screening (27 configs x 3 trials; racing only removes launches, so none are removed
  here) and at most 70 stage-2 launches (14 rounds x 5 configs, `commdiag sweep sweeps/pcie8.yaml
  --dry-run`), each timing one series (graph via torch) at every size.
"""

from __future__ import annotations

import math

TOKENS = [1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
STARTUP = {"forkserver": 1.55, "torchrun": 9.73}


def measure_s(busbw: float, budget_s: float | None, series: int = 4, iters: int = 200, warmup: int = 20,
              window_s: float = 500e-6, ranks: int = 8) -> float:
    total = 0.0
    for t in TOKENS:
        call = 30e-6 + t * 7168 * 2 * 2 * (ranks - 1) / ranks / busbw
        sample = max(window_s, call)
        n = iters if budget_s is None else max(20, min(iters, math.ceil(budget_s / sample)))
        total += (warmup + n) * sample
    return total * series


def main() -> None:
    print("pcie8 on 8 PCIe GPUs: 81 screening launches + at most 70 stage-2 launches")
    for method in ("forkserver", "torchrun"):
        for budget in (0.25, None):
            mins = []
            for bw in (25e9, 10e9):
                m1, m2 = measure_s(bw, budget), measure_s(bw, budget, series=1)
                mins.append((81 * (STARTUP[method] + m1) + 70 * (STARTUP[method] + m2)) / 60)
            print(f"  launch {method:10} time_per_size_ms {'250' if budget else 'null':4}: "
                  f"{mins[0]:.0f}-{mins[1]:.0f} min (busbw 25-10 GB/s; screening launch measuring "
                  f"{measure_s(25e9, budget):.1f}-{measure_s(10e9, budget):.1f} s)")


if __name__ == "__main__":
    main()
