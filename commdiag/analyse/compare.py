"""``commdiag compare RUN_A RUN_B``: did the time change between two runs, beyond their noise?

Matches the configs (by name) and sizes/modes present in both run folders and,
per config x size x mode, tests B against A the way verdicts are certified
(stats.py): the launch is the unit (each launch's trimmed mean of ln time), the
exact two-sided Wilcoxon-Mann-Whitney test on A's launches against B's,
Bonferroni over every matched cell, the Hodges-Lehmann ratio, and a 3% minimum
effect.  A change is "certified" only when p <= 1%/m and the ratio is at least
3% away from 1.  With few launches the exact test cannot get there at all (3
against 3 launches: the smallest attainable p is 0.1), and the line says so with
that smallest p, instead of a verdict.

Why unpaired, when stage 2 of a sweep is paired (paired.py): the launches of run A and
run B were never randomized against each other (different times, often different
machines or versions), so no round pairs a launch of A with one of B.  Inside each run a
config's launches sit at places shuffled independently in every round, so each run's
launches of a config are exchangeable draws of that run: what the unpaired rank test
needs.  It cannot say why a cell changed: anything that differs between the runs counts.

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

from ..errors import CommdiagError
from ..formats import results
from . import celltime, stats

COMPARE_FORMAT, COMPARE_VERSION = "commdiag-compare", 2
# Run-level settings that change what a number means (besides the fingerprint).
SETTINGS = ("world_size", "nproc_per_node", "spec.backend", "spec.dtype", "spec.iters", "spec.warmup",
            "spec.batch", "spec.window_us", "spec.time_per_size_ms", "spec.vias", "spec.replay_stream", "spec.reuse_process", "spec.nnodes",
            "spec.base_env", "method")


@dataclass(frozen=True)
class Change:
    config: str
    mode: str
    size_bytes: int
    tokens: int | None
    a_us: float  # run A's gmean: the geometric mean of its launch values (celltime.py, as the sweep table)
    b_us: float
    a_launches: int
    b_launches: int
    ratio: float | None  # B / A (Hodges-Lehmann): < 1 means B is faster
    p: float | None  # exact two-sided rank test, A's launches against B's
    p_floor: float  # the smallest p attainable with these launch counts
    threshold: float  # what p must reach: ALPHA / m
    verdict: str  # faster | slower | same | not certified (B relative to A)

    @property
    def label(self) -> str:
        if self.verdict == FASTER:
            return f"certified faster in B (p = {self.p:.2g})"
        if self.verdict == SLOWER:
            return f"certified slower in B (p = {self.p:.2g})"
        if self.verdict == SAME:
            return f"real but below 3% (p = {self.p:.2g})"
        if self.p is None:
            return "not certified: no launches"
        if self.p_floor > self.threshold:
            return (f"not certified: p = {self.p:.2g} with {self.a_launches} vs {self.b_launches} launches, and the "
                    f"smallest attainable is {self.p_floor:.2g} (needs <= {self.threshold:.2g}: about "
                    f"{stats.launches_to_reach(self.threshold)} launches per run)")
        return f"not certified: p = {self.p:.2g} (needs <= {self.threshold:.2g})"

    def ratio_text(self) -> str:
        return "n/a" if self.ratio is None else f"{self.ratio:.3f}"


FASTER, SLOWER, SAME, NOT_CERTIFIED = "faster", "slower", "same", "not certified"


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
    same_run: bool = False  # B is a copy of A's run folder (same start time and seed)

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
                           "family_size": self.family_size,
                           "test": "exact two-sided Wilcoxon-Mann-Whitney on launch values, Bonferroni over cells"},
                "changes": [{**asdict(c), "label": c.label} for c in self.changes],
                "fingerprint_differences": [asdict(d) for d in self.fingerprint],
                "settings_differences": [asdict(d) for d in self.settings],
                "only_in_a": list(self.only_a), "only_in_b": list(self.only_b), "same_run": self.same_run,
                "warnings": self.warnings}


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
        g: dict[tuple[str, int, str], list[float]] = {}
        for v in stats.launch_values(data.samples, stats.usable_launches(data.run)):
            g.setdefault((v.mode, v.size_bytes, v.config), []).append(v.value)
        return g

    ga, gb = groups(a), groups(b)
    tokens = {s["bytes"]: s.get("tokens") for r in (a, b) for s in r.run.get("spec", {}).get("sizes", [])}
    names_a = [c["name"] for c in a.run.get("configs", [])]
    names_b = [c["name"] for c in b.run.get("configs", [])]
    keys = sorted({(md, s) for (md, s, _) in ga} & {(md, s) for (md, s, _) in gb})
    cells = [(md, s, c) for (md, s) in keys for c in names_a if (md, s, c) in ga and (md, s, c) in gb]
    thr = alpha / max(len(cells), 1)
    changes = []
    for md, s, c in cells:
        xa, xb = ga[(md, s, c)], gb[(md, s, c)]
        p = stats.rank_test(xb, xa, stats.TWO_SIDED)
        ratio = math.exp(stats.hodges_lehmann(xb, xa))
        verdict = NOT_CERTIFIED
        if p <= thr:
            verdict = (FASTER if ratio <= 1 - min_effect else SLOWER if ratio >= 1 + min_effect
                       else SAME)
        changes.append(Change(c, md, s, tokens.get(s), celltime.gmean(xa), celltime.gmean(xb),
                              len(xa), len(xb), ratio, p, stats.smallest_p(len(xa), len(xb)), thr, verdict))
    settings = [Difference(k, _pick(a.run, k), _pick(b.run, k)) for k in SETTINGS
                if _pick(a.run, k) != _pick(b.run, k)]
    env_a = {c["name"]: c.get("env", {}) for c in a.run.get("configs", [])}
    env_b = {c["name"]: c.get("env", {}) for c in b.run.get("configs", [])}
    for c in names_a:
        if c in env_b and env_a[c] != env_b[c]:
            settings.append(Difference(f"configs.{c}.env", env_a[c], env_b[c]))
    same = all(a.run.get(k) is not None and a.run.get(k) == b.run.get(k) for k in ("created_utc", "seed"))
    return CompareResult(str(a.path), str(b.path), alpha, min_effect, len(cells), tuple(changes),
                         tuple(diff(a.run.get("fingerprint", {}), b.run.get("fingerprint", {}))), tuple(settings),
                         tuple(c for c in names_a if c not in names_b), tuple(c for c in names_b if c not in names_a),
                         same)


def run(run_a: str | Path, run_b: str | Path) -> CompareResult:
    """Compare two run folders; the same folder twice is a usage error (exit 2): a run against
    itself can only come out unchanged, which is never what was meant."""
    a, b = results.load_run(run_a), results.load_run(run_b)
    if _same_folder(run_a, run_b):
        raise CommdiagError(f"{run_b}: the same run folder as A ({run_a}): a run compared with itself cannot "
                            "change; give two run folders, e.g. before and after a change")
    return compare(a, b)


def _same_folder(a, b) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve() or Path(a).samefile(b)
    except OSError:
        return False


def conclusion(r: CompareResult) -> str:
    """The answer in one line, before the cells: what changed from A to B, or that nothing could be
    shown to, and why (too few launches) when that is the reason."""
    n = len(r.changes)
    faster = [c for c in r.changes if c.verdict == FASTER]
    slower = [c for c in r.changes if c.verdict == SLOWER]
    if faster or slower:
        def cells(cs):
            return ", ".join(f"{c.config} {c.size_bytes} B {c.mode} {c.ratio_text()}" for c in cs[:3]) + (
                f" (+{len(cs) - 3} more)" if len(cs) > 3 else "")
        parts = ([f"B certified faster in {len(faster)} cell(s): {cells(faster)}"] if faster else []) + (
            [f"B certified slower in {len(slower)} cell(s): {cells(slower)}"] if slower else [])
        return f"conclusion ({n} cells): " + "; ".join(parts)
    short = sum(1 for c in r.changes if c.verdict == NOT_CERTIFIED and c.p is not None and c.p_floor > c.threshold)
    why = f" ({short} with too few launches to certify: note below)" if short else ""
    return f"conclusion: no certified change in {n} cells{why}"


def render_text(r: CompareResult) -> str:
    """The console table: per cell A's and B's gmean (the number the sweep table shows for that cell)
    and the Hodges-Lehmann ratio, with the answer on the line under it (100 columns)."""
    lines = [f"A: {r.run_a}", f"B: {r.run_b}", conclusion(r)]
    if r.same_run:
        lines.append("note: B holds the same run as A (a copy: same start time and seed), so nothing can differ")
    lines += [f"B vs A: exact rank test per cell on launch values, {100 * (1 - r.alpha):.0f}% family-wise over "
              f"{r.family_size} cells (each p <= {r.alpha / max(r.family_size, 1):.2g}); minimum effect "
              f"{r.min_effect * 100:.0f}%",
              f"A, B: {celltime.NAME} (us) of each run's launch values, as the sweep table shows them; B/A: the "
              "Hodges-Lehmann ratio of B's launches to A's (< 1: B is faster)",
              f"{'mode':>13} {'size(B)':>10} {'config':<28} {'A(us)':>9} {'B(us)':>9} {'B/A':>6} {'launches':>8}",
              f"{'':>14}answer"]
    floors = {}  # (A launches, B launches, threshold) -> smallest attainable p: said once, below the table
    for c in r.changes:
        lines.append(f"{c.mode:>13} {c.size_bytes:>10} {_fit(c.config):<28} {c.a_us:>9.2f} {c.b_us:>9.2f} "
                     f"{c.ratio_text():>6} {f'{c.a_launches}/{c.b_launches}':>8}")
        if c.verdict == NOT_CERTIFIED and c.p is not None and c.p_floor > c.threshold:
            floors[(c.a_launches, c.b_launches, c.threshold)] = c.p_floor
            lines.append(f"{'':>14}not certified: p = {c.p:.2g}, and {c.a_launches} vs {c.b_launches} launches "
                         f"cannot reach {c.threshold:.2g} (note below)")
        else:
            lines.append(f"{'':>14}{c.label}")
    for (na, nb, thr), floor in floors.items():
        lines.append(f"note: with {na} vs {nb} launches the smallest p the exact test can give is {floor:.2g}, "
                     f"above the {thr:.2g} needed: about {stats.launches_to_reach(thr)} launches of such a cell "
                     "in each of A and B could certify a change (the run with fewer launches limits it)")
    if r.only_a or r.only_b:
        lines.append(f"configs only in A: {', '.join(r.only_a) or '-'}; only in B: {', '.join(r.only_b) or '-'}")
    for w in r.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def _fit(name: str) -> str:
    from .report import _fit as fit

    return fit(name, 28)


def build_html(r: CompareResult) -> str:
    from . import report

    esc = report.esc
    figs = []
    for mode in sorted({c.mode for c in r.changes}):
        data = []
        for i, cfg in enumerate(dict.fromkeys(c.config for c in r.changes if c.mode == mode)):
            has = [c for c in r.changes if c.mode == mode and c.config == cfg and c.ratio is not None]
            data.append({"type": "scatter", "mode": "lines+markers", "name": report.plot_text(cfg),
                         "x": [c.size_bytes for c in has], "y": [c.ratio for c in has],
                         "line": {"color": report.PALETTE[i % len(report.PALETTE)]},
                         "text": [report.plot_text(c.label) for c in has],
                         "hovertemplate": report.plot_text(cfg) + "<br>%{x} B: B/A %{y:.3f}<br>%{text}<extra></extra>"})
        figs.append({"id": f"ratio-{mode}", "title": f"B / A per config ({mode})", "data": data,
                     "layout": report._layout(f"Time in B / time in A (Hodges-Lehmann), {mode} mode (1 = no change)",
                                              report._axis("size per rank (bytes)", as_bytes=True,
                                                           values=[x for t in data for x in t["x"]]),
                                              report._axis("B / A", values=[y for t in data for y in t["y"]]))})
    rows = [[c.config, c.mode, report.size_label(c.size_bytes, c.tokens), f"{c.a_us:.2f}", f"{c.b_us:.2f}",
             c.ratio_text(), f"{c.a_launches}/{c.b_launches}", c.label] for c in r.changes]
    body = [f"<h1>commdiag compare</h1><p>A: {esc(r.run_a)}<br>B: {esc(r.run_b)}</p>",
            f"<p>B vs A: exact rank test per cell on the launches of each run, {100 * (1 - r.alpha):.0f}% "
            f"family-wise over {r.family_size} cells, minimum effect {r.min_effect * 100:.0f}%.</p>"]
    if r.warnings:
        body.append("<h2>Warnings</h2><ul class=\"warn\">" + "".join(f"<li>{esc(w)}</li>" for w in r.warnings)
                    + "</ul>")
    if r.only_a or r.only_b:
        body.append(f"<p>configs only in A: {esc(', '.join(r.only_a) or '-')}; only in B: "
                    f"{esc(', '.join(r.only_b) or '-')}</p>")
    body.append("<h2>Plots</h2>" + report.plot_divs(figs))
    body.append("<h2>Per config, size and mode</h2>")
    body.append(f"<p>A, B: {esc(celltime.NAME)} (us) of each run's launch values, as the sweep table and the "
                "report show them; B/A: the Hodges-Lehmann ratio of B's launches to A's.</p>")
    body.append(report._table(["config", "mode", "size", f"A {celltime.NAME} (us)", f"B {celltime.NAME} (us)",
                               "B/A (Hodges-Lehmann)", "launches A/B", "answer"], rows))
    body.append("<h2>Environment fingerprints</h2>")
    body.append(report._table(["key", "A", "B"], [[d.key, json.dumps(d.a), json.dumps(d.b)] for d in r.fingerprint]
                              or [["(identical)", "", ""]]))
    if r.settings:
        body.append(report._table(["setting", "A", "B"], [[d.key, json.dumps(d.a), json.dumps(d.b)] for d in r.settings]))
    return report.page(f"commdiag compare: {Path(r.run_a).name} vs {Path(r.run_b).name}",
                       "\n".join(body), figs)
