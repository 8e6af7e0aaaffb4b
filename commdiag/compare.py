"""``commdiag compare RUN_A RUN_B``: did the time change between two runs, beyond their noise?

Matches the configs (by name) and sizes/modes present in both run folders and,
per config x size x mode, compares B against A with the verdict method of
stats.py: x = ln(launch median), each run's between-launch noise pooled over all
of that run's configs at the size and mode (each side at least its own), a
Welch-Satterthwaite t interval, Bonferroni over every matched cell, a 3% minimum
effect.  "no significant change" means the difference is inside the noise of
either run.

It also diffs the two environment fingerprints (driver, NCCL, torch, CUDA, GPUs,
topology, host, kernel, ...) and the measurement settings (ranks, dtype, iters,
method), and warns when a matched config's settings differ: those are the usual
hidden causes of an "unreproducible" result.  Stored results only; never measures.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from . import results, stats

COMPARE_FORMAT, COMPARE_VERSION = "commdiag-compare", 1
# Run-level settings that change what a number means (besides the fingerprint).
SETTINGS = ("world_size", "nproc_per_node", "spec.backend", "spec.dtype", "spec.iters", "spec.warmup",
            "spec.batch", "spec.window_us", "spec.vias", "spec.replay_stream", "spec.reuse_process", "spec.nnodes",
            "spec.base_env", "method")


@dataclass(frozen=True)
class Change:
    config: str
    mode: str
    size_bytes: int
    tokens: int | None
    a_us: float  # median of launch medians in run A
    b_us: float
    a_launches: int
    b_launches: int
    ratio: float | None  # B / A: < 1 means B is faster
    lo: float | None
    hi: float | None
    verdict: str  # faster | slower | same | inconclusive (B relative to A)
    more_launches: int | None

    @property
    def label(self) -> str:
        if self.verdict == stats.FASTER:
            return "faster in B"
        if self.verdict == stats.SLOWER:
            return "slower in B"
        if self.verdict == stats.SAME:
            return "no significant change"
        if self.more_launches is None:
            return "inconclusive: launch noise unknown (run at least 3 trials)"
        if self.more_launches > stats.MAX_MORE:
            return f"inconclusive: more than {stats.MAX_MORE} more launches per run needed"
        return f"inconclusive: about {self.more_launches} more launches per run needed"

    def ratio_text(self) -> str:
        if self.ratio is None:
            return "n/a"
        if self.lo is None:
            return f"{self.ratio:.3f}"
        return f"{self.ratio:.3f} [{self.lo:.3f}, {self.hi:.3f}]"


@dataclass(frozen=True)
class Difference:
    key: str
    a: object
    b: object


@dataclass(frozen=True)
class CompareResult:
    run_a: str
    run_b: str
    alpha: float
    min_effect: float
    family_size: int
    changes: tuple[Change, ...]
    fingerprint: tuple[Difference, ...]  # environment fingerprint differences
    settings: tuple[Difference, ...]  # measurement settings and config env differences
    only_a: tuple[str, ...]  # configs only in A
    only_b: tuple[str, ...]

    @property
    def warnings(self) -> list[str]:
        out = [f"environment differs: {d.key}: {d.a!r} (A) vs {d.b!r} (B)" for d in self.fingerprint]
        out += [f"settings differ: {d.key}: {d.a!r} (A) vs {d.b!r} (B)" for d in self.settings]
        if not self.changes:
            out.append("no config, size and mode is present in both runs: nothing to compare")
        return out

    def to_json(self) -> dict:
        return {"format": COMPARE_FORMAT, "version": COMPARE_VERSION, "run_a": self.run_a, "run_b": self.run_b,
                "method": {"alpha_familywise": self.alpha, "min_effect": self.min_effect,
                           "family_size": self.family_size},
                "changes": [{**asdict(c), "label": c.label} for c in self.changes],
                "fingerprint_differences": [asdict(d) for d in self.fingerprint],
                "settings_differences": [asdict(d) for d in self.settings],
                "only_in_a": list(self.only_a), "only_in_b": list(self.only_b), "warnings": self.warnings}


def flatten(d, prefix: str = "") -> dict[str, object]:
    """Nested dicts/lists as dotted keys (lists by index): what a fingerprint diff compares."""
    out: dict[str, object] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(d, list) and any(isinstance(v, (dict, list)) for v in d):
        for i, v in enumerate(d):
            out.update(flatten(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = d
    return out


def diff(a: dict, b: dict) -> list[Difference]:
    fa, fb = flatten(a), flatten(b)
    return [Difference(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


def _pick(run: dict, key: str):
    v = run
    for part in key.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return v


def compare(a: results.RunData, b: results.RunData, *, alpha: float = stats.ALPHA,
            min_effect: float = stats.MIN_EFFECT) -> CompareResult:
    """Compare run B against run A (pure: loaded runs in, a result out)."""
    def groups(data):
        g: dict[tuple[str, int], dict[str, list[float]]] = {}
        raw: dict[tuple[str, int, str], list[float]] = {}
        for m in stats.launch_medians(data.samples, stats.usable_launches(data.run)):
            if m.median_us > 0:
                g.setdefault((m.mode, m.size_bytes), {}).setdefault(m.config, []).append(math.log(m.median_us))
                raw.setdefault((m.mode, m.size_bytes, m.config), []).append(m.median_us)
        return g, raw

    ga, raw_a = groups(a)
    gb, raw_b = groups(b)
    tokens = {s["bytes"]: s.get("tokens") for r in (a, b) for s in r.run.get("spec", {}).get("sizes", [])}
    names_a = [c["name"] for c in a.run.get("configs", [])]
    names_b = [c["name"] for c in b.run.get("configs", [])]
    cells = [(md, s, c) for (md, s) in sorted(set(ga) & set(gb), key=lambda k: (k[0], k[1]))
             for c in names_a if c in ga[(md, s)] and c in gb[(md, s)]]
    upper = alpha / (2 * max(len(cells), 1))
    changes = []
    for md, s, c in cells:
        na, nb = stats.pooled_noise(ga[(md, s)]), stats.pooled_noise(gb[(md, s)])
        ratio, lo, hi, verdict, more = stats.compare_independent(gb[(md, s)][c], nb, ga[(md, s)][c], na, upper,
                                                                 min_effect)
        changes.append(Change(c, md, s, tokens.get(s), stats._median(raw_a[(md, s, c)]),
                              stats._median(raw_b[(md, s, c)]), len(ga[(md, s)][c]), len(gb[(md, s)][c]),
                              ratio, lo, hi, verdict, more))
    settings = [Difference(k, _pick(a.run, k), _pick(b.run, k)) for k in SETTINGS
                if _pick(a.run, k) != _pick(b.run, k)]
    env_a = {c["name"]: c.get("env", {}) for c in a.run.get("configs", [])}
    env_b = {c["name"]: c.get("env", {}) for c in b.run.get("configs", [])}
    for c in names_a:
        if c in env_b and env_a[c] != env_b[c]:
            settings.append(Difference(f"configs.{c}.env", env_a[c], env_b[c]))
    return CompareResult(str(a.path), str(b.path), alpha, min_effect, len(cells), tuple(changes),
                         tuple(diff(a.run.get("fingerprint", {}), b.run.get("fingerprint", {}))), tuple(settings),
                         tuple(c for c in names_a if c not in names_b), tuple(c for c in names_b if c not in names_a))


def run(run_a: str | Path, run_b: str | Path) -> CompareResult:
    return compare(results.load_run(run_a), results.load_run(run_b))


def render_text(r: CompareResult) -> str:
    lines = [f"A: {r.run_a}", f"B: {r.run_b}",
             f"B vs A ({100 * (1 - r.alpha):.0f}% family-wise over {r.family_size} comparisons; minimum effect "
             f"{r.min_effect * 100:.0f}%; ratio < 1: B is faster)",
             f"{'mode':>5} {'size(B)':>12} {'tokens':>6} {'config':<28} {'A(us)':>10} {'B(us)':>10} "
             f"{'ratio B/A [interval]':>26} {'launches':>8}  verdict"]
    for c in r.changes:
        lines.append(f"{c.mode:>5} {c.size_bytes:>12} {'' if c.tokens is None else c.tokens:>6} {c.config[:28]:<28} "
                     f"{c.a_us:>10.2f} {c.b_us:>10.2f} {c.ratio_text():>26} "
                     f"{f'{c.a_launches}/{c.b_launches}':>8}  {c.label}")
    if r.only_a or r.only_b:
        lines.append(f"configs only in A: {', '.join(r.only_a) or '-'}; only in B: {', '.join(r.only_b) or '-'}")
    for w in r.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def build_html(r: CompareResult) -> str:
    from . import report

    esc = report.esc
    figs = []
    for mode in sorted({c.mode for c in r.changes}):
        data = []
        for i, cfg in enumerate(dict.fromkeys(c.config for c in r.changes if c.mode == mode)):
            cs = [c for c in r.changes if c.mode == mode and c.config == cfg and c.ratio is not None]
            has = [c for c in cs if c.lo is not None]
            data.append({"type": "scatter", "mode": "lines+markers", "name": esc(cfg),
                         "x": [c.size_bytes for c in has], "y": [c.ratio for c in has],
                         "line": {"color": report.PALETTE[i % len(report.PALETTE)]},
                         "error_y": {"type": "data", "symmetric": False,
                                     "array": [c.hi - c.ratio for c in has],
                                     "arrayminus": [c.ratio - c.lo for c in has]},
                         "text": [esc(c.label) for c in has],
                         "hovertemplate": esc(cfg) + "<br>%{x} B: B/A %{y:.3f}<br>%{text}<extra></extra>"})
        figs.append({"id": f"ratio-{mode}", "title": f"B / A per config ({mode})", "data": data,
                     "layout": report._layout(f"Time in B / time in A, {mode} mode (bars: interval; 1 = no change)",
                                              report._axis("size per rank (bytes)"), report._axis("B / A", log=True))})
    rows = [[c.config, c.mode, report.size_label(c.size_bytes, c.tokens), f"{c.a_us:.2f}", f"{c.b_us:.2f}",
             c.ratio_text(), f"{c.a_launches}/{c.b_launches}", c.label] for c in r.changes]
    body = [f"<h1>commdiag compare</h1><p>A: {esc(r.run_a)}<br>B: {esc(r.run_b)}</p>",
            f"<p>B vs A: {100 * (1 - r.alpha):.0f}% family-wise over {r.family_size} comparisons, minimum effect "
            f"{r.min_effect * 100:.0f}%; the noise is each run's own between-launch noise.</p>"]
    if r.warnings:
        body.append("<h2>Warnings</h2><ul class=\"warn\">" + "".join(f"<li>{esc(w)}</li>" for w in r.warnings)
                    + "</ul>")
    body.append("<h2>Plots</h2>" + report.plot_divs(figs))
    body.append("<h2>Per config, size and mode</h2>")
    body.append(report._table(["config", "mode", "size", "A (us)", "B (us)", "ratio B/A [interval]",
                               "launches A/B", "verdict"], rows))
    body.append("<h2>Environment fingerprints</h2>")
    body.append(report._table(["key", "A", "B"], [[d.key, json.dumps(d.a), json.dumps(d.b)] for d in r.fingerprint]
                              or [["(identical)", "", ""]]))
    if r.settings:
        body.append(report._table(["setting", "A", "B"], [[d.key, json.dumps(d.a), json.dumps(d.b)] for d in r.settings]))
    return report.page(f"commdiag compare: {Path(r.run_a).name} vs {Path(r.run_b).name}",
                       "\n".join(body), figs)
