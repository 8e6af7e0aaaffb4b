"""The statistics behind commdiag's verdicts: per-launch values and exact tests.  Pure, no I/O.

The unit of evidence is the launch.  On a 2x H200 box the same default config,
launched four times, gave 9.9-11.3 us per 14 KB all-reduce in graph mode and
23.7, 39.7, 24.9 and 40.1 us in eager mode: each launch lands in its own state
(placement, clocks, NCCL's channel setup) and stays there, so thousands of
iterations inside one launch say nothing about the next launch.

Per-launch value.  The mean of ln(samples) after dropping the lowest and
highest 5% of the launch's samples (``TRIM``).  Not the median: when a launch's
samples mix a fast and a slow mode (CPU gloo: 0.5-0.8 ms and 3-10 ms, the slow
share varying from 6% to 54% between launches) the median jumps between modes
and its between-launch spread was the largest of the candidates (sd of ln
0.41-0.55 on CPU against 0.28-0.40 for the trimmed log mean; on H200 eager 0.166
against 0.137).  A band's value is the mean of a launch's values over the band's
sizes.

Exact tests.  Stage 2 (certify.py) uses the paired within-round signed-rank test
of paired.py: its rounds are shuffled within each round, so only the two launches
of a round are exchangeable.  What is here is the unpaired Wilcoxon-Mann-Whitney
rank test on launch values, for launches that are exchangeable as a whole:
``commdiag compare`` (two runs: no round pairs their launches) and
``--certify-sizes``.  It is exact whatever shape the launch noise has (log-normal,
two-state, rare slow launches, heavy tails) when, under "no difference", the
launches of the two arms are exchangeable.  Its price is a floor on the p-value:
with k launches per arm the smallest attainable one-sided p is 1/C(2k,k) (0.05 at
k=3, 0.0022 at k=6).  exact.py counts the exact distribution (scipy's
``mannwhitneyu(method="exact")``'s, without importing scipy.stats; vectorised over
claims); the Hodges-Lehmann estimate (median of pairwise differences) is the
matching effect size, reported as a ratio of times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALPHA = 0.01  # family-wise error rate of every certified claim of a run
MIN_EFFECT = 0.03  # smallest speedup or slowdown worth a claim (GPU clocks drift a few % anyway)
TRIM = 0.05  # fraction of a launch's samples dropped at each end before the mean of ln(time)
POWER = 0.80  # "about N launches per arm would give 80% power"
NOISE_WARN = 0.10  # warn when the between-launch noise (sd of ln value) exceeds 10%
DEFAULT = "default"
USABLE_STATUSES = ("ok", "timeout")  # timeout only with results_complete (teardown hang)
EXCLUDING_STATUSES = ("failed", "timeout", "incorrect")
LESS, TWO_SIDED = "less", "two-sided"  # the alternatives a claim is tested against


@dataclass(frozen=True)
class LaunchValue:
    """One launch's value at one size and mode: the 5%-trimmed mean of ln(time in us)."""

    config: str
    launch: int
    size_bytes: int
    mode: str
    value: float  # ln(us)
    stage: int = 1

    @property
    def us(self) -> float:
        return math.exp(self.value)


def launch_values(samples, usable: set[int] | None = None, stages: dict[int, int] | None = None) -> list[LaunchValue]:
    """Per launch x size x mode, the trimmed mean of ln(time) (``samples`` is samples.csv as a DataFrame;
    ``stages``: launch index -> stage, 1 when absent)."""
    import numpy as np

    from commdiag.analyse.exact import trim_mean

    if samples is None or len(samples) == 0:
        return []
    df = samples if usable is None else samples[samples["launch"].isin(sorted(usable))]
    df = df[df["time_us"] > 0]
    stages = stages or {}
    out = []
    for (c, l, s, m), t in df.groupby(["config", "launch", "size_bytes", "mode"], sort=False)["time_us"]:
        v = float(trim_mean(np.log(t.to_numpy(dtype=float)), TRIM))
        if math.isfinite(v):
            out.append(LaunchValue(str(c), int(l), int(s), str(m), v, int(stages.get(int(l), 1))))
    return out


def mean(xs) -> float:
    return sum(xs) / len(xs)


def median(xs) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def exp(v: float) -> float:
    return math.exp(min(v, 700.0))


# ---------------------------------------------------------------- exact tests

def rank_test(x, y, alternative: str = TWO_SIDED):
    """Exact Wilcoxon-Mann-Whitney p of x against y (``less``: x tends to be smaller, i.e. faster).
    Vectorised: x and y may be 2-D (claims x launches); returns a float or an array."""
    from commdiag.analyse.exact import mann_whitney_p

    return mann_whitney_p(x, y, alternative)


def hodges_lehmann(x, y):
    """Median of all pairwise differences x_i - y_j (ln scale): the shift estimate matching the rank test."""
    import numpy as np

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    d = x[..., :, None] - y[..., None, :]
    hl = np.median(d.reshape(d.shape[:-2] + (-1,)), axis=-1)
    return float(hl) if np.ndim(hl) == 0 else hl


def smallest_p(n1: int, n2: int, alternative: str = TWO_SIDED) -> float:
    """The smallest p the exact rank test can give with n1 and n2 launches: 1/C(n1+n2, n1), doubled two-sided."""
    if n1 < 1 or n2 < 1:
        return 1.0
    return min(1.0, (2.0 if alternative == TWO_SIDED else 1.0) / math.comb(n1 + n2, n1))


def launches_to_reach(threshold: float, alternative: str = TWO_SIDED, at_least: int = 1) -> int:
    """The fewest launches per arm (equal arms) at which the rank test can reach ``threshold`` at all."""
    k = max(1, at_least)
    while smallest_p(k, k, alternative) > threshold:
        k += 1
    return k


def drift(values_by_round: list[tuple[int, float]]) -> tuple[float, float] | None:
    """Spearman rank correlation (rho, p) of default's launch values with the round index, or None
    with fewer than 5 launches: a trend across rounds means the machine drifted during stage 2.
    Reported only: stage 2's paired test compares launches of the same round, so drift between
    rounds cannot bias it (paired.py)."""
    from commdiag.analyse.exact import spearman

    if len(values_by_round) < 5:
        return None
    r, v = zip(*values_by_round)
    if len(set(v)) < 2 or len(set(r)) < 2:
        return None
    rho, p = spearman(r, v)
    return float(rho), float(p)


def two_states(residuals: list[float], gap_min: float = 0.10) -> tuple[float, float] | None:
    """(lower, upper) centres (ln) when launch values fall into two clearly separated states: the
    widest gap between sorted residuals is at least 10% and at least 3x the spread inside each
    state, with two or more launches on each side.  None otherwise."""
    r = sorted(residuals)
    if len(r) < 4:
        return None
    gaps = [(r[i + 1] - r[i], i) for i in range(1, len(r) - 2)]
    if not gaps:
        return None
    gap, i = max(gaps)
    lo, hi = r[: i + 1], r[i + 1:]
    spread = max(max(lo) - min(lo), max(hi) - min(hi))
    if gap >= gap_min and gap >= 3 * spread:
        return mean(lo), mean(hi)
    return None


def pooled_sd(groups: list[list[float]]) -> float | None:
    """Between-launch sd of ln values, pooled over groups with at least two launches."""
    ss, df = 0.0, 0
    for xs in groups:
        if len(xs) >= 2:
            m = mean(xs)
            ss += sum((x - m) ** 2 for x in xs)
            df += len(xs) - 1
    return math.sqrt(ss / df) if df else None


# ---------------------------------------------------------------- from a run folder's data

def exclusions(run: dict, summary=None) -> dict[str, str]:
    """Configs that can never win, with the reason: a failed, timed-out or incorrect launch,
    or a wrong element anywhere."""
    out: dict[str, list[str]] = {}
    for l in run.get("launches", []):
        if l.get("status") in EXCLUDING_STATUSES:
            out.setdefault(l["config"], []).append(f"launch {l['index']} {l['status']}")
        elif l.get("wrong"):
            out.setdefault(l["config"], []).append(f"launch {l['index']}: {l['wrong']} wrong elements")
    if summary is not None and len(summary):
        for r in summary[summary["wrong"] > 0].itertuples(index=False):
            out.setdefault(r.config, []).append(f"{int(r.wrong)} wrong elements at {int(r.size_bytes)} B")
    return {c: "; ".join(dict.fromkeys(v)) for c, v in out.items()}


def usable_launches(run: dict) -> set[int]:
    """Launches whose timings count: ok, or timed out after all results were written."""
    return {l["index"] for l in run.get("launches", [])
            if l.get("status") == "ok" or (l.get("status") == "timeout" and l.get("results_complete"))}


def launch_stages(run: dict) -> dict[int, int]:
    """Launch index -> stage (1 screening, 2 confirmation); format 1-2 runs are all stage 1."""
    return {l["index"]: int(l.get("stage", 1)) for l in run.get("launches", [])}
