"""What ``commdiag ab`` prints: per metric and arm median [min-max] n, the verdicts in plain words
(the statistics indented under each, then the arm's confounders), drift, failed launches, the
machine's state during the launches; and the ``--json`` envelope.  Every line fits 100 columns
(long ones wrap with an indent).

JSON history (bump JSON_VERSION on any change of shape): 1: first; 2: ``machine_state`` (recorded,
reason, notes, arms), each verdict's ``confounders``, ``report`` (the HTML file, or null); 3: each verdict's
``rounds_range``, ``failed``, ``default_failed`` (failed launches counted as their worst value) and
``resolution`` (the metric's step relative to its median, or null)."""

from __future__ import annotations

import textwrap

from ..analyse import machinereport, stats
from . import machine, verdict as vmod

WIDTH = 100
JSON_FORMAT, JSON_VERSION = "commdiag-ab-result", 3


def _wrap(text: str, indent: str = "", more: str = "    ") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + more,
                         break_long_words=True, break_on_hyphens=False) or [indent]


def _fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.0f}"


def analyse(run: dict) -> dict:
    """Everything the text and the JSON show, computed once from run.json."""
    spec = run["spec"]
    launches = run["launches"]
    arms = [c["name"] for c in run["configs"] if c["name"] != stats.DEFAULT]
    metrics = [(m["name"], m["better"]) for m in spec["metrics"]]
    summary = []
    drifts = []
    for name, better in metrics:
        for c in [stats.DEFAULT, *arms]:
            seq = sorted((l["round"], l["values"][name]) for l in launches
                         if l["config"] == c and l.get("status") == "ok" and name in (l.get("values") or {}))
            vals = [v for _, v in seq]
            summary.append({"config": c, "metric": name, "better": better, "n": len(vals),
                            "median": stats.median(vals) if vals else None,
                            "min": min(vals) if vals else None, "max": max(vals) if vals else None,
                            "in_time_order": vals})
            d = vmod.drift(seq, spec["min_effect"])
            if d:
                drifts.append({"config": c, "metric": name, "note": d})
    complete = run.get("state") == "complete"
    verdicts = vmod.judge(launches, arms, metrics, spec["min_effect"]) if complete else []
    failed = [{"index": l["index"], "config": l["config"], "round": l["round"], "error": l.get("error", "")}
              for l in launches if l.get("status") == "failed"]
    return {"summary": summary, "verdicts": verdicts, "drift": drifts, "failed": failed,
            "claims": len(arms) * len(metrics), "min_effect": spec["min_effect"], "machine": machine.check(run)}


def confounded_head(v: vmod.Verdict) -> str:
    """How the first confounder under a verdict begins (sweep's words for its claims)."""
    return ("not certified, and confounded: " if v.verdict == vmod.INCONCLUSIVE
            else f"certified {v.verdict}, but confounded: ")


def confounded_lines(a: dict, v: vmod.Verdict, indent: str = "      ") -> list[str]:
    """Under a verdict: the conditions that hit its arm and default differently (ab/machine.py)."""
    return machinereport.confounded_lines(confounded_head(v), a["machine"].for_arm(v.config), indent)


def render_text(run: dict, a: dict) -> str:
    lines: list[str] = []
    by_metric: dict[str, list[dict]] = {}
    for s in a["summary"]:
        by_metric.setdefault(s["metric"], []).append(s)
    for name, rows in by_metric.items():
        lines.append(f"{name} ({rows[0]['better']} is better): median [min-max] over launches")
        w = max(len(r["config"]) for r in rows)
        for r in rows:
            if r["n"]:
                lines += _wrap(f"{r['config']:<{w}}  {_fmt(r['median'])} [{_fmt(r['min'])}-{_fmt(r['max'])}] "
                               f"n={r['n']}   in time order: {' '.join(_fmt(v) for v in r['in_time_order'])}",
                               "  ", " " * (w + 4))
            else:
                lines.append(f"  {r['config']:<{w}}  no successful launch")
    if a["drift"]:
        lines.append("")
        for d in a["drift"]:
            lines += _wrap(f"drift: {d['config']} {d['metric']} {d['note']}")
    if a["failed"]:
        lines.append("")
        lines.append(f"failed launches ({len(a['failed'])}" + ("):" if run.get("stopped")
                                                              else "; the run went on without them):"))
        for f in a["failed"][:20]:
            lines += _wrap(f"launch {f['index']} ({f['config']}, round {f['round'] + 1}): {f['error']}", "  ")
        if len(a["failed"]) > 20:
            lines.append(f"  ... and {len(a['failed']) - 20} more (run.json)")
    if a["verdicts"]:
        lines.append("")
        lines += _wrap(f"verdicts against default (paired within rounds, exact signed-rank test; 1% family-wise "
                       f"over {a['claims']} claim(s), Holm; min_effect {a['min_effect']:.0%}):")
        for v in a["verdicts"]:
            lines += [*_wrap(_plain(v, a["min_effect"]), "  "), *_wrap(_numbers(v, a["claims"]), "      "),
                      *confounded_lines(a, v)]
    lines.append("")
    lines += machinereport.state_lines(a["machine"].run)
    return "\n".join(lines)


def _plain(v: vmod.Verdict, delta: float) -> str:
    if v.verdict in (vmod.BETTER, vmod.WORSE):
        change = abs(v.ratio - 1)
        direction = "higher" if v.ratio > 1 else "lower"
        return (f"{v.config}: {v.metric} is {v.verdict.upper()} than default: {change:.1%} {direction} "
                f"(certified)")
    if v.verdict == vmod.EQUIVALENT:
        return (f"{v.config}: {v.metric} is EQUIVALENT to default: {v.config} does not change it by more "
                f"than {delta:.0%} (certified)")
    need = ("" if not v.rounds else  # no complete round: no noise to estimate rounds from
            f"; about {v.rounds_needed} rounds{_spread(v)} would decide it at this noise" if v.rounds_needed
            else "; the measured effect sits on the margin: no number of rounds decides it reliably"
            if v.noise is not None else "")
    return f"{v.config}: {v.metric} is INCONCLUSIVE{' (' + v.note + ')' if v.note else ''}{need}"


def _spread(v: vmod.Verdict) -> str:
    """How uncertain "about N rounds" is: one run's noise and effect are estimates too."""
    if not v.rounds_range:
        return ""
    lo, hi = v.rounds_range
    return f" (likely {lo}-{hi})" if hi is not None else f" (likely {lo} or more: the effect may sit on the margin)"


def _numbers(v: vmod.Verdict, claims: int) -> str:
    if v.ratio is None:
        return f"{v.rounds} complete round(s)"
    parts = [f"ratio {v.ratio:.4f}"]
    if v.interval:
        parts.append(f"interval {v.interval[0]:.4f}-{v.interval[1]:.4f} "
                     f"({1 - stats.ALPHA / max(claims, 1):.2%})")
    if v.p is not None:
        parts.append(f"p = {v.p:.2g} (Holm threshold {v.threshold:.2g})")
    parts.append(f"{v.rounds} rounds")
    if v.noise is not None:
        parts.append(f"noise {v.noise:.2%} per round")
    if v.verdict == vmod.EQUIVALENT and v.rounds_needed:
        parts.append(f"equivalence at this noise needs about {v.rounds_needed} rounds{_spread(v)}")
    return ", ".join(parts)


def to_json(run_dir, run: dict, a: dict, counts: dict, report=None) -> dict:
    m = a["machine"]
    return {"format": JSON_FORMAT, "version": JSON_VERSION, "run_dir": str(run_dir), "state": run.get("state"),
            "launches": counts, "claims": a["claims"], "alpha": stats.ALPHA, "min_effect": a["min_effect"],
            "summary": a["summary"],
            "verdicts": [{**v.to_json(), "confounders": list(m.for_arm(v.config))} for v in a["verdicts"]],
            "drift": a["drift"], "failed": a["failed"], "machine_state": m.to_json(),
            "report": None if report is None else str(report), "warnings": run.get("warnings", [])}


def counts(run: dict) -> dict[str, int]:
    """Launches per status."""
    out: dict[str, int] = {}
    for l in run.get("launches", []):
        out[l.get("status")] = out.get(l.get("status"), 0) + 1
    return out
