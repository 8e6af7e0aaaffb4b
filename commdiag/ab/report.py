"""An ab run's ``report.html``: the verdicts with their intervals, every launch in time order.

``commdiag report RUN_DIR`` on an ab run folder (and ``commdiag ab`` at the end of a complete run)
writes it; it never measures: run.json in, one HTML file out (``RUN_DIR/report.html`` unless
``--out``).  The page is the sweep report's (analyse/report.py): the same writer, escaping, CSS,
embedded plotly.js, glossary and docs links; every label and value is escaped there, in the HTML and
in the plot JSON alike, and colour marks certified results only (better, worse, equivalent).

Plots: per metric, every successful launch's value in the order the launches ran, one series per
arm (a drifting baseline shows as a slope); the verdicts' ratios with their intervals against the
+-min_effect band.  Tables: the verdicts (with the arm's confounders), median [min-max] per arm,
drift, failed launches with their error tails, every launch, the machine during the launches,
configs, fingerprint and spec.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import __version__, readfile
from ..analyse import machinereport, report as page_mod, stats
from ..analyse.report import PALETTE, doc_link, esc, plot_text
from ..atomic import write_text
from . import render, runfile, verdict as vmod

# glossary entries for the words the verdicts use (docs/glossary.md anchors)
TERMS = (("equivalent", "equivalent"), ("paired test", "paired-test"), ("signed-rank", "signed-rank"),
         ("Hodges-Lehmann ratio", "hodges-lehmann"), ("smallest attainable p", "smallest-attainable-p"),
         ("power", "power"), ("Spearman", "spearman"))
# colour only where a verdict is certified (the sweep report's classes)
VERDICT_CLASS = {vmod.BETTER: "faster", vmod.WORSE: "slower", vmod.EQUIVALENT: "equivalent"}
# the sweep page's CSS has no class for an equivalence (sweep certifies none): its colour, as in the plot
EXTRA_CSS = "<style>.equivalent{background:#dbe9f6}</style>"
VERDICT_COLOUR = {vmod.BETTER: "#2ca02c", vmod.WORSE: "#d62728", vmod.EQUIVALENT: "#1f77b4"}
UNCERTIFIED_COLOUR = "#9a9a9a"


def _fmt(v) -> str:
    return "" if v is None else render._fmt(v)


def figures(run: dict, a: dict) -> list[dict]:
    """Per metric: every launch's value in time order per arm; then the verdicts' intervals."""
    names = [c["name"] for c in run.get("configs", [])]
    colour = {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(names)}
    figs = []
    for m in run.get("spec", {}).get("metrics", []):
        metric = m.get("name")
        data = []
        for c in names:
            pts = sorted((l["index"], l["round"], l["values"][metric]) for l in run.get("launches", [])
                         if l.get("config") == c and l.get("status") == "ok" and metric in (l.get("values") or {}))
            if not pts:
                continue
            name = plot_text(c)
            data.append({"type": "scatter", "mode": "lines+markers", "name": name,
                         "x": [p[0] for p in pts], "y": [p[2] for p in pts],
                         "text": [f"launch {p[0]}, round {p[1] + 1}" for p in pts],
                         "line": {"color": colour[c], "width": 1}, "marker": {"color": colour[c], "size": 7},
                         "hovertemplate": f"{name} %{{text}}<br>%{{y:.4g}}<extra></extra>"})
        title = f"{metric} ({m.get('better')} is better): each launch in the order they ran"
        figs.append({"id": f"launches-{len(figs)}", "title": title, "data": data,
                     "layout": page_mod.layout(title, page_mod.axis("launch (in the order they ran)", log=False),
                                               page_mod.axis(str(metric), log=False))})
    if a["verdicts"]:
        figs.append(_intervals(a))
    return figs


def _intervals(a: dict) -> dict:
    """Each verdict's ratio (arm / default) and interval, with the +-min_effect band and 1 marked."""
    data, xs = [], []
    for v in a["verdicts"]:
        if v.ratio is None:
            continue
        x = plot_text(f"{v.config}: {v.metric}")
        xs.append(x)
        lo, hi = v.interval if v.interval else (v.ratio, v.ratio)
        data.append({"type": "scatter", "mode": "markers", "showlegend": False, "x": [x], "y": [v.ratio],
                     "error_y": {"type": "data", "symmetric": False, "array": [hi - v.ratio],
                                 "arrayminus": [v.ratio - lo], "color": VERDICT_COLOUR.get(v.verdict, UNCERTIFIED_COLOUR)},
                     "marker": {"size": 10, "color": VERDICT_COLOUR.get(v.verdict, UNCERTIFIED_COLOUR)},
                     "text": [plot_text(render._plain(v, a["min_effect"]))],
                     "hovertemplate": "%{text}<br>ratio %{y:.4f}<extra></extra>"})
    delta = a["min_effect"]
    title = (f"Ratio to default with its interval; grey band: within +-{delta:.0%} (coloured: certified, "
             "grey: inconclusive)")
    lay = page_mod.layout(title, {"type": "category"}, page_mod.axis("arm / default", log=False))
    lay["shapes"] = [{"type": "rect", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": 1 - delta, "y1": 1 + delta,
                      "fillcolor": "#e4e4e4", "opacity": 0.6, "line": {"width": 0}, "layer": "below"},
                     {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": 1, "y1": 1,
                      "line": {"color": "#7f7f7f", "width": 1, "dash": "dot"}}]
    return {"id": "intervals", "title": "Verdicts: ratio to default and interval", "data": data, "layout": lay}


def _verdict_rows(a: dict) -> list[list[str]]:
    rows = []
    for v in a["verdicts"]:
        cls = VERDICT_CLASS.get(v.verdict, "")
        answer = f"<span class=\"{cls}\">{esc(render._plain(v, a['min_effect']))}</span>" if cls else \
            esc(render._plain(v, a["min_effect"]))
        reasons = a["machine"].for_arm(v.config)  # whole sentences here: the page wraps them itself
        head = render.confounded_head(v)
        answer += "".join(f"<br><span class=\"bad\">{esc((head if i == 0 else 'and: ') + why)}</span>"
                          for i, why in enumerate(reasons))
        rows.append([esc(v.config), esc(v.metric), answer, esc("" if v.ratio is None else f"{v.ratio:.4f}"),
                     esc(f"{v.interval[0]:.4f}-{v.interval[1]:.4f}" if v.interval else ""),
                     esc("" if v.p is None else f"{v.p:.2g} ({v.threshold:.2g})"), esc(v.rounds),
                     esc("" if v.noise is None else f"{v.noise:.2%}"), esc(v.rounds_needed or "")])
    return rows


def build_html(run: dict, a: dict, run_dir: Path) -> str:
    spec = run.get("spec", {})
    figs = figures(run, a)
    counts = render.counts(run)
    level = 1 - stats.ALPHA / max(a["claims"], 1)
    b = [EXTRA_CSS, f"<h1>commdiag ab report: {esc(spec.get('name'))}</h1>", f"<p>{esc(spec.get('description'))}</p>",
         page_mod.table(["run folder", "spec file", "created (UTC)", "finished (UTC)", "state", "launches", "rounds",
                         "min_effect", "seed"],
                        [[str(run_dir), run.get("spec_file"), run.get("created_utc"), run.get("finished_utc"),
                          run.get("state"), ", ".join(f"{v} {k}" for k, v in sorted(counts.items())),
                          spec.get("rounds"), f"{a['min_effect']:.0%}", run.get("seed")]]),
         f"<p>Your command ran once per arm in every round, in an order shuffled within the round; each "
         f"verdict compares an arm with default over the rounds where both launches succeeded "
         f"({doc_link('ab.md')}): the exact Wilcoxon signed-rank test on the rounds' log-ratios, their "
         f"Hodges-Lehmann ratio and its exact interval at {level:.2%}; {esc(a['claims'])} claim(s) (metrics x "
         f"arms) at {stats.ALPHA:.0%} family-wise (Holm). Better or worse: p within its threshold and the whole "
         f"interval beyond +-{a['min_effect']:.0%}; equivalent: the whole interval within it; inconclusive: "
         "neither, with the rounds that would decide it.</p>"]
    if run.get("warnings"):
        b.append("<ul class=\"warn\">" + "".join(f"<li>{esc(w)}</li>" for w in run["warnings"]) + "</ul>")
    b.append("<h2>Verdicts</h2>")
    b.append("<p>Terms (" + doc_link("glossary.md") + "): "
             + ", ".join(doc_link("glossary.md", anchor, term) for term, anchor in TERMS) + ".</p>")
    if a["verdicts"]:
        b.append(page_mod.table(["config", "metric", "answer", "ratio", f"interval ({level:.2%})",
                                 "p (Holm threshold)", "rounds", "noise per round", "rounds needed"],
                                _verdict_rows(a), raw_cells=True))
    else:
        b.append(f"<p><b>No verdicts</b>: the run is {esc(run.get('state'))}; verdicts need every launch "
                 f"(commdiag ab --resume {esc(run_dir)}).</p>")
    if a["drift"]:
        b.append("<ul class=\"warn\">" + "".join(f"<li>drift: {esc(d['config'])} {esc(d['metric'])} "
                                                 f"{esc(d['note'])}</li>" for d in a["drift"]) + "</ul>")
    b.append("<h2>Per arm: median [min-max] over launches</h2>")
    b.append(page_mod.table(["metric", "better", "config", "median", "min-max", "launches", "values in time order"],
                            [[s["metric"], s["better"], s["config"], _fmt(s["median"]),
                              f"{_fmt(s['min'])}-{_fmt(s['max'])}" if s["n"] else "", s["n"],
                              " ".join(_fmt(v) for v in s["in_time_order"])] for s in a["summary"]]))
    b.append("<h2>Plots</h2>")
    b.append(page_mod.plot_divs(figs))
    b.append(f"<h2>Failed launches ({len(a['failed'])})</h2>")
    failed = [l for l in run.get("launches", []) if l.get("status") == runfile.FAILED]
    if failed:
        b.append(page_mod.table(["launch", "config", "round", "error", "tail (stderr, server log)"],
                                [[esc(l.get("index")), esc(l.get("config")), esc(_round(l)), esc(l.get("error")),
                                  f"<details><summary>show</summary><pre>{esc(l.get('tail'))}</pre></details>"]
                                 for l in failed], raw_cells=True))
    else:
        b.append("<p>None.</p>")
    b.append("<h2>Every launch</h2>")
    b.append(_launch_table(run))
    b.append("<h2>The machine during the launches</h2>")
    b.append(machinereport.html_section(run, None, stages=False).replace(
        "of a claim differently marks the claim", "of a verdict differently marks the verdict"))
    b.append("<h2>Configs</h2>")
    b.append(page_mod.table(["config", "settings (on top of base_env)"],
                            [[c.get("name"), " ".join(f"{k}={v}" for k, v in (c.get("overrides") or {}).items())]
                             for c in run.get("configs", [])]))
    b.append("<h2>Environment fingerprint</h2>")
    b.append(f"<pre>{esc(json.dumps(run.get('fingerprint'), indent=1))}</pre>")
    b.append("<h2>Spec</h2>")
    b.append(f"<pre>{esc(json.dumps(run.get('spec_given', spec), indent=1))}</pre>")
    b.append(f"<p><small>commdiag {esc(__version__)}</small></p>")
    return page_mod.page(f"commdiag ab report: {spec.get('name')}", "\n".join(b), figs)


def _round(l: dict):
    r = l.get("round")
    return r + 1 if isinstance(r, int) else r


def _launch_table(run: dict) -> str:
    """Every launch: its arm, round, outcome, times, values and NCCL proof, in the order they ran."""
    rows = []
    for l in run.get("launches", []):
        proof = l.get("nccl_proof")
        rows.append([l.get("index"), l.get("config"), _round(l), l.get("status"), l.get("started_utc"),
                     l.get("wall_s"), l.get("command_s"), l.get("server_ready_s"),
                     ", ".join(f"{k}={_fmt(v)}" for k, v in (l.get("values") or {}).items()),
                     "" if not isinstance(proof, dict) else
                     f"{proof.get('processes')} process(es), {proof.get('nranks')} ranks"])
    return ("<details><summary>show (" + esc(len(rows)) + ")</summary>"
            + page_mod.table(["launch", "config", "round", "status", "started (UTC)", "wall (s)", "command (s)",
                              "server ready (s)", "values", "NCCL proof"], rows) + "</details>")


def write_report(run_dir: str | Path, out: str | Path | None = None, run: dict | None = None,
                 a: dict | None = None) -> tuple[Path, dict]:
    """``report.html`` of an ab run folder (``out``: another file); (its path, the analysis)."""
    run = run or runfile.load(run_dir)
    a = a or render.analyse(run)
    path = Path(out) if out else Path(run_dir) / "report.html"
    write_text(path, build_html(run, a, Path(run_dir)))
    return path, a


def is_ab_run(run_dir: str | Path) -> bool:
    """Whether RUN_DIR/run.json is an ab run (its format says so); anything unreadable is not."""
    try:
        return json.loads(readfile.read_text(Path(run_dir) / "run.json", what="run folder")).get("format") == runfile.RUN_FORMAT
    except (OSError, ValueError, AttributeError, RecursionError):
        return False
