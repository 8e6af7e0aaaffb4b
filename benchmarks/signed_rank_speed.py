"""How fast stage 2's exact p is: commdiag.analyse.paired at 200 rounds, against references timed in the
same run on the same machine.

- scipy.stats.wilcoxon(method="exact"): scipy's own exact signed-rank distribution (no ties only);
- the 2^n sign-pattern enumeration stage 2 used before (stats.signflip_test, removed), timed at 14-18
  rounds and extrapolated (it doubles per round): about an hour per claim at 30 rounds.

Cold: the distribution is computed (the DP over rank sums); warm: cached, as for every further claim with
the same number of rounds.  Ties: a tie pattern is its own distribution (never cached across patterns).
Target: under 50 ms cold at 200 rounds.  python benchmarks/signed_rank_speed.py
"""

from __future__ import annotations

import itertools
import time

import numpy as np
from scipy.stats import wilcoxon

from commdiag.analyse import paired


def best_of(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def old_enumeration(d) -> float:
    """The removed stats.signflip_test, verbatim in what it computed (two-sided)."""
    obs = sum(d)
    hits = 0
    for signs in itertools.product((1, -1), repeat=len(d)):
        s = sum(a * b for a, b in zip(signs, d))
        hits += abs(s) >= abs(obs) - 1e-12
    return hits / 2 ** len(d)


def cold(d):
    paired._pmf.cache_clear()
    paired._tails.cache_clear()
    return paired.signed_rank_p(d)


def main() -> None:
    rng = np.random.default_rng(200)
    d = rng.normal(0.05, 1.0, 200)
    ties = d.copy()
    ties[:20] = np.round(ties[:20], 1)  # a few tied |d|
    print(f"n = 200 rounds: p = {paired.signed_rank_p(d):.6g} (scipy exact: {wilcoxon(d, method='exact').pvalue:.6g})")
    t_cold = best_of(lambda: cold(d))
    t_warm = best_of(lambda: paired.signed_rank_p(d))
    t_ties = best_of(lambda: cold(ties))
    t_scipy = best_of(lambda: wilcoxon(d, method="exact"))
    print(f"commdiag paired, cold (DP over rank sums):     {t_cold * 1e3:8.1f} ms   (target < 50 ms)")
    print(f"commdiag paired, warm (distribution cached):   {t_warm * 1e3:8.1f} ms")
    print(f"commdiag paired, with ties (own DP):          {t_ties * 1e3:8.1f} ms")
    print(f"reference: scipy.stats.wilcoxon exact:        {t_scipy * 1e3:8.1f} ms")
    per = []
    for n in (14, 16, 18):
        x = list(rng.normal(0.05, 1.0, n))
        s = best_of(lambda: old_enumeration(x), 1)
        per.append(s / 2 ** n)
        print(f"reference: old 2^n enumeration at n = {n}:     {s * 1e3:8.1f} ms")
    unit = min(per)
    print(f"old enumeration extrapolated: n = 30 about {unit * 2 ** 30 / 60:.0f} min; n = 200 about "
          f"{unit * 2 ** 200 / 3.15e7:.1e} years")
    print("OK" if t_cold < 0.05 else "SLOWER THAN THE 50 ms TARGET")


if __name__ == "__main__":
    main()
