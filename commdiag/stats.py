"""Verdicts: is a config faster than ``default`` by more than the noise between launches?

Pure statistics, no I/O: launch medians in, a frozen ``Verdicts`` out (report.py,
compare.py and the CLI render it; the sweep turns its winners into profiles).

Why launches, not iterations.  On a 2x H200 box the same default config, launched
four times, gave 9.9-11.3 us per 14 KB all-reduce in graph mode and 23.7, 39.7,
24.9 and 40.1 us in eager mode: each launch lands in its own state (placement,
clocks, NCCL's channel setup) and stays there.  Thousands of iterations inside
one launch say nothing about the next launch, so the unit of evidence is the
launch: a test that used every iteration as an independent sample would crown
that noise.

Method (per config x size x mode; ``default`` is the reference)
  1. Launch medians.  The median of each launch's samples.  Only launches whose
     timings can be trusted count: status ``ok``, or ``timeout`` after every result
     was written (a teardown hang).  ``failed`` and ``incorrect`` launches do not.
  2. Time = the median of the launch medians (as summary.csv).  The comparison
     works on x = ln(launch median): ratios become differences and the
     multiplicative launch noise becomes additive.
  3. Noise.  The between-launch variance of x, pooled over every config at that
     size and mode (s_p^2 with df = sum(k_c - 1)): with 2-3 launches per config a
     config's own variance is a guess, the pooled one is not.  Each side of a
     comparison uses max(own variance, pooled variance): a config noisier than the
     rest keeps its own noise, and launches that agree by luck do not buy a narrow
     interval.
  4. Interval.  d = mean(x_config) - mean(x_default), se = sqrt(s_c^2/k_c + s_d^2/k_d),
     Student t with the pooled df at confidence 1 - ALPHA/m, where m is the number
     of comparisons in the run (Bonferroni over configs x sizes x modes).  The 1%
     error rate is family-wise: an A/A pair comes out without a single "faster" or
     "slower" at any size, 99 times in 100 (launch noise is correlated across
     sizes, which makes Bonferroni conservative here).  ratio = exp(d), interval exp(d +- t*se);
     ratio < 1 means faster than default.
  5. Verdict, with a minimum effect MIN_EFFECT (3%):
       faster   the interval is below 1 and the ratio is at least 3% faster;
       slower   the interval is above 1 and the ratio is at least 3% slower;
       inconclusive: about N more launches needed
                the estimate is 3% or more away from 1 but the interval contains 1:
                the launches cannot confirm the apparent effect.  N is how many more
                launches per config would make an effect of that size significant
                with the noise as measured (capped at MAX_MORE);
       inconclusive, too
                the estimate is within 3% of 1 but the interval reaches past +-10%
                (EQUIVALENCE): the launches could hide a 10% effect either way.  On
                2x H200 eager mode gave intervals like [0.35, 2.9] around a ratio of
                1.005; calling that "no difference" would tell a user the settings do
                not matter when the launches cannot tell.  N: launches per config to
                bring the interval inside +-10%;
       no significant difference
                otherwise: the interval contains 1, the estimate is within 3% and the
                interval excludes effects beyond 10%; or the difference is real but
                smaller than 3%.
     With one launch per config there is no measure of launch noise at all: every
     comparison is inconclusive.
  6. Winners.  Per size and mode: among eligible configs whose verdict is
     ``faster``, the one with the lowest ratio.  Per band (sizes whose token count
     lies in the band, spec key ``bands``): each launch's band value is the mean of
     its x over the band's sizes, and steps 3-5 run on that (a separate Bonferroni
     family: configs x bands x modes).  The band winner is the eligible config with
     the lowest band ratio among those ``faster`` over the band and not ``slower``
     at any single size of it.  No winner means "keep NCCL defaults".
     Eligible = no failed, timed-out or incorrect launch and no wrong element
     anywhere: a config that ever gave a wrong sum is never a winner.

Assumptions, said out loud: launch medians are roughly log-normal around the
config's true time and configs at one size share a noise level (step 3 guards the
second).  A bimodal machine breaks the first; with 3 launches no method can tell
"default happened to land fast three times" from a real effect, so the report
shows every launch median and warns when the launch noise exceeds NOISE_WARN.

Why 3%: below it a fleet-wide environment change is not worth its risk, and GPU
clocks drift by a few percent between launches anyway.  Why 1% family-wise: the
A/A self-check must practically never fail on a healthy machine, and without the
family-wise correction a 50-config sweep would crown a false "faster" every time;
the price is an interval some 10-40% wider than an uncorrected 95% one.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field

ALPHA = 0.01  # family-wise error rate over all comparisons of a run (see module docstring)
MIN_EFFECT = 0.03  # smallest speedup or slowdown worth a verdict (see module docstring)
EQUIVALENCE = 0.10  # "no significant difference" also needs the interval to rule out a 10% effect
MAX_MORE = 100  # beyond this many more launches, "inconclusive" says "more than 100"
WIDE_INTERVAL = 100.0  # an interval spanning more than 100x says nothing; print that instead of its bounds
NOISE_WARN = 0.10  # warn when the between-launch noise (sd of ln time) exceeds 10%
DEFAULT = "default"
USABLE_STATUSES = ("ok", "timeout")  # timeout only with results_complete (teardown hang)
EXCLUDING_STATUSES = ("failed", "timeout", "incorrect")

FASTER, SLOWER, SAME, INCONCLUSIVE = "faster", "slower", "same", "inconclusive"


# ---------------------------------------------------------------- Student t (no scipy)

def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (Lentz; Numerical Recipes 6.4)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                   -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


@functools.lru_cache(maxsize=4096)
def t_quantile(upper: float, df: float) -> float:
    """The t with P(T > t) = ``upper`` (0 < upper <= 0.5), by bisection."""
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > upper:
        hi *= 2.0
        if hi > 1e12:
            return math.inf
    for _ in range(100):  # 2^-100 of the bracket: far below float precision needs
        mid = 0.5 * (lo + hi)
        if t_sf(mid, df) > upper:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


# ---------------------------------------------------------------- data in

@dataclass(frozen=True)
class LaunchMedian:
    """The median of one launch's samples at one size and mode."""

    config: str
    launch: int
    size_bytes: int
    mode: str
    median_us: float


def _mean(xs): return sum(xs) / len(xs)


def _var(xs):
    m = _mean(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def _exp(v: float) -> float:
    return math.exp(min(v, 700.0))  # an interval this wide is "unbounded"; avoid OverflowError


def _num(v: float) -> str:
    return f"{v:.3f}" if v < 1000 else f"{v:.3g}"


def _median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


# ---------------------------------------------------------------- results out

@dataclass(frozen=True)
class Comparison:
    """A config against default at one size (or one band) and mode."""

    config: str
    mode: str
    size_bytes: int | None  # None for a band
    tokens: int | None
    band: str | None
    time_us: float | None  # median of launch medians (a band: geometric mean over its sizes)
    default_us: float | None
    launches: int
    default_launches: int
    ratio: float | None  # config / default; < 1 is faster
    lo: float | None
    hi: float | None
    noise: float | None  # pooled between-launch sd of ln(time): 0.05 ~ +-5% per launch
    verdict: str  # faster | slower | same | inconclusive
    more_launches: int | None  # inconclusive: launches per config still needed (None: unknown)
    eligible: bool

    @property
    def label(self) -> str:
        if self.verdict == FASTER:
            return "faster"
        if self.verdict == SLOWER:
            return "slower"
        if self.verdict == SAME:
            return "no significant difference"
        if self.more_launches is None:
            return "inconclusive: launch noise unknown (run at least 3 trials)"
        if self.more_launches > MAX_MORE:
            return f"inconclusive: more than {MAX_MORE} more launches needed"
        n = self.more_launches
        return f"inconclusive: about {n} more launch{'es' if n != 1 else ''} needed"

    def ratio_text(self) -> str:
        if self.ratio is None:
            return "n/a"
        if self.lo is None or self.hi is None:
            return f"{self.ratio:.3f}"
        if self.hi / max(self.lo, 1e-300) > WIDE_INTERVAL:
            return f"{self.ratio:.3f} [interval too wide to tell: more launches]"
        return f"{self.ratio:.3f} [{_num(self.lo)}, {_num(self.hi)}]"

    def to_json(self) -> dict:
        d = asdict(self)
        d["label"] = self.label
        return d


@dataclass(frozen=True)
class Winner:
    """The best config at one size or band and mode, or none (keep NCCL defaults)."""

    mode: str
    scope: str  # size | band
    key: str  # size in bytes (as text) or band name
    tokens: int | None
    config: str | None
    ratio: float | None
    lo: float | None
    hi: float | None

    @property
    def text(self) -> str:
        if self.config is None:
            return "keep NCCL defaults"
        return f"{self.config}: {(1 - self.ratio) * 100:.1f}% faster (ratio {self.ratio:.3f} [{self.lo:.3f}, {self.hi:.3f}])"

    def to_json(self) -> dict:
        return {**asdict(self), "text": self.text}


@dataclass(frozen=True)
class Verdicts:
    alpha: float
    min_effect: float
    family_size: int  # m: comparisons in the Bonferroni family of the per-size verdicts
    band_family_size: int
    modes: tuple[str, ...]
    configs: tuple[str, ...]
    bands: dict
    cells: tuple[Comparison, ...]
    band_cells: tuple[Comparison, ...]
    size_winners: tuple[Winner, ...]
    band_winners: tuple[Winner, ...]
    excluded: dict  # config -> reason it can never win
    warnings: tuple[str, ...] = field(default=())

    @property
    def primary_mode(self) -> str | None:
        """The mode profiles are chosen from: graph (what CUDA-graph serving runs) when measured."""
        return "graph" if "graph" in self.modes else (self.modes[0] if self.modes else None)

    def band_winner(self, band: str, mode: str) -> Winner | None:
        return next((w for w in self.band_winners if w.key == band and w.mode == mode), None)

    def to_json(self) -> dict:
        return {
            "method": {"alpha_familywise": self.alpha, "min_effect": self.min_effect,
                       "family_size": self.family_size, "band_family_size": self.band_family_size,
                       "interval": "Student t on ln(launch medians), between-launch variance pooled over configs "
                                   "(each side at least its own), Bonferroni over the family"},
            "modes": list(self.modes), "bands": self.bands, "primary_mode": self.primary_mode,
            "excluded": self.excluded, "warnings": list(self.warnings),
            "cells": [c.to_json() for c in self.cells],
            "band_cells": [c.to_json() for c in self.band_cells],
            "size_winners": [w.to_json() for w in self.size_winners],
            "band_winners": [w.to_json() for w in self.band_winners],
        }


# ---------------------------------------------------------------- the method

@dataclass(frozen=True)
class Noise:
    """Pooled between-launch variance of ln(time) in one (size or band, mode) cell."""

    var: float | None
    df: int
    configs: int  # configs that contributed (>= 2 launches)


def pooled_noise(groups: dict[str, list[float]]) -> Noise:
    """Pool the variance of x = ln(time) over groups (configs) with at least two launches."""
    ss, df, n = 0.0, 0, 0
    for xs in groups.values():
        if len(xs) >= 2:
            m = _mean(xs)
            ss += sum((x - m) ** 2 for x in xs)
            df += len(xs) - 1
            n += 1
    return Noise(ss / df if df else None, df, n)


def _side_var(xs: list[float], noise: Noise) -> float:
    own = _var(xs) if len(xs) >= 2 else 0.0
    return max(own, noise.var or 0.0)


def _more_launches(d: float, var_c: float, var_d: float, k: int, noise: Noise, upper: float) -> int:
    """Launches per config still needed for an interval half-width below |d| at this noise
    (|d| = the apparent effect, or the equivalence bound when the estimate is near 1)."""
    groups = max(noise.configs, 2)
    for n in range(max(k, 2), k + MAX_MORE + 1):
        t = t_quantile(upper, groups * (n - 1))
        if t * math.sqrt((var_c + var_d) / n) < abs(d):
            return n - k
    return MAX_MORE + 1


def _decide(d: float, half_width: float, min_effect: float, more_launches):
    """ratio, lo, hi, verdict, more_launches from a log difference ``d`` and its interval half-width."""
    ratio, lo, hi = math.exp(d), _exp(d - half_width), _exp(d + half_width)
    effect = math.log1p(min_effect)
    if hi < 1.0 and d <= -effect:
        return ratio, lo, hi, FASTER, None
    if lo > 1.0 and d >= effect:
        return ratio, lo, hi, SLOWER, None
    if abs(d) >= effect and lo <= 1.0 <= hi:
        return ratio, lo, hi, INCONCLUSIVE, more_launches(d)
    bound = math.log1p(EQUIVALENCE)
    if half_width > bound:  # near 1, but the launches could hide a 10% effect either way
        return ratio, lo, hi, INCONCLUSIVE, more_launches(bound)
    return ratio, lo, hi, SAME, None


def compare_logs(xs: list[float], ys: list[float], noise: Noise, upper: float,
                 min_effect: float = MIN_EFFECT) -> tuple[float | None, float | None, float | None, str, int | None]:
    """ratio, lo, hi, verdict, more_launches for x = ln(config times) vs y = ln(default times).

    ``upper`` is the one-sided tail probability of the interval (alpha / 2m)."""
    if not xs or not ys:
        return None, None, None, INCONCLUSIVE, None
    d = _mean(xs) - _mean(ys)
    ratio = math.exp(d)
    if noise.var is None or noise.df == 0:
        return ratio, None, None, INCONCLUSIVE, None
    var_c, var_d = _side_var(xs, noise), _side_var(ys, noise)
    se = math.sqrt(var_c / len(xs) + var_d / len(ys))
    t = t_quantile(upper, noise.df)
    if not math.isfinite(t):
        return ratio, None, None, INCONCLUSIVE, None
    more = lambda target: _more_launches(target, var_c, var_d, min(len(xs), len(ys)), noise, upper)  # noqa: E731
    return _decide(d, t * se, min_effect, more)


def compare_independent(xs: list[float], noise_x: Noise, ys: list[float], noise_y: Noise, upper: float,
                        min_effect: float = MIN_EFFECT):
    """Like ``compare_logs`` for two independent runs (``commdiag compare``): each side keeps its own
    run's pooled noise, and the df is Welch-Satterthwaite's over the two pooled estimates."""
    if not xs or not ys:
        return None, None, None, INCONCLUSIVE, None
    d = _mean(xs) - _mean(ys)
    ratio = math.exp(d)
    if not noise_x.df or not noise_y.df:
        return ratio, None, None, INCONCLUSIVE, None
    va, vb = _side_var(xs, noise_x) / len(xs), _side_var(ys, noise_y) / len(ys)
    se = math.sqrt(va + vb)
    if se == 0:
        df = float(noise_x.df + noise_y.df)
    else:
        df = (va + vb) ** 2 / (va ** 2 / noise_x.df + vb ** 2 / noise_y.df)
    t = t_quantile(upper, df)
    if not math.isfinite(t):
        return ratio, None, None, INCONCLUSIVE, None
    merged = Noise(max(noise_x.var or 0.0, noise_y.var or 0.0), int(df), max(noise_x.configs, noise_y.configs))
    more = lambda target: _more_launches(target, va * len(xs), vb * len(ys), min(len(xs), len(ys)), merged,  # noqa: E731
                                         upper)
    return _decide(d, t * se, min_effect, more)


def evaluate(medians: list[LaunchMedian], *, configs: list[str], modes: list[str],
             tokens_by_size: dict[int, int | None], bands: dict[str, list] | None = None,
             excluded: dict[str, str] | None = None, alpha: float = ALPHA,
             min_effect: float = MIN_EFFECT) -> Verdicts:
    """Verdicts for every config against ``default`` from launch medians (see module docstring)."""
    bands = dict(bands or {})
    excluded = dict(excluded or {})
    # x[(mode, size)][config][launch] = ln(median)
    x: dict[tuple[str, int], dict[str, dict[int, float]]] = {}
    raw: dict[tuple[str, int], dict[str, list[float]]] = {}
    for m in medians:
        if not (m.median_us > 0 and math.isfinite(m.median_us)):
            continue
        x.setdefault((m.mode, m.size_bytes), {}).setdefault(m.config, {})[m.launch] = math.log(m.median_us)
        raw.setdefault((m.mode, m.size_bytes), {}).setdefault(m.config, []).append(m.median_us)
    others = [c for c in configs if c != DEFAULT]
    sizes = sorted({s for (_, s) in x})
    modes = [md for md in modes if any(k[0] == md for k in x)]
    warnings: list[str] = []
    if DEFAULT not in configs:
        warnings.append("no 'default' config in this run: nothing to compare against")

    family = sum(1 for md in modes for s in sizes for c in others if c in x.get((md, s), {}))
    upper = alpha / (2 * max(family, 1))
    cells: list[Comparison] = []
    for md in modes:
        for s in sizes:
            groups = {c: list(v.values()) for c, v in x.get((md, s), {}).items()}
            noise = pooled_noise(groups)
            noise_sd = math.sqrt(noise.var) if noise.var is not None else None
            if noise_sd is not None and noise_sd > NOISE_WARN:
                warnings.append(f"{md} {s} B: launch-to-launch noise {noise_sd * 100:.0f}% "
                                f"(sd of ln time over {noise.df} df); verdicts there need many launches")
            ys = groups.get(DEFAULT, [])
            for c in others:
                if c not in groups:
                    continue
                ratio, lo, hi, verdict, more = compare_logs(groups[c], ys, noise, upper, min_effect)
                cells.append(Comparison(
                    c, md, s, tokens_by_size.get(s), None, _median(raw[(md, s)][c]),
                    _median(raw[(md, s)][DEFAULT]) if ys else None, len(groups[c]), len(ys),
                    ratio, lo, hi, noise_sd, verdict, more, c not in excluded))

    # Bands: each launch's band value is the mean of its ln(time) over the band's sizes.
    band_sizes = {b: [s for s in sizes if _in_band(tokens_by_size.get(s), rng)] for b, rng in bands.items()}
    band_groups: dict[tuple[str, str], dict[str, list[float]]] = {}
    for md in modes:
        for b, bs in band_sizes.items():
            if not bs:
                continue
            groups = {}
            for c in configs:
                per_size = [x.get((md, s), {}).get(c, {}) for s in bs]
                launches = set(per_size[0]).intersection(*per_size[1:]) if per_size else set()
                vals = [_mean([ps[l] for ps in per_size]) for l in sorted(launches)]
                if vals:
                    groups[c] = vals
            band_groups[(md, b)] = groups
    band_family = sum(1 for g in band_groups.values() for c in others if c in g)
    band_upper = alpha / (2 * max(band_family, 1))
    band_cells: list[Comparison] = []
    for (md, b), groups in band_groups.items():
        noise = pooled_noise(groups)
        ys = groups.get(DEFAULT, [])
        for c in others:
            if c not in groups:
                continue
            ratio, lo, hi, verdict, more = compare_logs(groups[c], ys, noise, band_upper, min_effect)
            band_cells.append(Comparison(
                c, md, None, None, b, math.exp(_mean(groups[c])), math.exp(_mean(ys)) if ys else None,
                len(groups[c]), len(ys), ratio, lo, hi,
                math.sqrt(noise.var) if noise.var is not None else None, verdict, more, c not in excluded))

    size_winners = []
    for md in modes:
        for s in sizes:
            best = _best([c for c in cells if c.mode == md and c.size_bytes == s])
            size_winners.append(_winner(md, "size", str(s), tokens_by_size.get(s), best))
    band_winners = []
    for (md, b) in band_groups:
        slower_somewhere = {c.config for c in cells
                            if c.mode == md and c.size_bytes in band_sizes[b] and c.verdict == SLOWER}
        best = _best([c for c in band_cells if c.mode == md and c.band == b and c.config not in slower_somewhere])
        band_winners.append(_winner(md, "band", b, None, best))
    return Verdicts(alpha, min_effect, family, band_family, tuple(modes), tuple(configs), bands,
                    tuple(cells), tuple(band_cells), tuple(size_winners), tuple(band_winners),
                    excluded, tuple(warnings))


def _in_band(tokens: int | None, rng: list) -> bool:
    if tokens is None:
        return False
    lo, hi = rng
    return (lo is None or tokens >= lo) and (hi is None or tokens <= hi)


def _best(cands: list[Comparison]) -> Comparison | None:
    ok = [c for c in cands if c.verdict == FASTER and c.eligible]
    return min(ok, key=lambda c: (c.ratio, c.config)) if ok else None


def _winner(mode: str, scope: str, key: str, tokens, best: Comparison | None) -> Winner:
    if best is None:
        return Winner(mode, scope, key, tokens, None, None, None, None)
    return Winner(mode, scope, key, tokens, best.config, best.ratio, best.lo, best.hi)


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


def launch_medians(samples, usable: set[int] | None = None) -> list[LaunchMedian]:
    """Per launch x size x mode, the median of the samples (``samples`` is samples.csv as a DataFrame)."""
    if samples is None or len(samples) == 0:
        return []
    df = samples if usable is None else samples[samples["launch"].isin(sorted(usable))]
    g = df.groupby(["config", "launch", "size_bytes", "mode"], sort=False)["time_us"].median()
    return [LaunchMedian(str(c), int(l), int(s), str(m), float(v)) for (c, l, s, m), v in g.items()]


def evaluate_run(data, *, alpha: float = ALPHA, min_effect: float = MIN_EFFECT) -> Verdicts:
    """Verdicts for a loaded run folder (``results.RunData``)."""
    run = data.run
    spec = run.get("spec", {})
    tokens_by_size = {s["bytes"]: s.get("tokens") for s in spec.get("sizes", [])}
    meds = launch_medians(data.samples, usable_launches(run))
    # The spec's modes first, then any other series in the data (e.g. graph-direct, eager-direct).
    modes = list(dict.fromkeys(list(spec.get("modes") or []) + sorted({m.mode for m in meds})))
    return evaluate(meds, configs=[c["name"] for c in run.get("configs", [])],
                    modes=modes, tokens_by_size=tokens_by_size,
                    bands=spec.get("bands") or {}, excluded=exclusions(run, data.summary),
                    alpha=alpha, min_effect=min_effect)


def profile_plan(verdicts: Verdicts, run: dict, source: str, created: str) -> dict[str, tuple[dict, dict]]:
    """Which profile files a run folder gets: {file name: (settings, meta)}.

    ``profile-<band>.env`` for every band with a winner in the primary mode (graph when
    measured); ``profile.env`` is the first band's winner (decode by default), written only
    when that config is not significantly slower in any other band, because NCCL settings
    apply to every size a process sends.  No winner: no file (keep NCCL defaults)."""
    mode = verdicts.primary_mode
    envs = {c["name"]: c.get("env", {}) for c in run.get("configs", [])}  # what was measured, base_env included
    plan: dict[str, tuple[dict, dict]] = {}
    if mode is None:
        return plan
    band_names = list(verdicts.bands)
    for b in band_names:
        w = verdicts.band_winner(b, mode)
        if w is None or w.config is None:
            continue
        meta = {"source": f"{source} (band {b}: config {w.config})", "created": created, "mode": mode,
                "band": f"{b} {verdicts.bands[b]} tokens",
                "speedup": f"ratio {w.ratio:.3f} [{w.lo:.3f}, {w.hi:.3f}] vs default"}
        plan[f"profile-{b}.env"] = ({k: str(v) for k, v in envs.get(w.config, {}).items()}, meta)
    if band_names and f"profile-{band_names[0]}.env" in plan:
        first = verdicts.band_winner(band_names[0], mode)
        hurts = [c.band for c in verdicts.band_cells
                 if c.mode == mode and c.config == first.config and c.band != band_names[0] and c.verdict == SLOWER]
        if not hurts:
            plan["profile.env"] = plan[f"profile-{band_names[0]}.env"]
    return plan
