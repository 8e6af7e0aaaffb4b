"""The tables of docs/verdicts.md, from the simulation of tests/test_certify_simulation.py.

1. A/A false-certification rate per launch model, stage 2 judged by the paired within-round
   signed-rank test (shipped) and by the unpaired rank test it replaced (same draws).
2. Power: the share of runs that certify a true band effect (3%, 5%, 10%) at 0.3-10% launch noise,
   with 0, 2 and 5% drift over the run, at the planned k2 (two screening claims: M = 2, one-sided:
   11 rounds since looks spend alpha/2 first and 2 spare rounds are planned), and the "about N
   launches per arm for 80% power" commdiag prints at that noise.

Runs on CPU in about a minute: python benchmarks/paired_power.py [--runs 2000]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import test_certify_simulation as sim  # noqa: E402  (the simulation the tests run)

from commdiag.analyse import certify, paired  # noqa: E402
from commdiag.analyse.stats import ALPHA, LESS  # noqa: E402


def aa_table(runs: int) -> None:
    print(f"A/A: share of runs with any false certification ({runs} runs each; bound 1%)")
    print(f"{'model':<22} {'shape':<9} {'paired':>7} {'unpaired':>9}")
    for model in sim.MODELS:
        for shape, named in (("3x3", (1,)), ("26x15x4", ())):
            seed = 1000 * sim.MODELS.index(model) + list(sim.SHAPES).index(shape)
            a, _, _ = sim.simulate(model, shape, seed, named=named, runs=runs)
            b, _, _ = sim.simulate(model, shape, seed, named=named, runs=runs, unpaired=True)
            print(f"{model:<22} {shape:<9} {sum(map(bool, a)) / runs:>7.2%} {sum(map(bool, b)) / runs:>9.2%}")


def power_table(runs: int) -> None:
    thr = certify.threshold(ALPHA, 2)
    print(f"\nPower: share of runs certifying a true effect in the decode band (3x3 shape: 2 sizes; M = 2 "
          f"one-sided, k2 = {sim.k2_of([(1, 'decode', LESS), (1, 'prefill', LESS)])} rounds; {runs} runs), and the "
          "N printed for 80% at that noise")
    print(f"{'effect':>6} {'noise':>6} {'drift 0%':>9} {'drift 2%':>9} {'drift 5%':>9} {'printed N':>10}")
    for eff in (3, 5, 10):
        for noise in (0.003, 0.01, 0.03, 0.10):
            row = []
            for drift in (0, 2, 5):
                effect = np.zeros(3)
                effect[1] = math.log(1 - eff / 100)
                s = sim.Sim("lognormal", "3x3", 11 + eff + int(noise * 1000) + drift, effect, runs=runs,
                            noise=noise, drift=drift)
                certified, _, _ = sim.judge(s, sim.plan_runs(s.x1, s.tokens, ()))
                row.append(np.mean([(1, "decode", "faster") in c for c in certified]))
            sd_d = math.sqrt(2 * (noise ** 2 + sim.PER_SIZE_SD ** 2 / 2))
            n = paired.rounds_for_power(sd_d, -math.log(1 - eff / 100), thr, LESS)
            print(f"{eff:>5}% {noise:>6.1%} {row[0]:>9.1%} {row[1]:>9.1%} {row[2]:>9.1%} "
                  f"{'-' if n is None else n:>10}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2000)
    args = ap.parse_args()
    t = time.perf_counter()
    aa_table(args.runs)
    power_table(args.runs)
    print(f"\n({time.perf_counter() - t:.0f} s)")


if __name__ == "__main__":
    main()
