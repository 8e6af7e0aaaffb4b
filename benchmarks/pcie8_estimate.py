"""sweeps/pcie8.yaml's wall time on 8 PCIe GPUs, estimated from measured components (#31).

    .venv/bin/python benchmarks/pcie8_estimate.py

One model, the one the start banner and ``commdiag sweep --dry-run`` use (commdiag/measure/eta.py):
- start-up per launch (wall minus measuring): eta.STARTUP_S, measured on 1x H200 (benchmarks/README.md
  2026-12-02: forkserver 1.55 s, torchrun 9.73 s, median of 5 after the first launch), and the launch
  servers' one-time start (eta.SERVER_START_S);
- measuring: eta.measure_s counts every call worker.py makes per size and mode (the correctness check,
  graph mode's probe, the warmup, the calibration, the timed samples; with ``time_per_size_ms`` the
  counts worker.timed_count and worker.warmup_count give), each call 30 us + a ring all-reduce's bytes
  per rank over the bus bandwidth.  No 8-GPU PCIe box has run yet: the bus bandwidth is the assumption,
  10-25 GB/s (PCIe Gen4 x16 through the host bridges at the slow end), and the range it gives is printed;
- launches: 81 screening (27 configs x 3 trials; racing only removes launches, so none are removed here)
  and at most stage2_at_most(spec) stage-2 launches, each timing one series (graph via torch) at every size.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from commdiag.formats.spec import load_spec  # noqa: E402
from commdiag.measure import eta, stages  # noqa: E402

SPEC = Path(__file__).resolve().parents[1] / "sweeps" / "pcie8.yaml"


def minutes(spec, method: str, busbw: float) -> tuple[float, float, float]:
    """(minutes in all, seconds of measuring a screening launch, a stage-2 launch)."""
    n1, n2 = len(spec.configs) * spec.trials, stages.stage2_at_most(spec)
    m1 = eta.measure_s(spec, busbw=busbw)
    m2 = eta.measure_s(spec, modes=spec.modes[:1], vias=spec.vias[:1], busbw=busbw)
    start = eta.STARTUP_S[(spec.backend, method)]
    serv = eta.SERVER_START_S[spec.backend] if method == "forkserver" else 0.0
    return (serv + n1 * (start + m1) + n2 * (start + m2)) / 60, m1, m2


def main() -> None:
    base = load_spec(SPEC)
    n1, n2 = len(base.configs) * base.trials, stages.stage2_at_most(base)
    print(f"pcie8 on 8 PCIe GPUs: {n1} screening launches + at most {n2} stage-2 launches; "
          f"{len(base.sizes)} sizes x modes {list(base.modes)} x vias {list(base.vias)}")
    for method in ("forkserver", "torchrun"):
        for sets in ([], ["time_per_size_ms=null"], ["vias=[torch, nccl-direct]"]):
            spec = load_spec(SPEC, [f"launch={method}", *sets])
            fast, slow = minutes(spec, method, 25e9), minutes(spec, method, 10e9)
            label = " ".join(sets) or f"as shipped (time_per_size_ms {spec.time_per_size_ms:g})"
            print(f"  launch {method:10} {label:38}: {fast[0]:.1f}-{slow[0]:.1f} min (busbw 25-10 GB/s; "
                  f"measuring {fast[1]:.1f}-{slow[1]:.1f} s a screening launch, {fast[2]:.1f}-{slow[2]:.1f} s stage 2)")
    print(f"  eta.PCIE8_ESTIMATE (quoted by the README, --help and the spec): {eta.PCIE8_ESTIMATE}")


if __name__ == "__main__":
    main()
