"""Verdicts of an A/B: per arm and metric against default, paired within rounds.  Pure, no I/O.

The design randomizes within rounds (every arm once per round, in a shuffled order), so the test
that matches it is paired (analyse/paired.py): per round where both launches succeeded,
d = ln(arm's value) - ln(default's value); the exact Wilcoxon signed-rank p (two-sided), the
Hodges-Lehmann estimate of d (the median of the Walsh averages) as the ratio, and its exact
interval.  Drift between rounds and position effects inside a round cancel in d.

Family: metrics x arms (M claims) at 1% family-wise.  p is judged by Holm's step-down; every
interval is at level 1 - 1%/M (Bonferroni), so all M intervals hold together with probability
>= 99%, and every verdict below is wrong only when an interval misses its truth:

* better / worse: Holm's p within its threshold, and the whole interval beyond min_effect;
* equivalent: the whole interval within +-min_effect (two one-sided tests through the interval);
* inconclusive: neither; with the rounds that would decide it at the measured noise.

Failed launches are evidence against their arm: a round where one launch failed (the server never
ready, the command failed or timed out, a metric missing) counts that launch as twice the worst value
either arm reached (analyse/paired.with_failures: label-free, so the test stays exact under no effect);
only a round where both failed is left out.  An arm whose slow launches time out is not judged on its
good ones.

Resolution: a metric printed in coarse steps (integers around 20: 5% steps) has ties and zeros the
interval cannot see past.  The step is detected from the values (``resolution``: every value on one
grid); a verdict needs the step at most min_effect/3 of the metric's median, else the claim is
inconclusive and says so.  With ties or zeros the interval is the exact test inverted with the same
tie handling as p (paired.interval).

Rounds needed: by simulation of the same interval on normal round log-ratios at the measured sd
(fixed seed, up to SIM_MAX rounds), by the normal approximation at the signed-rank efficiency
3/pi beyond; with a range (``rounds_range``) from the 80% bounds of the measured sd and effect, since
one run's noise and effect are themselves estimates (near the margin the number moves a lot).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

from ..analyse import exact, paired, stats

SIM_DRAWS = 1000
SIM_MAX = 40
SIM_SEED = 20261201
TARGET = 0.80  # "about N rounds": 80% chance of the verdict
RESOLUTION_SHARE = 1 / 3  # a verdict needs the metric's step at most this share of min_effect (relative)
RESOLUTION_MIN_VALUES = 6  # fewer values cannot show a grid
RANGE_Z = 1.2816  # the rounds range: the measured sd and effect at their 80% two-sided bounds
BETTER, WORSE, EQUIVALENT, INCONCLUSIVE = "better", "worse", "equivalent", "inconclusive"


@dataclass(frozen=True)
class Verdict:
    config: str
    metric: str
    better: str  # the metric's direction: higher | lower
    verdict: str
    ratio: float | None  # arm / default (Hodges-Lehmann of the paired log-ratios)
    interval: tuple[float, float] | None  # of the ratio, at 1 - alpha / M
    p: float | None
    threshold: float | None  # Holm's threshold at this claim's step
    rounds: int  # complete pairs used
    noise: float | None  # sd of the round log-ratios
    rounds_needed: int | None  # for a decision at the measured noise (inconclusive / equivalent)
    note: str = ""
    rounds_range: tuple[int, int | None] | None = None  # rounds_needed at the 80% bounds (None: no bound)
    failed: int = 0  # rounds whose arm launch failed (counted as its worst value)
    default_failed: int = 0  # rounds whose default launch failed
    resolution: float | None = None  # the metric's step relative to its median (None: not on a grid)

    def to_json(self) -> dict:
        d = asdict(self)
        d["interval"] = list(self.interval) if self.interval else None
        d["rounds_range"] = list(self.rounds_range) if self.rounds_range else None
        return d


def pairs(launches: list[dict], config: str, metric: str, reference: str = stats.DEFAULT) -> list[tuple[int, float, float]]:
    """(round, arm value, default value) for every round where both launches are ok with the metric."""
    by = {}
    for l in launches:
        if l.get("status") == "ok" and metric in (l.get("values") or {}):
            by[(l["config"], l["round"])] = l["values"][metric]
    return [(r, by[(config, r)], by[(reference, r)]) for (c, r) in sorted(by, key=lambda k: k[1])
            if c == config and (reference, r) in by]


def by_round(launches: list[dict], config: str, metric: str) -> dict[int, float | None]:
    """Round -> ln value of ``config``'s launch (None: it failed or lacks the metric); pending ones left out."""
    out: dict[int, float | None] = {}
    for l in launches:
        if l["config"] != config or l.get("status") not in ("ok", "failed"):
            continue
        v = (l.get("values") or {}).get(metric) if l.get("status") == "ok" else None
        out[l["round"]] = math.log(v) if isinstance(v, (int, float)) and v > 0 else None
    return out


def resolution(values, default=None) -> float | None:
    """The step of a metric's values relative to their median: the smallest gap between distinct values
    when every value lies on that grid (a coarsely printed number), else None (finer than it shows).
    One distinct value: infinity (every launch the same: nothing to tell arms apart by); two: their gap,
    unless each arm (``values`` one arm's, ``default`` the other's) gave a single value, when the gap may
    be the effect itself (None); None with fewer than RESOLUTION_MIN_VALUES values."""
    import numpy as np

    arms = [[x for x in a if x is not None and math.isfinite(x)] for a in (values, default or [])]
    v = np.asarray(arms[0] + arms[1], dtype=float)
    if v.size < RESOLUTION_MIN_VALUES:
        return None  # too few values to tell a grid from chance
    scale = float(np.median(np.abs(v))) or 1.0
    v = np.unique(v)
    if v.size == 1:
        return math.inf
    if v.size == 2 and all(len(set(a)) <= 1 for a in arms):  # each arm constant: the gap is the effect
        return None
    step = float(np.diff(v).min())
    k = (v - v[0]) / step
    if np.all(np.abs(k - np.round(k)) <= 1e-6 * np.maximum(1.0, k)):
        return step / scale
    return None


def judge(launches: list[dict], arms: list[str], metrics: list[tuple[str, str]], min_effect: float,
          alpha: float = stats.ALPHA) -> list[Verdict]:
    """Every (arm, metric) claim: ``metrics`` is [(name, higher|lower)]; ``arms`` excludes default."""
    import numpy as np

    m_claims = max(len(arms) * len(metrics), 1)
    tail = alpha / (2 * m_claims)
    raw = []
    for arm in arms:
        for name, better in metrics:
            xs, ys = by_round(launches, arm, name), by_round(launches, stats.DEFAULT, name)
            rounds, dl, _ = paired.with_failures(xs, ys, -1 if better == "higher" else 1)
            d = np.array(dl)
            p = paired.signed_rank_p(d, stats.TWO_SIDED) if len(d) else None
            res = resolution([math.exp(v) for v in xs.values() if v is not None],
                             [math.exp(v) for v in ys.values() if v is not None])
            fails = (sum(xs[r] is None for r in rounds), sum(ys[r] is None for r in rounds))
            raw.append((arm, name, better, d, p, res, fails))
    # Holm: the k-th smallest p against alpha / (M - k + 1); stop at the first that fails
    order = sorted(range(len(raw)), key=lambda i: (raw[i][4] is None, raw[i][4] if raw[i][4] is not None else 1))
    from dataclasses import replace
    holm_ok, threshold = {}, {}
    going = True
    for k, i in enumerate(order):
        threshold[i] = alpha / (m_claims - k)
        p = raw[i][4]
        going = going and p is not None and p <= threshold[i] * (1 + 1e-9)
        holm_ok[i] = going
    out = []
    for i, (arm, name, better, d, p, res, fails) in enumerate(raw):
        if res is not None and res > RESOLUTION_SHARE * min_effect:
            step = ("every launch gave the same value" if math.isinf(res)
                    else f"printed in steps of {res:.1%} of its median")
            v = Verdict(arm, name, better, INCONCLUSIVE, math.exp(paired.hodges_lehmann(d)) if len(d) else None,
                        None, p, threshold[i], len(d),
                        float(d.std(ddof=1)) if len(d) >= 2 else None, None,
                        f"{name} is {step}, coarser than a third of min_effect {min_effect:.0%}: too coarse for a "
                        "verdict; print it with more digits", resolution=res)
        else:
            v = _one(arm, name, better, d, p, threshold[i], holm_ok[i], min_effect, tail, alpha / m_claims)
            v = replace(v, resolution=res, rounds_range=_range(v, d, min_effect, tail))
        v = replace(v, failed=fails[0], default_failed=fails[1])
        if fails[0] > fails[1] and v.verdict in (BETTER, EQUIVALENT):
            v = replace(v, verdict=INCONCLUSIVE, rounds_range=None, rounds_needed=None,
                        note=f"{arm} failed more often than default ({fails[0]} against {fails[1]} launches): "
                             f"never {v.verdict} while it does")
        if fails[0] or fails[1]:
            v = replace(v, note="; ".join(x for x in (v.note, f"failed launches counted as twice the worst value: "
                                                      f"{fails[0]} of {arm}, {fails[1]} of default") if x))
        out.append(v)
    return out


def _range(v: Verdict, d, delta: float, tail: float) -> tuple[int, int | None] | None:
    """rounds_needed at the 80% bounds of the measured sd (chi-square) and effect (its standard error at
    the signed-rank efficiency): the rounds scale as (sd / distance to the margin)^2, so the bounds are
    rounds_needed scaled by that square at each end (None at the top: the effect may sit on the margin,
    where no number of rounds decides it)."""
    if v.rounds_needed is None or v.noise is None or v.noise <= 0 or len(d) < 3:
        return None
    from scipy.special import chdtri

    n = len(d)
    sd_lo = v.noise * math.sqrt((n - 1) / chdtri(n - 1, 0.1))
    sd_hi = v.noise * math.sqrt((n - 1) / chdtri(n - 1, 0.9))
    edge = math.log(1 + delta)
    effect = abs(paired.hodges_lehmann(d)) if v.verdict != EQUIVALENT else 0.0
    se = v.noise * math.sqrt(math.pi / (3 * n))
    margin = abs(edge - effect)
    if margin <= 1e-9:
        return None
    if effect < edge:  # equivalence: harder the nearer the effect is to the margin
        easy, hard = edge - max(effect - RANGE_Z * se, 0.0), edge - min(effect + RANGE_Z * se, edge)
    else:
        easy, hard = effect + RANGE_Z * se - edge, max(effect - RANGE_Z * se, edge) - edge
    floor = max(2, paired.rounds_to_reach(2 * tail, stats.TWO_SIDED))
    lo = max(floor, min(v.rounds_needed, math.ceil(v.rounds_needed * (sd_lo / v.noise * margin / easy) ** 2)))
    if hard <= 1e-9:
        return lo, None
    return lo, max(v.rounds_needed, math.ceil(v.rounds_needed * (sd_hi / v.noise * margin / hard) ** 2))


def _one(arm, name, better, d, p, threshold, significant, delta, tail, alpha_m) -> Verdict:
    n = len(d)
    need_min = paired.rounds_to_reach(alpha_m, stats.TWO_SIDED)
    sd = float(d.std(ddof=1)) if n >= 2 else None
    if n == 0:
        return Verdict(arm, name, better, INCONCLUSIVE, None, None, None, threshold, 0, None, need_min,
                       "no round where both launches succeeded")
    hl = paired.hodges_lehmann(d)
    ci = paired.interval(d, tail)
    ratio = math.exp(hl)
    if ci is None:
        need = _needed(sd, hl, delta, tail)  # None with one round (no sd): the exact floor is all that is known
        return Verdict(arm, name, better, INCONCLUSIVE, ratio, None, p, threshold, n, sd,
                       need_min if need is None else max(need_min, need),
                       f"{n} complete rounds: the exact test needs at least {need_min}")
    lo, hi = math.exp(ci[0]), math.exp(ci[1])
    up, down = 1 + delta, 1 - delta
    if significant and (lo > up or hi < down):
        higher = lo > up
        verdict = BETTER if higher == (better == "higher") else WORSE
        return Verdict(arm, name, better, verdict, ratio, (lo, hi), p, threshold, n, sd, None)
    if down <= lo and hi <= up:
        return Verdict(arm, name, better, EQUIVALENT, ratio, (lo, hi), p, threshold, n, sd,
                       _needed(sd, 0.0, delta, tail), "")
    note = ("differs from default (p within its threshold) but the interval reaches inside "
            f"+-{delta:.0%}" if significant else "")
    return Verdict(arm, name, better, INCONCLUSIVE, ratio, (lo, hi), p, threshold, n, sd,
                   _needed(sd, hl, delta, tail), note)


def _needed(sd: float | None, effect: float, delta: float, tail: float) -> int | None:
    """Rounds for about 80% chance of a decision when the true log-ratio is ``effect`` with round sd
    ``sd``: equivalence when |effect| is inside the margin, a difference when beyond it."""
    if sd is None:
        return None
    # two significant digits of the noise and effect: the answer is "about N", and the cache then hits
    return rounds_for(float(f"{sd:.2g}"), float(f"{abs(effect):.2g}"), round(math.log(1 + delta), 6),
                      round(-math.log(1 - delta), 6), tail)


@lru_cache(maxsize=512)
def rounds_for(sd: float, effect: float, edge_up: float, edge_down: float, tail: float) -> int | None:
    n0 = max(2, paired.rounds_to_reach(2 * tail, stats.TWO_SIDED))
    equivalence = effect < edge_up
    margin = (edge_up - effect) if equivalence else (effect - edge_up)
    if margin <= 1e-6:
        return None  # the effect sits on the margin: no number of rounds decides it reliably
    if sd <= 0:
        return n0
    z = exact.normal_isf(tail) + exact.normal_ppf(1 - (1 - TARGET) / (2 if equivalence and effect == 0 else 1))
    rough = math.pi / 3 * (z * sd / margin) ** 2
    if rough > 10 ** 7:
        return None
    if rough > 2 * SIM_MAX or decision_rate(sd, effect, edge_up, edge_down, tail, SIM_MAX, equivalence) < TARGET:
        return max(math.ceil(rough), SIM_MAX + 1)  # beyond the simulated range: the normal approximation
    lo, hi = n0, SIM_MAX
    while lo < hi:  # bisect: the chance of a decision grows with the rounds (small steps aside)
        mid = (lo + hi) // 2
        if decision_rate(sd, effect, edge_up, edge_down, tail, mid, equivalence) >= TARGET:
            hi = mid
        else:
            lo = mid + 1
    return hi


@lru_cache(maxsize=64)
def _draws(n: int):
    import numpy as np

    return np.random.default_rng(SIM_SEED + n).standard_normal((SIM_DRAWS, n))


def decision_rate(sd, effect, edge_up, edge_down, tail, n, equivalence: bool) -> float:
    """Share of simulated n-round runs (normal d, mean ``effect``, sd ``sd``) whose interval decides:
    inside [-edge_down, edge_up] (equivalence), or wholly beyond edge_up."""
    import numpy as np

    c = paired.critical_count(n, tail)
    if c is None:
        return 0.0
    d = _draws(n) * sd + effect
    i, j = np.triu_indices(n)
    w = np.sort((d[:, i] + d[:, j]) / 2.0, axis=1)
    lo, hi = w[:, c], w[:, w.shape[1] - 1 - c]
    ok = (lo >= -edge_down) & (hi <= edge_up) if equivalence else (lo > edge_up)
    return float(ok.mean())


def drift(values: list[tuple[int, float]], min_effect: float) -> str | None:
    """A named drift of one arm over the run (default above all): Spearman's rho of value vs round
    with p < 1%, and the last third's median differing from the first third's by more than
    min_effect.  Paired rounds keep the verdicts valid; the drift is named so nobody reads the
    early numbers as the baseline."""
    if len(values) < 6:
        return None
    vals = [v for _, v in sorted(values)]
    rho, p = exact.spearman(range(len(vals)), vals)
    k = len(vals) // 3
    first, last = stats.median(vals[:k]), stats.median(vals[-k:])
    if p is not None and p < 0.01 and abs(last / first - 1) > min_effect:
        return (f"drifted from {first:.4g} to {last:.4g} over the run ({last / first - 1:+.1%}; Spearman "
                f"rho {rho:+.2f}); each round's pair saw the same machine, so the verdicts hold")
    return None
