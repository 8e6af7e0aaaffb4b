"""Stage 2's test: the exact Wilcoxon signed-rank test on within-round log-ratios.  Pure, no I/O.

Why paired.  Stage 2 randomizes within rounds: each round runs default and every
claimed config once, in a shuffled order.  Under "no effect" that shuffle makes
exactly one thing a coin flip: which of a round's two launches carried the config
and which carried default.  So the unit is the round: per complete round,
d = ln(config's value) - ln(default's value), and under no effect every d is as
likely positive as negative, independently across rounds, whatever the machine
does between rounds (drift), at a position inside a round (the first launch after
idle, alternate launches, every later launch slower) or however the launch noise
is shaped.  The signed-rank test is exact for exactly that.  The unpaired rank test
that stage 2 used before treats all launches as exchangeable, which the design does
not give: with position effects it certified A/A twins in up to 3.9% of runs, and
it certified a config that was only noisier, not slower.

Statistic.  W = the sum of the ranks of |d| over the rounds whose d is positive.
"less" (the config is faster): p = P(W <= w); two-sided: p = P(|W - E W| >= |w - E W|).

Zeros and ties, exactly and conservatively.  |d| below ZERO_TOL (1e-12 in ln units,
far below any timing resolution: it only absorbs floating-point rounding) is a zero:
that round carries no sign and is left out (Wilcoxon's rule; the reported p and its
floor use the rounds that remain).  |d| within ZERO_TOL of each other are tied and get
their mid-rank.  The null distribution is then the conditional one given the tie
pattern: every sign pattern of the remaining rounds equally likely, computed by the
same dynamic programme over doubled mid-ranks (integers).  Conditional on the
observed |d|, that is the exact distribution under no effect, so p <= t happens with
probability at most t: no approximation, no continuity correction.

Speed.  The distribution is a dynamic programme over the rank sum: one pass per round,
each adding a shifted copy of the running distribution (O(n * n(n+1)/2)), in float64
(each step halves: no overflow, every probability exact to about 1e-13 relative).  At 200
rounds it takes about 10 ms (benchmarks/signed_rank_speed.txt), where enumerating the 2^n
sign patterns took about an hour per claim at 30 rounds.

Effect.  The Hodges-Lehmann estimate of the paired log-ratios, the median of the
Walsh averages (d_i + d_j) / 2 over i <= j, from the same rounds as p; its exact
confidence interval comes from the same null distribution (the c-th smallest and
largest Walsh averages), so the interval excludes 0 exactly when p reaches its level.

Power.  ``rounds_for_power``: about how many rounds give 80% power to certify an
effect (p <= threshold and the Hodges-Lehmann ratio beyond 3%) when the round
log-ratios have sd ``sd``: the exact test's rejection region from the distribution
above, its power by a fixed-seed simulation of normal d for up to POWER_MC_MAX rounds
and by the asymptotic relative efficiency 3/pi beyond, times the chance that the
estimate clears the 3% rule.  tests/test_certify_simulation.py checks it against
simulated runs (within 20%).
"""

from __future__ import annotations

import math
from functools import lru_cache

from .exact import normal_cdf, normal_isf, normal_ppf
from .stats import LESS, MIN_EFFECT, POWER, TWO_SIDED

ZERO_TOL = 1e-12  # |d| (ln units) below this is a zero; |d| closer than this are tied
POWER_MC_MAX = 40  # up to this many rounds the power is simulated (the test's discreteness matters)
POWER_DRAWS = 4000  # simulated round sets per power estimate (sd of an 80% estimate: 0.6%)
POWER_SEED = 20261130
MAX_ROUNDS = 10 ** 6  # beyond this, "cannot be certified at any cost" (power searches stop)
# the practical-effect rule in ln units: ratio <= 0.97 (faster) is ln below -FASTER_EDGE
FASTER_EDGE = -math.log(1 - MIN_EFFECT)


# ---------------------------------------------------------------- the null distribution

@lru_cache(maxsize=1024)
def _pmf(scores: tuple[int, ...]):
    """P(sum of the scores whose sign is + = t) for t = 0..sum(scores), each sign a fair coin."""
    import numpy as np

    total = sum(scores)
    p = np.zeros(total + 1)
    p[0] = 1.0
    reach = 0
    for s in scores:  # one more round: half the patterns add its score (each step halves: no overflow)
        reach += s
        np.add(p[s: reach + 1], p[: reach + 1 - s], out=p[s: reach + 1])  # numpy buffers the overlap
        p[: reach + 1] *= 0.5
    p.setflags(write=False)
    return p


@lru_cache(maxsize=1024)
def _tails(scores: tuple[int, ...]):
    """(P(T <= t), P(T >= t)) for every t of the distribution of ``scores``."""
    import numpy as np

    p = _pmf(scores)
    lower = np.cumsum(p)
    upper = np.cumsum(p[::-1])[::-1]
    np.clip(lower, 0.0, 1.0, out=lower)
    np.clip(upper, 0.0, 1.0, out=upper)
    lower.setflags(write=False)
    upper.setflags(write=False)
    return lower, upper


def _plain(n: int) -> tuple[int, ...]:
    return tuple(range(1, n + 1))


def _p_from(t: int, scores: tuple[int, ...], alternative: str) -> float:
    lower, upper = _tails(scores)
    if alternative == LESS:
        return float(lower[t])
    if alternative == "greater":
        return float(upper[t])
    return float(min(1.0, 2.0 * min(lower[t], upper[t])))  # the distribution is symmetric about its mean


def _scores_of(d) -> tuple[tuple[int, ...], int]:
    """One row: (the doubled mid-ranks of |d| over non-zero d, divided by their gcd; the statistic
    T on the same scale: the sum of the scores of positive d)."""
    import numpy as np

    d = np.asarray(d, dtype=float)
    d = d[np.abs(d) >= ZERO_TOL]
    if d.size == 0:
        return (), 0
    a = np.abs(d)
    order = np.argsort(a, kind="stable")
    s = a[order]
    doubled = np.empty(len(s), dtype=np.int64)
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] - s[j] < ZERO_TOL:
            j += 1
        doubled[i: j + 1] = (i + 1) + (j + 1)  # twice the mid-rank of ranks i+1..j+1
        i = j + 1
    score = np.empty_like(doubled)
    score[order] = doubled
    g = int(np.gcd.reduce(score))
    score //= g
    t = int(score[d > 0].sum())
    return tuple(sorted(int(v) for v in score)), t


# ---------------------------------------------------------------- the test

def signed_rank_p(d, alternative: str = TWO_SIDED):
    """Exact signed-rank p of paired log-ratios ``d`` (config minus default per round; ``less``: the
    config is faster).  Vectorised: ``d`` may be 2-D (claims x rounds); returns a float or an array.
    Rows without zeros or ties use the cached distribution of n rounds; others their own (module docstring)."""
    import numpy as np

    arr = np.asarray(d, dtype=float)
    if not np.isfinite(arr).all():  # a NaN would rank as the largest negative round, an inf as the largest
        raise ValueError("signed_rank_p: every log-ratio must be finite (a missing or failed round is left "
                         "out or given a value by the caller, never NaN or inf)")
    rows = np.atleast_2d(arr)
    out = np.ones(rows.shape[0])
    n = rows.shape[1]
    if n:
        a = np.abs(rows)
        srt = np.sort(a, axis=1)
        plain = (srt[:, 0] >= ZERO_TOL) & ~(np.diff(srt, axis=1) < ZERO_TOL).any(axis=1)
        if plain.any():
            ranks = np.argsort(np.argsort(a[plain], axis=1), axis=1) + 1
            t = np.where(rows[plain] > 0, ranks, 0).sum(axis=1)
            lower, upper = _tails(_plain(n))
            if alternative == LESS:
                out[plain] = lower[t]
            elif alternative == "greater":
                out[plain] = upper[t]
            else:
                out[plain] = np.minimum(1.0, 2.0 * np.minimum(lower[t], upper[t]))
        for i in np.flatnonzero(~plain):
            scores, t = _scores_of(rows[i])
            out[i] = _p_from(t, scores, alternative) if scores else 1.0
    return float(out[0]) if arr.ndim <= 1 else out


def nonzero_rounds(d) -> int:
    """The rounds that carry a sign (|d| >= ZERO_TOL): what the test's p and floor are over."""
    return sum(1 for v in d if abs(v) >= ZERO_TOL)


def smallest_p(n: int, alternative: str = TWO_SIDED) -> float:
    """The smallest p the test can give with n rounds (every round the same sign): 1/2^n, 2/2^n two-sided."""
    if n < 1:
        return 1.0
    return min(1.0, (2.0 if alternative == TWO_SIDED else 1.0) / 2.0 ** n)


def rounds_to_reach(threshold: float, alternative: str = TWO_SIDED) -> int:
    """The fewest rounds at which the test can reach ``threshold`` at all."""
    n = 1
    while smallest_p(n, alternative) > threshold:
        n += 1
    return n


def critical_count(n: int, level: float) -> int | None:
    """The largest c with P(W <= c) <= level for n rounds without ties (None: not even c = 0)."""
    import numpy as np

    lower, _ = _tails(_plain(n))
    ok = np.flatnonzero(lower <= level * (1 + 1e-12))
    return int(ok[-1]) if ok.size else None


# ---------------------------------------------------------------- the effect

def _walsh(d):
    import numpy as np

    d = np.asarray(d, dtype=float)
    i, j = np.triu_indices(d.shape[-1])
    return (d[..., i] + d[..., j]) / 2.0


def hodges_lehmann(d):
    """Median of the Walsh averages of ``d`` (ln): the paired shift estimate matching the test.
    Vectorised over leading axes; returns a float or an array."""
    import numpy as np

    hl = np.median(_walsh(d), axis=-1)
    return float(hl) if np.ndim(hl) == 0 else hl


def interval(d, tail: float) -> tuple[float, float] | None:
    """Exact interval for the paired shift: between the (c+1)-th smallest and largest Walsh
    averages, c the critical count of ``tail`` (its coverage is at least 1 - 2 * tail; without
    ties exactly the test's duality: the upper end is below 0 iff the one-sided p <= tail).
    None when the rounds are too few for that level.

    With zeros or ties among the d (a coarsely printed metric, a failed launch's stand-in value) the
    untied critical count no longer matches the p, which drops zeros and uses the tie pattern's own
    distribution: the interval is then the test inverted, every shift x whose d - x the same exact p
    (``signed_rank_p``, zeros and ties as it treats them) does not reject at ``tail`` (``_inverted``)."""
    import numpy as np

    d = np.asarray(d, dtype=float)
    n = len(d)
    if n and _tied(d):
        return _inverted(d, tail)
    c = critical_count(n, tail) if n else None
    if c is None:
        return None
    w = np.sort(_walsh(d))
    return float(w[c]), float(w[len(w) - 1 - c])


def _tied(d) -> bool:
    """Zeros or ties among the |d| (what makes the p use its own distribution)."""
    import numpy as np

    a = np.sort(np.abs(d))
    return bool(a[0] < ZERO_TOL or (np.diff(a) < ZERO_TOL).any())


def _inverted(d, tail: float) -> tuple[float, float] | None:
    """The shifts not rejected one-sided at ``tail`` on either side, on the grid where the statistic
    can change (the distinct Walsh averages and the midpoints between them), found by bisection (the
    p of d - x falls as x rises, on the "less" side, and the other way on the "greater" side).  The
    upper end is the last Walsh average before the first rejected grid point, the lower end likewise
    from below: the closure of the accepted set.  None when even the most extreme shift is not
    rejected (too few signed rounds for that level)."""
    import numpy as np

    w = np.unique(_walsh(d))
    span = float(w[-1] - w[0]) or 1.0
    grid = np.empty(2 * len(w) + 1)
    grid[0] = w[0] - span  # beyond every Walsh average: every d - x of one sign
    grid[1:-1:2] = w
    grid[2:-1:2] = (w[:-1] + w[1:]) / 2
    grid[-1] = w[-1] + span

    def first(reject) -> int | None:  # the first grid index (from the given end) that rejects
        if not reject(len(grid) - 1):
            return None
        lo, hi = 0, len(grid) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if reject(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    up = first(lambda i: signed_rank_p(d - grid[i], LESS) <= tail)
    down = first(lambda i: signed_rank_p(d - grid[len(grid) - 1 - i], "greater") <= tail)
    if up is None or down is None:
        return None
    down = len(grid) - 1 - down
    hi = grid[up] if up % 2 == 1 else grid[up - 1]  # a Walsh average, or the one left of a midpoint
    lo = grid[down] if down % 2 == 1 else grid[down + 1]
    return float(lo), float(hi)


# A failed launch (timed out, crashed, wrong sums) is evidence against its config: it stands in as
# twice the worst value either arm reached in the comparison (FAILED_FACTOR), so that a config whose
# slow launches time out is not judged on its good ones alone.  Taken from both arms together, it does
# not depend on which arm a round's launches carried: under no effect, a failure is as likely in
# either place, and the test stays exact.
FAILED_FACTOR = 2.0


def with_failures(x: dict, y: dict, worse: int = 1) -> tuple[list[int], list[float], int]:
    """Round -> ln value (None: the launch failed) of a config (x) and default (y) as paired log-ratios:
    (rounds, d, rounds where both failed, left out: no sign).  A failed launch counts as the worst value
    of both arms' successful launches, times FAILED_FACTOR in the bad direction (``worse`` +1: higher
    is worse, as times; -1: lower is worse, as throughput)."""
    seen = [v for v in list(x.values()) + list(y.values()) if v is not None]
    if not seen:
        return [], [], sum(1 for r in set(x) & set(y))
    worst = (max(seen) if worse > 0 else min(seen)) + worse * math.log(FAILED_FACTOR)
    rounds, d, both = [], [], 0
    for r in sorted(set(x) & set(y)):
        a, b = x[r], y[r]
        if a is None and b is None:
            both += 1
            continue
        rounds.append(r)
        d.append((worst if a is None else a) - (worst if b is None else b))
    return rounds, d, both


# ---------------------------------------------------------------- power

@lru_cache(maxsize=64)
def _unit_draws(n: int):
    import numpy as np

    return np.random.default_rng(POWER_SEED + n).standard_normal((POWER_DRAWS, n))


def _test_power(z: float, n: int, c: int) -> float:
    """P(W <= c) when the round log-ratios are normal with mean -z sd (simulated, fixed seed)."""
    import numpy as np

    x = _unit_draws(n) - z
    ranks = np.argsort(np.argsort(np.abs(x), axis=1), axis=1) + 1
    w = np.where(x > 0, ranks, 0).sum(axis=1)
    return float(np.mean(w <= c))


def power(sd: float, effect: float, threshold: float, alternative: str, n: int, practical: bool = True) -> float:
    """About the chance that n rounds certify a true effect of ``effect`` (ln, > 0: that much faster)
    when the round log-ratios have sd ``sd``: p <= threshold, and (``practical``) the Hodges-Lehmann
    ratio <= 0.97.  Two-sided claims count the side of the effect (the other is negligible)."""
    tail = threshold / 2 if alternative == TWO_SIDED else threshold
    if sd <= 0:
        reach = smallest_p(n, alternative) <= threshold
        return float(reach and (not practical or effect > FASTER_EDGE))
    z = effect / sd
    if n <= POWER_MC_MAX:
        c = critical_count(n, tail)
        if c is None:
            return 0.0
        p_test = _test_power(z, n, c)
    else:  # large n: the normal approximation at the signed-rank test's efficiency 3/pi
        p_test = float(normal_cdf(math.sqrt(3 * n / math.pi) * z - normal_isf(tail)))
    if not practical:
        return p_test
    p_rule = float(normal_cdf((effect - FASTER_EDGE) / (sd * math.sqrt(math.pi / (3 * n)))))
    return p_test * p_rule


@lru_cache(maxsize=4096)
def _rounds_for_power(sd: float, effect: float, threshold: float, alternative: str, practical: bool) -> int | None:
    n0 = rounds_to_reach(threshold, alternative)
    if sd <= 0:
        return n0
    if practical and effect <= FASTER_EDGE:
        return None  # the estimate sits on the 3% rule: at most about half the runs clear it
    # the asymptotic answer first: when it is far beyond the simulated range, it is the answer
    tail = threshold / 2 if alternative == TWO_SIDED else threshold
    za, zb = normal_isf(tail), normal_ppf(POWER)
    rough = math.pi / 3 * ((za + zb) * sd / effect) ** 2
    if practical:
        rough = max(rough, math.pi / 3 * (zb * sd / (effect - FASTER_EDGE)) ** 2)
    if rough <= 2 * POWER_MC_MAX and power(sd, effect, threshold, alternative, POWER_MC_MAX, practical) >= POWER:
        lo, hi = n0, POWER_MC_MAX
        while lo < hi:  # bisect: the power grows with n (the exact test's steps make small wiggles)
            mid = (lo + hi) // 2
            if power(sd, effect, threshold, alternative, mid, practical) >= POWER:
                hi = mid
            else:
                lo = mid + 1
        return hi
    lo, hi = max(n0, POWER_MC_MAX + 1), max(n0, POWER_MC_MAX + 1)
    while power(sd, effect, threshold, alternative, hi, practical) < POWER:
        lo, hi = hi, hi * 2
        if hi > MAX_ROUNDS:
            return None
    while lo < hi:  # the asymptotic power increases with n: bisect
        mid = (lo + hi) // 2
        if power(sd, effect, threshold, alternative, mid, practical) >= POWER:
            hi = mid
        else:
            lo = mid + 1
    return hi


def rounds_for_power(sd: float, effect: float, threshold: float, alternative: str,
                     practical: bool = True) -> int | None:
    """The fewest rounds (launches per arm) with about 80% power for a true ``effect`` (ln, its size)
    at round-log-ratio sd ``sd``; None when no number of rounds gets there (an effect at or below
    the 3% rule, or more than MAX_ROUNDS).  ``practical=False``: p <= threshold alone."""
    return _rounds_for_power(round(float(sd), 6), round(abs(float(effect)), 6), float(threshold), alternative,
                             bool(practical))
