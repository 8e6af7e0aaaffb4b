"""What a finished run folder publishes: ``report.html`` and the winner profiles.

``commdiag report RUN_DIR`` never measures: run.json + samples.csv + summary.csv
in, one HTML file out (``RUN_DIR/report.html`` unless ``--out``).  ``commdiag
sweep`` calls ``publish`` at its end, which also writes the profiles.

The report starts with the certified answer (stage 2: one row per claim, with
every fresh launch's value, and the winners), then the screening estimates per
band.  Plots, per measured mode: latency vs size per config (log-log, every
launch's value as a point so the launch noise is visible), busbw vs size, the
screening estimates vs default as a heatmap (estimates grey, a cell coloured
only where that difference was certified); stage 2's launches per claim; with both modes, the
eager - graph overhead per config.  Then the screening matrix, failed/timed-out/
incorrect launches with their error tails, what each rank saw and what NCCL said
it applied, the fingerprint and the spec.

plotly.js is embedded in the file (about 4.8 MB), not a sibling file: a report
is mailed, attached to issues and copied out of run folders on its own, and a
sibling script breaks silently the first time that happens.  The cost is size,
not speed: the browser parses the bundle once, and the plot data stays small
because the plots carry launch values, never raw samples (a 50-config x 20-size
x 2-mode run is 6,000 points).

Escaping: every label, env value and error text goes through ``html.escape``,
in the HTML and in plot labels alike (plotly.js renders a subset of HTML in
names and hover text, and decodes entities back to plain characters); the plot
data travels as JSON in a ``<script type="application/json">`` block with
``<``, ``>`` and ``&`` escaped, so no config name can close the script.

Profiles (``write_profiles``; which files and why: ``verdict.profile_plan``):
``profile-<band>.env`` per band with a certified winner in the primary mode,
``profile.env`` = the first band's winner (decode by default) unless its stage-2
ratio is more than 3% slower in another band.  No certified winner: no profile,
keep NCCL defaults.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import math
from dataclasses import dataclass
from pathlib import Path

from .. import __version__, atomic, linewrap, readfile
from ..errors import CommdiagError, terminal_safe, text_lines as _lines
from . import celltime, machinereport, stats, verdict
from ..measure import collectives
from ..formats import results
from .screening import band_text
from ..atomic import write_text

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]
FAILED_STATUSES = (results.FAILED, results.TIMEOUT, results.INCORRECT)


def esc(value) -> str:
    """HTML text: < > & and quotes escaped, and control characters shown as ``\\xNN`` (a benchmark's
    stderr in a failed launch's tail: ``cat report.html`` on a terminal obeys none of them)."""
    return html.escape(terminal_safe(_lines("" if value is None else str(value))), quote=True)


def plot_text(value) -> str:
    """A plot label: plotly.js renders a subset of HTML in names and hover text, so < > & are escaped;
    quotes are not (plotly shows &quot; literally, and there is no attribute for a quote to end)."""
    return html.escape(terminal_safe(_lines("" if value is None else str(value))), quote=False)


def fmt_bytes(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            v = n / div
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.3g} {unit}"
    return f"{n} B"


def size_label(size: int, tokens) -> str:
    return fmt_bytes(int(size)) + ("" if tokens is None else f" ({tokens} tok)")


def _clean(v):
    """JSON-safe: NaN/inf become null (JSON has neither)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def script_json(data) -> str:
    """JSON safe inside a <script> element: no '<', '>' or '&' that could end it."""
    text = json.dumps(_clean(data), separators=(",", ":"), allow_nan=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


# The docs a report links to: commdiag's own docs/ beside the package (a clone or an editable
# install); a regular install has none, and the link is then the page's name alone.
DOCS = Path(__file__).resolve().parent.parent.parent / "docs"
# Glossary entries (docs/glossary.md anchors) for the words the verdicts use.
TERMS = (("gmean", "gmean"), ("launch value", "launch-value"), ("smallest attainable p", "smallest-attainable-p"),
         ("power", "power"), ("Hodges-Lehmann ratio", "hodges-lehmann"), ("paired test", "paired-test"),
         ("signed-rank", "signed-rank"), ("Spearman", "spearman"), ("sign-flip", "sign-flip"))


def doc_link(page: str, anchor: str | None = None, text: str | None = None) -> str:
    """An HTML link to docs/PAGE (a file: URL to the docs beside this commdiag), or the page's name
    when there are none to link to (a report mailed elsewhere still names the page)."""
    target = DOCS / page
    shown = esc(text or f"docs/{page}")
    if not target.is_file():
        return shown
    return f'<a href="{esc(target.as_uri() + ("#" + anchor if anchor else ""))}">{shown}</a>'


PLOTLY_MISSING = "plotly is not installed here (pip install plotly)"


# plotly.js's own cartesian bundle (scatter, heatmap, ...: what the pages draw), vendored: 1.5 MB
# where the plotly package's full bundle is 4.8 MB (plotlyjs/README.md has the source and license)
PLOTLY_BUNDLE = Path(__file__).with_name("plotlyjs") / "plotly-cartesian.min.js"


def plotly_missing() -> str | None:
    """Why report.html cannot be written here (None: it can): the page embeds the vendored plotly.js
    bundle, or else the plotly package's, which a server's venv installed without commdiag's
    dependencies may lack."""
    if PLOTLY_BUNDLE.is_file():
        return None
    try:
        from plotly.offline import get_plotlyjs  # noqa: F401
    except ImportError:
        return PLOTLY_MISSING
    return None


def plotly_js() -> str:
    if PLOTLY_BUNDLE.is_file():
        return PLOTLY_BUNDLE.read_text(encoding="utf-8")
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise CommdiagError(f"report.html needs plotly: {PLOTLY_MISSING}") from None
    return get_plotlyjs()


# ---------------------------------------------------------------- figures (plain dicts)

def _tokens(v):
    return None if v is None or str(v) in ("<NA>", "nan", "None") else int(v)


def _axis(title: str, log: bool = True, values=None, as_bytes: bool = False, **kw) -> dict:
    """A plot axis; a log axis over ``values`` gets its own labelled ticks (log_ticks)."""
    ticks = log_ticks(values, as_bytes) if log and values else {}
    return {"title": {"text": plot_text(title)}, "type": "log" if log else "linear", **ticks, **kw}


def log_ticks(values, as_bytes: bool = False) -> dict:
    """Ticks for a log axis, every one labelled in full: plotly's own label minor ticks as bare digits
    ("2", "5"), which read as values.  Bytes: powers of two (16 KiB, 1 MiB), at most about 10; other
    values: 1-2-5 per decade (1-9 when the range is narrow), else the range's ends."""
    vals = [float(v) for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return {}
    lo, hi = min(vals), max(vals)
    if as_bytes:
        first, last = math.floor(math.log2(lo)), math.ceil(math.log2(hi))
        step = max(1, math.ceil((last - first + 1) / 10))
        ticks = [2.0 ** e for e in range(first, last + 1, step) if lo / 1.5 <= 2.0 ** e <= hi * 1.5]
        label = lambda v: fmt_bytes(int(v))  # noqa: E731
    else:
        ticks = []
        for mults in ((1,), (1, 2, 5), tuple(range(1, 10))):
            ticks = [m * 10.0 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
                     for m in mults if lo / 1.05 <= m * 10.0 ** k <= hi * 1.05]
            if len(ticks) >= 3:
                break
        label = _tick_text
    if len(ticks) < 3:  # a narrow range: its ends too, so that at least two values are labelled
        ticks = sorted(set(ticks) | {lo, hi})
    return {"tickmode": "array", "tickvals": ticks, "ticktext": [label(v) for v in ticks]}


def _tick_text(v: float) -> str:
    if v >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def _layout(title: str, x: dict, y: dict, **kw) -> dict:
    return {"title": {"text": plot_text(title)}, "xaxis": x, "yaxis": y, "height": 480,
            "margin": {"l": 70, "r": 20, "t": 50, "b": 60}, "hovermode": "closest",
            "legend": {"font": {"size": 11}}, **kw}


def figures(data: results.RunData, verdicts: verdict.Verdicts, values: list[stats.LaunchValue]) -> list[dict]:
    """The report's plots as plotly figure dicts (id, title, data, layout)."""
    configs = [c["name"] for c in data.run.get("configs", [])]
    color = {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(configs)}
    tokens_by_size = {s["bytes"]: s.get("tokens") for s in data.run.get("spec", {}).get("sizes", [])}
    step_run = bool(data.run.get("spec", {}).get("model"))
    nranks = data.run.get("world_size") or 0
    figs = []
    times = celltime.cell_times(values)  # the lines: each cell's gmean, the number every table shows
    rows = {}  # (mode, config) -> [(size, CellTime)] sorted by size
    for (c, size, mode), t in sorted(times.items(), key=lambda kv: kv[0][1]):
        rows.setdefault((mode, c), []).append((size, t))
    for mode in verdicts.modes or sorted({m for m, _ in rows}):
        lat, bw = [], []
        for c in configs:
            rs = rows.get((mode, c), [])
            if not rs:
                continue
            name = plot_text(c)
            xs = [size for size, _ in rs]
            lat.append({"type": "scatter", "mode": "lines+markers", "name": name, "legendgroup": name,
                        "x": xs, "y": [round(t.us, 3) for _, t in rs], "line": {"color": color[c]},
                        "customdata": [t.launches for _, t in rs],
                        "hovertemplate": f"{name}<br>%{{x}} B: %{{y:.2f}} us (gmean of %{{customdata}} launches)"
                                         "<extra></extra>"})
            pts = [m for m in values if m.config == c and m.mode == mode]
            lat.append({"type": "scatter", "mode": "markers", "name": name + " launches", "legendgroup": name,
                        "showlegend": False, "x": [m.size_bytes for m in pts], "y": [round(m.us, 3) for m in pts],
                        "text": [f"launch {m.launch} (stage {m.stage})" for m in pts],
                        "marker": {"color": color[c], "size": 5, "opacity": 0.55, "symbol": "circle-open"},
                        "hovertemplate": f"{name} %{{text}}<br>%{{x}} B: %{{y:.2f}} us<extra></extra>"})
            bw.append({"type": "scatter", "mode": "lines+markers", "name": name, "x": xs,
                       "y": [round(collectives.busbw_gbps(size, t.us, nranks), 4) for size, t in rs],
                       "line": {"color": color[c]},
                       "hovertemplate": f"{name}<br>%{{x}} B: %{{y:.3f}} GB/s<extra></extra>"})
        what = "one step of the TP model (commdiag step)" if step_run else "per all-reduce"
        xs_all = [x for t in lat for x in t["x"]]
        ys_all = [y for t in lat for y in t["y"]]
        figs.append({"id": f"latency-{mode}", "title": f"Latency vs size ({mode})", "data": lat,
                     "layout": _layout(f"Latency {what} vs size, {mode} mode (line: gmean; points: each launch's "
                                       "value)",
                                       _axis("all-reduce size per rank (bytes)", values=xs_all, as_bytes=True),
                                       _axis("time (us)", values=ys_all))})
        if not step_run:  # a step's time is not one all-reduce's: a bandwidth from it would mean nothing
            figs.append({"id": f"busbw-{mode}", "title": f"Bus bandwidth vs size ({mode})", "data": bw,
                         "layout": _layout(f"Bus bandwidth vs size, {mode} mode",
                                           _axis("size per rank (bytes)", values=xs_all, as_bytes=True),
                                           _axis("busbw (GB/s)", log=False))})
        figs.append(_heatmap(verdicts, mode, configs, tokens_by_size))
    stage2 = _stage2_figure(verdicts)
    if stage2:
        figs.insert(0, stage2)
    for graph_mode, eager_mode, via in (("graph", "eager", "torch"), ("graph-direct", "eager-direct", "nccl-direct")):
        if graph_mode not in verdicts.modes or eager_mode not in verdicts.modes:
            continue
        over = []
        for c in configs:
            g = {size: t.us for size, t in rows.get((graph_mode, c), [])}
            e = {size: t.us for size, t in rows.get((eager_mode, c), [])}
            xs = sorted(set(g) & set(e))
            if xs:
                over.append({"type": "scatter", "mode": "lines+markers", "name": plot_text(c), "x": xs,
                             "y": [round(e[s] - g[s], 3) for s in xs], "line": {"color": color[c]},
                             "customdata": [[g[s], e[s]] for s in xs],
                             "hovertemplate": plot_text(c) + "<br>%{x} B: eager %{customdata[1]:.2f} us - graph "
                                              "%{customdata[0]:.2f} us = %{y:.2f} us (gmeans)<extra></extra>"})
        suffix = "" if via == "torch" else "-direct"
        figs.append({"id": f"graph-vs-eager{suffix}", "title": f"Graph vs eager (via {via})", "data": over,
                     "layout": _layout(f"Eager minus graph time per all-reduce via {via}: the launch overhead "
                                       "without CUDA graphs",
                                       _axis("size per rank (bytes)", values=[x for t in over for x in t["x"]],
                                             as_bytes=True),
                                       _axis("eager - graph (us)", log=False))})
    return figs


def _heatmap(verdicts: verdict.Verdicts, mode: str, configs: list[str], tokens_by_size: dict) -> dict:
    """Screening estimates per config x size, in grey: estimates are not verdicts.  A cell is coloured
    only where stage 2 (a band claim covering its size) or --certify-sizes certified the config
    faster or slower, with the certified percentage (green lower time, red higher)."""
    cells = {(c.config, c.size_bytes): c for c in verdicts.screening.cells if c.mode == mode}
    sizes = sorted({c.size_bytes for c in cells.values()})
    ys = [c for c in configs if c != stats.DEFAULT and any((c, s) in cells for s in sizes)]
    certified = _certified_cells(verdicts, mode)
    grey, grey_text, colour, colour_text, hover = [], [], [], [], []
    for c in ys:
        gz, gt, cz, ct, hr = [], [], [], [], []
        for s in sizes:
            cell = cells.get((c, s))
            cert = certified.get((c, s))
            if cell is None or cell.ratio is None:
                gz.append(None), gt.append(""), cz.append(None), ct.append(""), hr.append("no data")
                continue
            pct = (cell.ratio - 1) * 100
            what = (f"{c} at {size_label(s, cell.tokens)}: screening {cell.label}; "
                    f"{cell.launches} vs {cell.default_launches} launches"
                    + ("" if cell.eligible else " (excluded from winners)"))
            if cert is not None:
                cpct = (cert[0] - 1) * 100
                gz.append(0.0), gt.append("")  # under the colour; it carries the cell's hover
                cz.append(round(max(-50.0, min(50.0, cpct)), 2)), ct.append(f"{cpct:+.0f}%")
                hr.append(plot_text(f"{what}; certified: {cert[1]}"))
            else:
                gz.append(0.0), gt.append(f"({pct:+.0f}%)" if abs(cell.ratio - 1) >= verdicts.min_effect else "~")
                cz.append(None), ct.append("")
                hr.append(plot_text(what))
        grey.append(gz), grey_text.append(gt), colour.append(cz), colour_text.append(ct), hover.append(hr)
    xs = [size_label(s, tokens_by_size.get(s)) for s in sizes]
    common = {"x": xs, "y": [plot_text(c) for c in ys], "texttemplate": "%{text}", "xgap": 1, "ygap": 1}
    # the grey layer holds every cell and its hover; the colour layer only the certified cells
    data = [{"type": "heatmap", "z": grey, "text": grey_text, "zmin": -1, "zmax": 1, "showscale": False,
             "colorscale": [[0, "#e4e4e4"], [1, "#e4e4e4"]], "name": "estimates", "customdata": hover,
             "hovertemplate": "%{customdata}<extra></extra>", **common},
            {"type": "heatmap", "z": colour, "text": colour_text, "zmin": -50, "zmax": 50, "zmid": 0,
             "colorscale": [[0, "#7fbf7b"], [0.5, "#f7f7f7"], [1, "#ef8a62"]], "name": "certified",
             "hoverinfo": "skip", "colorbar": {"title": {"text": "certified % vs default"}}, **common}]
    height = max(300, 120 + 22 * len(ys))
    layout = _layout(f"Vs default, {mode} mode: grey (+x%) = estimate, ~ within 3%; coloured = certified",
                     {"type": "category", "title": {"text": "size"}},
                     {"type": "category", "autorange": "reversed"}, height=height)
    # config names label the rows: leave room for the longest (grid names like PROTO=LL128,ALGO=Tree)
    layout["margin"] = {**layout["margin"], "l": min(400, 20 + 7 * max((len(c) for c in ys), default=8))}
    return {"id": f"speedup-{mode}", "title": f"Screening estimates vs default ({mode})", "data": data,
            "layout": layout}


def _certified_cells(verdicts: verdict.Verdicts, mode: str) -> dict[tuple[str, int], tuple[float, str]]:
    """(config, size) -> (certified ratio, its answer) in ``mode``: a size certified on its own
    (--certify-sizes), else every size of a band certified in stage 2."""
    out: dict[tuple[str, int], tuple[float, str]] = {}
    for c in verdicts.certifications:
        if c.certified and c.claim.mode == mode and c.ratio is not None:
            for s in verdicts.screening.band_sizes.get(c.claim.band, ()):
                out[(c.claim.config, s)] = (c.ratio, f"band {c.claim.band}: {c.text}")
    for c in verdicts.size_certifications:
        if c.certified and c.claim.mode == mode and c.ratio is not None and c.claim.size_bytes is not None:
            out[(c.claim.config, c.claim.size_bytes)] = (c.ratio, c.text)
    return out


def _stage2_figure(verdicts: verdict.Verdicts) -> dict | None:
    """Every stage-2 launch value per claim, default beside the config: the evidence of each certified answer."""
    if not verdicts.certifications:
        return None
    data = []
    # a two-level axis: the claim (config, band, mode) under its two columns, default and the config; one
    # legend entry per side (grey: default, blue: the claim's config), so the ticks stay short
    for i, c in enumerate(verdicts.certifications):
        claim = plot_text(f"{c.claim.config}, {c.claim.band} band" if c.claim.band is not None
                          else f"{c.claim.config}, {c.claim.size_bytes} B")
        for side, arm, vals, color in (("default", "default", c.default_us, "#7f7f7f"),
                                       ("config", c.claim.config, c.config_us, "#1f77b4")):
            data.append({"type": "scatter", "mode": "markers", "legendgroup": side, "showlegend": i == 0,
                         "name": "default (the reference)" if side == "default" else "the claim's config",
                         "x": [[claim] * len(vals), [plot_text(arm)] * len(vals)], "y": list(vals),
                         "marker": {"color": color, "size": 7, "opacity": 0.7},
                         "hovertemplate": f"{claim}<br>{plot_text(arm)}: %{{y:.3f}} us<extra></extra>"})
    return {"id": "stage2", "title": "Stage 2 launches per claim", "data": data,
            "layout": _layout("Stage 2: each fresh launch's band value (us, geometric mean over the band's sizes)",
                              {"type": "multicategory", "title": {"text": "claim, then the side of it"}},
                              _axis("band value (us)", values=[y for t in data for y in t["y"]]),
                              showlegend=True)}


# ---------------------------------------------------------------- HTML

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1500px}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:12px;margin:.5em 0} td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f4f4f4} td.num{text-align:right;font-variant-numeric:tabular-nums}
.faster{background:#d9f0d3} .slower{background:#f8d0c8} .same{background:#f4f4f4} .inconclusive{background:#fff3c4}
.bad{background:#f8d0c8} .warn{color:#8a4b00} pre{background:#f7f7f7;padding:.5em;overflow:auto;max-height:30em;font-size:11px}
.plot{min-height:300px} #js-errors{color:#b00;font-weight:bold}
"""


def key_table(data, limit: int = 2000) -> str:
    """A nested mapping as a two-column table, one row per leaf (``fingerprint.launcher.hostname``):
    readable where a JSON dump is not; lists of scalars on one line, longer values in full."""
    rows: list[list[str]] = []

    def walk(prefix: str, v) -> None:
        if len(rows) >= limit:
            return
        if isinstance(v, dict) and v:
            for k, x in v.items():
                walk(f"{prefix}.{k}" if prefix else str(k), x)
        elif isinstance(v, list) and v and any(isinstance(x, (dict, list)) for x in v):
            for i, x in enumerate(v):
                walk(f"{prefix}[{i}]", x)
        else:
            text = (", ".join(map(str, v)) if isinstance(v, list) else "" if v is None else
                    "{}" if v == {} else str(v))
            rows.append([prefix, text])

    walk("", data)
    if not rows:
        return "<p>Not recorded.</p>"
    more = f"<p>(first {limit} entries; run.json has the rest)</p>" if len(rows) >= limit else ""
    return _table(["key", "value"], rows) + more


def _table(head: list[str], rows: list[list[str]], raw_cells: bool = False) -> str:
    """An HTML table; cells are escaped unless ``raw_cells`` (then the caller escaped them)."""
    out = ["<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"]
    for r in rows:
        out.append("<tr>" + "".join(f"<td>{c if raw_cells else esc(c)}</td>" for c in r) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def page(title: str, body: str, figs: list[dict]) -> str:
    """A complete offline HTML page: body (already escaped), figures drawn by embedded plotly.js."""
    divs_js = """
(function(){
  var errs=[];
  function note(m){errs.push(m);var e=document.getElementById('js-errors');if(e){e.textContent='Plot errors: '+errs.join(' | ');}}
  window.addEventListener('error',function(ev){note(String(ev.message));});
  var figs=JSON.parse(document.getElementById('figs').textContent), drawn=0, jobs=[];
  figs.forEach(function(f){
    try{
      jobs.push(Plotly.newPlot(f.id,f.data,f.layout,{responsive:true,displaylogo:false}).then(function(){drawn++;}));
    }catch(e){note(f.id+': '+e);}
  });
  Promise.all(jobs).then(function(){document.body.setAttribute('data-plots-drawn',String(drawn));},
                         function(e){note(String(e));});
})();
"""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{CSS}</style>"
            f"<script>{plotly_js()}</script></head>\n<body data-plots-expected=\"{len(figs)}\">\n"
            "<div id=\"js-errors\"></div>\n" + body +
            f"\n<script id=\"figs\" type=\"application/json\">{script_json(figs)}</script>\n"
            f"<script>{divs_js}</script>\n</body></html>\n")


def plot_divs(figs: list[dict]) -> str:
    return "\n".join(f"<h3>{esc(f['title'])}</h3><div class=\"plot\" id=\"{esc(f['id'])}\"></div>" for f in figs)


def _screening_matrix(verdicts: verdict.Verdicts, mode: str, tokens_by_size: dict) -> str:
    cells = {(c.config, c.size_bytes): c for c in verdicts.screening.cells if c.mode == mode}
    sizes = sorted({c.size_bytes for c in cells.values()})
    configs = [c for c in verdicts.configs if c != stats.DEFAULT and any((c, s) in cells for s in sizes)]
    out = ["<table><tr><th>config</th>" + "".join(f"<th>{esc(size_label(s, tokens_by_size.get(s)))}</th>"
                                                 for s in sizes) + "</tr>"]
    for c in configs:
        row = [f"<td>{esc(c)}{'' if c not in verdicts.excluded else ' <b>(excluded)</b>'}</td>"]
        for s in sizes:
            cell = cells.get((c, s))
            if cell is None or cell.ratio is None:
                row.append("<td>n/a</td>")
                continue
            title = (f"{cell.label}; {_num(cell.time_us)} vs {_num(cell.default_us)} us; launches "
                     f"{', '.join(plain(v) for v in cell.launch_us)} vs {', '.join(plain(v) for v in cell.default_launch_us)}")
            row.append(f"<td class=\"num\" title=\"{esc(title)}\">{(cell.ratio - 1) * 100:+.1f}%</td>")
        out.append("<tr>" + "".join(row) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _certified_section(verdicts: verdict.Verdicts) -> str:
    """The certified answer: one row per stage-2 claim, then the winners per band."""
    out = [f"<p><b>{esc(verdicts.status)}</b>: {esc(verdicts.status_note)}</p>"]
    out += [f"<p><b>{esc(n)}</b></p>" for n in verdicts.notes]
    if verdicts.certifications:
        plan = verdicts.confirmation or {}
        out.append(f"<p>Stage 2: {esc(sum(lk['rounds'] for lk in plan.get('looks', [])))} fresh rounds of default "
                   f"and every claimed config, shuffled within each round; per claim the exact Wilcoxon signed-rank "
                   f"test on the rounds' log-ratios (config vs default in the same round) and their Hodges-Lehmann "
                   f"ratio; family of {esc(verdicts.family_size)} claim(s) at {verdicts.alpha:.0%}.</p>")
        rows = []
        for c in verdicts.certifications:
            cls = c.result.replace(" ", "-") if c.certified else "inconclusive"
            rows.append([esc(c.claim.config), esc(c.claim.mode), esc(c.claim.where),
                         esc("faster" if c.claim.alternative == stats.LESS else "either way"), esc(c.claim.reason),
                         f"<span class=\"{cls}\">{esc(c.text)}</span>"
                         + "".join(f"<br><span class=\"bad\">{esc(t.strip())}</span>"
                                   for t in machinereport.claim_lines(verdicts, c, "")),
                         esc(", ".join(plain(v) for v in c.config_us)), esc(", ".join(plain(v) for v in c.default_us))])
        out.append(_table(["config", "mode", "where", "tested", "why a claim", "answer", "config launches (us)",
                           "default launches (us)"], rows, raw_cells=True))
    out.append(_table(["mode", "band", "winner"], [[w.mode, w.band, w.text] for w in verdicts.band_winners]))
    if verdicts.size_certifications:
        certified = [c for c in verdicts.size_certifications if c.certified]
        out.append(f"<p>Per-size certification (--certify-sizes, one stage, {len(verdicts.size_certifications)} "
                   f"claims): {len(certified)} certified.</p>")
        out.append(_table(["config", "size", "answer"], [[c.claim.config, c.claim.where, c.text]
                                                         for c in verdicts.size_certifications]))
    return "\n".join(out)


def _confirmations(run: dict) -> str:
    """Per config, the first launch with rank records: each watched variable per rank, as
    os.environ, libc getenv and NCCL itself saw it."""
    configs = {c["name"]: c for c in run.get("configs", [])}
    seen = {}
    for l in run.get("launches", []):
        if l.get("ranks") and l["config"] not in seen:
            seen[l["config"]] = l
    rows = []
    for name, cfg in configs.items():
        l = seen.get(name)
        if l is None:
            rows.append([esc(name), "", "", "<i>no launch recorded its ranks</i>"])
            continue
        names = sorted(set(cfg.get("env", {})) | {k for r in l["ranks"] for k in r.get("env_seen", {})})
        for var in names:
            expected = cfg.get("env", {}).get(var)
            parts = []
            for r in l["ranks"]:
                s = r.get("env_seen", {}).get(var, {})
                applied = (r.get("nccl_applied") or {}).get(var) if r.get("nccl_applied") is not None else None
                vals = [s.get("environ"), s.get("getenv")] + ([applied] if "nccl_applied" in r else [])
                ok = all(v == expected for v in vals[:2]) and (len(vals) < 3 or vals[2] in (expected, None))
                txt = f"rank {r.get('rank')}: environ={s.get('environ')} getenv={s.get('getenv')}"
                if "nccl_applied" in r:
                    txt += f" nccl={applied if applied is not None else '(not reported)'}"
                parts.append(f"<span class=\"{'' if ok else 'bad'}\">{esc(txt)}</span>")
            rows.append([esc(name), esc(var), esc(expected), "<br>".join(parts)])
    return _table(["config", "variable", "set to", "seen per rank (launch)"], rows, raw_cells=True)


def build_html(data: results.RunData, verdicts: verdict.Verdicts, values: list[stats.LaunchValue]) -> str:
    run = data.run
    spec = run.get("spec", {})
    tokens_by_size = {s["bytes"]: s.get("tokens") for s in spec.get("sizes", [])}
    figs = figures(data, verdicts, values)
    counts: dict[str, int] = {}
    for l in run.get("launches", []):
        counts[l["status"]] = counts.get(l["status"], 0) + 1
    b = [f"<h1>commdiag sweep report: {esc(spec.get('name'))}</h1>",
         f"<p>{esc(spec.get('description'))}</p>",
         _table(["run folder", "spec file", "backend", "ranks", "created (UTC)", "state", "launches"],
                [[str(data.path), run.get("spec_file"), spec.get("backend"), run.get("world_size"),
                  run.get("created_utc"), run.get("state"), ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))]]),
         f"<p>Verdicts come in two stages ({doc_link('verdicts.md')}). Stage 1, screening: the interleaved trials give "
         "estimates per config, size and band, with every launch's value; they pick the claims. Stage 2, "
         "confirmation: fresh rounds of default and the claimed configs, an exact paired test per claim on "
         "the log-ratios within each round; only a "
         "certified claim says faster or slower or makes a profile.</p>"]
    if verdicts.warnings or run.get("warnings"):
        b.append("<ul class=\"warn\">" + "".join(f"<li>{esc(w)}</li>" for w in
                                                  list(run.get("warnings", [])) + list(verdicts.warnings)) + "</ul>")
    b.append("<h2>Certified answer</h2>")
    b.append("<p>Terms (" + doc_link("glossary.md") + "): "
             + ", ".join(doc_link("glossary.md", anchor, term) for term, anchor in TERMS) + ".</p>")
    b.append(_certified_section(verdicts))
    b.append("<h2>Screening estimates per band (stage 1, not verdicts)</h2>")
    b.append("<p>Bands: " + esc(", ".join(f"{k} {band_text(v)}" for k, v in verdicts.bands.items())) + "</p>")
    if verdicts.screening.band_cells:
        b.append(_table(["config", "mode", "band", "ratio (estimate)", "screening", "launch values (us)",
                         "default's (us)"],
                        [[c.config, c.mode, c.band, _num3(c.ratio), c.label,
                          ", ".join(plain(v) for v in c.launch_us), ", ".join(plain(v) for v in c.default_launch_us)]
                         for c in verdicts.screening.band_cells]))
    if verdicts.excluded:
        b.append("<p>Never winners (a failed, timed-out or incorrect launch, or wrong elements):</p>")
        b.append(_table(["config", "why"], [[c, r] for c, r in verdicts.excluded.items()]))
    b.append("<h2>Plots</h2>")
    b.append(plot_divs(figs))
    b.append("<h2>Timings</h2>")
    b.append(_timings_section(data.summary, tokens_by_size, values, run.get("world_size") or 0,
                              bool(spec.get("model"))))
    for mode in verdicts.modes:
        b.append(f"<h2>Screening estimates vs default, {esc(mode)} mode</h2>"
                 "<p>Estimated change vs default (ratio - 1) from stage 1; not verdicts. Hover a cell for the "
                 "launch values.</p>")
        b.append(_screening_matrix(verdicts, mode, tokens_by_size))
    bad = [l for l in run.get("launches", []) if l.get("status") in FAILED_STATUSES]
    b.append(f"<h2>Failed, timed-out and incorrect launches ({len(bad)})</h2>")
    if bad:
        b.append(_table(["launch", "config", "trial", "status", "error", "stderr tail"],
                        [[esc(l["index"]), esc(l["config"]), esc(l.get("trial")), esc(l["status"]), esc(l.get("error")),
                          f"<details><summary>show</summary><pre>{esc(l.get('stderr_tail'))}</pre></details>"]
                         for l in bad], raw_cells=True))
    else:
        b.append("<p>None.</p>")
    b.append("<h2>What NCCL chose (explain)</h2>")
    b.append(_explain_section(run, tokens_by_size))
    b.append("<h2>Launch overhead</h2>")
    b.append(_overhead_section(run))
    b.append("<h2>The machine during the launches</h2>")
    b.append(machinereport.html_section(run, verdicts))
    b.append("<h2>What each rank saw, and what NCCL applied</h2>")
    if spec.get("backend") == "gloo":
        b.append("<p>NCCL itself: not applicable (gloo never loads NCCL). What each rank's environment held "
                 "(os.environ and libc getenv), which is what a worker would hand NCCL:</p>")
    else:
        b.append(f"<p>{esc(run.get('nccl_debug'))}</p>")
    b.append(_confirmations(run))
    b.append("<h2>Configs</h2>")
    b.append(_table(["config", "origin", "settings (on top of base_env)"],
                    [[c["name"], c.get("origin"), " ".join(f"{k}={v}" for k, v in c.get("overrides", {}).items())]
                     for c in run.get("configs", [])]))
    b.append("<h2>Environment fingerprint</h2>")
    b.append(key_table(run.get("fingerprint")))
    b.append("<h2>Method</h2>")
    b.append(key_table(run.get("method")))
    b.append("<h2>Spec</h2>")
    b.append(key_table(run.get("spec_given", spec)))
    b.append(f"<p><small>commdiag {esc(__version__)}</small></p>")
    return page(f"commdiag report: {spec.get('name')}", "\n".join(b), figs)


def _timings_section(summary, tokens_by_size: dict, values: list[stats.LaunchValue], nranks: int,
                     step_run: bool) -> str:
    """Every time with its spread and launch count (what the plots show on hover), one table per mode."""
    if summary.empty:
        return "<p>No samples.</p>"
    times = celltime.cell_times(values)
    out = [f"<p>{esc(celltime.LEGEND)}; samples p10-p90: over every iteration of every launch"
           + ("" if step_run else "; busbw: GB/s at the gmean") + ".</p>"]
    for mode in sorted(set(summary["mode"]), key=lambda m: (m.endswith("-direct"), m != "graph", m)):
        rows = []
        for r in summary[summary["mode"] == mode].sort_values(["size_bytes", "config"]).itertuples():
            t = times.get((str(r.config), int(r.size_bytes), mode))
            bw = "-" if step_run or t is None else f"{collectives.busbw_gbps(int(r.size_bytes), t.us, nranks):.3f}"
            rows.append([size_label(int(r.size_bytes), tokens_by_size.get(int(r.size_bytes))), r.config,
                         "n/a" if t is None else f"{t.us:.2f}",
                         "-" if t is None else f"{t.lo_us:.2f}-{t.hi_us:.2f}", str(0 if t is None else t.launches),
                         f"{r.p10_us:.2f}-{r.p90_us:.2f}", bw, str(r.wrong)])
        out.append(f"<details><summary>{esc(mode)} ({len(rows)} rows)</summary>"
                   + _table(["size", "config", "gmean (us)", "min-max (us)", "launches", "samples p10-p90 (us)",
                             "busbw (GB/s)", "#wrong"], rows) + "</details>")
    return "\n".join(out)


def _explain_section(run: dict, tokens_by_size: dict) -> str:
    ex = run.get("explain")
    if not ex and (run.get("spec") or {}).get("backend") == "gloo":
        return "<p>Not applicable: gloo never loads NCCL, so NCCL chose nothing (explain runs nccl runs only).</p>"
    if not ex:
        return ("<p>Not recorded. <code>commdiag explain RUN_DIR</code> (or <code>sweep --explain</code>) adds one "
                "untimed launch per config with NCCL's TUNING log, to show the algorithm, protocol and channels "
                "NCCL used at each size.</p>")
    names = list(ex.get("configs", {}))
    rows = []
    for size in sorted(tokens_by_size):
        cells = [size_label(size, tokens_by_size[size])]
        for n in names:
            entry = ex["configs"][n]
            ch = entry.get("sizes", {}).get(str(size))
            cells.append(f"{ch['algo']}/{ch['proto']}/{ch['channels'] if ch.get('channels') is not None else '?'}"
                         if ch else entry.get("status", "?"))
        rows.append(cells)
    out = [f"<p>NCCL {esc(ex.get('nccl_version') or '?')}, per all-reduce: algorithm/protocol/channels.</p>",
           _table(["size"] + names, rows)]
    notes = ex.get("notes", [])
    if notes:
        out.append("<ul>" + "".join(f"<li><b>{esc(n['config'])}</b>: {esc(n['text'])}</li>" for n in notes) + "</ul>")
    return "\n".join(out)


def _overhead_section(run: dict) -> str:
    """Per launch: wall time, time spent measuring, and the rest (torchrun start, init, teardown)."""
    done = [l for l in run.get("launches", []) if l.get("overhead_s") is not None]
    if not done:
        return "<p>Not recorded for this run.</p>"
    def q(vals, f):
        vals = sorted(vals)
        return vals[min(len(vals) - 1, int(f * len(vals)))]
    walls = [l["wall_s"] for l in done]
    over = [l["overhead_s"] for l in done]
    inits = [r.get("init_s", 0.0) for l in done for r in l.get("ranks", [])]
    rows = [["wall per launch", f"{q(walls, 0.5):.2f}", f"{min(walls):.2f}", f"{max(walls):.2f}"],
            ["overhead per launch (wall - measuring)", f"{q(over, 0.5):.2f}", f"{min(over):.2f}", f"{max(over):.2f}"]]
    if inits:
        rows.append(["process-group init per rank", f"{q(inits, 0.5):.2f}", f"{min(inits):.2f}", f"{max(inits):.2f}"])
    processes = {l.get("process", l["index"]) for l in done}
    shared = (f" in {len(processes)} processes (reuse_process: a process's start and teardown are shared "
              "by its launches)" if len(processes) < len(done) else "")
    return (f"<p>{len(done)} launches{esc(shared)}; seconds.</p>"
            + _table(["", "median", "min", "max"], rows))


# ---------------------------------------------------------------- entry points

@dataclass(frozen=True)
class Published:
    report: Path | None  # None: not written (report_note says why)
    verdicts: verdict.Verdicts
    profiles: tuple[str, ...]  # profile files written (names in the run folder)
    report_note: str | None = None


def write_report(run_dir: str | Path, out: str | Path | None = None, data: results.RunData | None = None,
                 verdicts: verdict.Verdicts | None = None) -> tuple[Path, verdict.Verdicts]:
    data = data or results.load_run(run_dir)
    values = verdict.run_values(data)  # once: the verdicts and the plots' launch points share them
    verdicts = verdicts or verdict.evaluate_run(data, values)
    path = Path(out) if out else Path(run_dir) / "report.html"
    write_text(path, build_html(data, verdicts, values))
    return path, verdicts


def write_profiles(run_dir: str | Path, verdicts: verdict.Verdicts, run: dict) -> tuple[str, ...]:
    """Write the certified winners' profiles (and remove stale ones this run folder holds from an
    earlier publish, e.g. before confirm --rounds changed the answer)."""
    from ..formats import profile

    run_dir = Path(run_dir)
    created = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    plan = verdict.profile_plan(verdicts, run, str(run_dir), created)
    first = next(iter(verdicts.bands), None)
    # A confounded winner (the machine differed between its arms in stage 2) gets no profile: nothing to
    # install until a clean rerun certifies it (the verdict line says so); never silently certified.
    plan = {name: v for name, v in plan.items()
            if not machinereport.profile_note(verdicts, first if name == "profile.env"
                                              else name[len("profile-"):-len(".env")])}
    _remove_stale_profiles(run_dir, plan)
    for name, (settings, meta) in plan.items():
        profile.save(run_dir / name, profile.Profile(settings, meta))
    return tuple(plan)


def _remove_stale_profiles(run_dir: Path, keep) -> None:
    """Remove the profile-*.env an earlier publish wrote that the verdicts no longer back (not in
    ``keep``).  Read through the one reader (a regular file only: a FIFO named like a profile is never
    opened; bounded) and removed through the one writer (by the folder's descriptor: a link is removed as
    a link, never followed); a file that is not commdiag's profile is left alone."""
    from ..formats import profile

    for old in sorted(Path(run_dir).glob("profile*.env")):
        if old.name in keep:
            continue
        try:
            head = readfile.read_bytes(old, limit=1 << 16, what="profile").decode(errors="replace")
        except (CommdiagError, OSError):
            continue
        if head.startswith(profile.PROFILE_HEADER):
            atomic.remove_tree(old)


def publish(run_dir: str | Path, data: results.RunData | None = None) -> Published:
    """The end of a sweep: verdicts, report.html and the certified winners' profiles (``data``: the
    run folder already loaded)."""
    data = data or results.load_run(run_dir)
    missing = plotly_missing()
    if missing:  # the launches are done and saved: the verdicts and profiles need no plotly
        verdicts = verdict.evaluate_run(data)
        note = f"not written: {missing}; then  commdiag report {run_dir}"
        return Published(None, verdicts, write_profiles(run_dir, verdicts, data.run), note)
    path, verdicts = write_report(run_dir, data=data)
    return Published(path, verdicts, write_profiles(run_dir, verdicts, data.run))


def render_verdicts(verdicts: verdict.Verdicts) -> str:
    """The console answer: screening per band (primary mode), then stage 2's one line per claim and the winners."""
    mode = verdicts.primary_mode
    band_cells = [c for c in verdicts.screening.band_cells if c.mode == mode]
    lines = [f"screening (stage 1: estimates, not verdicts; {mode} mode; ratio < 1 is a lower time)"]
    if band_cells:
        width = min(40, max(len(c.config) for c in band_cells))
        lines.append(f"  {'band':<10} {'config':<{width}} {'ratio':>7}  launches (us) vs default's")
        for c in band_cells:
            lines.append(f"  {c.band:<10} {_fit(c.config, width):<{width}} {_num3(c.ratio):>7}  "
                         f"{_vals(c.launch_us)} vs {_vals(c.default_launch_us)}")
    else:
        lines.append("  (no band has data for a config other than default)")
    lines.append("")
    lines.append(f"confirmation (stage 2): {verdicts.status}: {verdicts.status_note}")
    for c in verdicts.certifications:
        lines += c.lines("  ")
        lines += machinereport.claim_lines(verdicts, c)
    if verdicts.status in (verdict.SCREENING_ONLY, verdict.PENDING):
        lines.append("no winner yet: nothing is certified before stage 2 (keep NCCL defaults meanwhile)")
    else:
        for w in verdicts.band_winners:
            lines.append(f"winner {w.mode} band {w.band}: {w.text}")
            lines += machinereport.winner_lines(verdicts, w)
    for n in verdicts.notes:
        lines.append(n)
    if verdicts.size_certifications:
        done = [c for c in verdicts.size_certifications if c.certified]
        lines.append(f"per-size certification (--certify-sizes): {len(done)} of {len(verdicts.size_certifications)} "
                     f"config x size claims certified (each at p <= {verdicts.size_certifications[0].threshold:.2g})")
        for c in done:
            lines += c.lines("  ")
            lines += machinereport.claim_lines(verdicts, c)
    for c, why in verdicts.excluded.items():
        if c != stats.DEFAULT:  # default is the reference, never a candidate; its failures are listed anyway
            lines.append(f"never a winner: {c} ({why})")
    for w in verdicts.warnings:
        lines.append(f"warning: {w}")
    lines += machinereport.summary_lines(verdicts)
    return linewrap.fit("\n".join(lines))


def _fit(name: str, width: int) -> str:
    """A name that fits ``width`` without becoming ambiguous: cut in the middle with its crc as a tag."""
    if len(name) <= width:
        return name
    import zlib

    tag = f"~{zlib.crc32(name.encode()) & 0xffff:04x}~"
    keep = width - len(tag)
    return name[: keep - keep // 3] + tag + name[len(name) - keep // 3:]


def _vals(vs) -> str:
    return "[" + ", ".join(plain(v) for v in vs) + "]"


def plain(v: float) -> str:
    """A time as a plain number with about four significant digits, never 2.631e+04."""
    a = abs(v)
    return f"{v:.0f}" if a >= 1000 else f"{v:.1f}" if a >= 100 else f"{v:.2f}" if a >= 10 else f"{v:.3f}"


def _num3(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _num(v) -> str:
    return "" if v is None else f"{v:.2f}"


# The page's parts other reports build with (ab/report.py): one look, one escaping, one plotly embedding.
table, layout, axis = _table, _layout, _axis
