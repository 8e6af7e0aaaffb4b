"""``commdiag p2p --html FILE``: the result as one offline HTML page, in the report's style
(analyse/report.py: its CSS, its escaping, plotly.js embedded once).

Heatmaps GPU x GPU (rows send to columns): P2P one way, % of the link's ceiling, through host
one way, both ways (P2P above the diagonal, through host below), latency P2P and through host.
Every cell's hover text has the median, the min-max range and the count.  Then the flags, the
host link per GPU, notes and settings.  Never measures: a saved ``--json`` renders the same.
"""

from __future__ import annotations

from ..analyse import report
from .render import cell
from .result import HUNG, NOT_RUN, FAILED, P2PResult, Pair, Stat

BLUES = [[0, "#f7fbff"], [1, "#08519c"]]
REDS = [[0, "#fff5f0"], [1, "#a50f15"]]
TRAFFIC = [[0, "#d73027"], [0.6, "#fee08b"], [1, "#1a9850"]]


def _heatmap(res: P2PResult, fid: str, title: str, value, unit: str, scale, zmin=None, zmax=None) -> dict:
    """``value(pair, src, dst) -> (number or None, label)``."""
    idx = [g.index for g in res.gpus]
    z, text, hover = [], [], []
    for i in idx:
        zr, tr, hr = [], [], []
        for j in idx:
            p = res.pair(i, j) if i != j else None
            if p is None:
                zr.append(None), tr.append("-" if i == j else "?"), hr.append("")
                continue
            if p.status in (HUNG, FAILED, NOT_RUN):
                label = {HUNG: "HUNG", FAILED: "FAILED", NOT_RUN: "not run"}[p.status]
                zr.append(None), tr.append(label)
                hr.append(report.plot_text(f"GPU{i} -> GPU{j}: {label} {p.phase or ''} {p.error or ''}"))
                continue
            v, label, detail = value(p, i, j)
            zr.append(v), tr.append(label)
            hr.append(report.plot_text(f"GPU{i} -> GPU{j}: {detail}"))
        z.append(zr), text.append(tr), hover.append(hr)
    names = [f"GPU{i}" for i in idx]
    trace = {"type": "heatmap", "z": z, "x": names, "y": names, "text": text, "customdata": hover,
             "texttemplate": "%{text}", "colorscale": scale, "colorbar": {"title": {"text": unit}},
             "xgap": 2, "ygap": 2, "hovertemplate": "%{customdata}<extra></extra>"}
    if zmin is not None:
        trace["zmin"], trace["zmax"] = zmin, zmax
    size = max(320, 90 + 60 * len(idx))
    # the page's heading above the plot names it: no plot title to collide with the top axis
    layout = {"height": size, "width": size + 160,
              "xaxis": {"type": "category", "side": "top"},
              "yaxis": {"type": "category", "title": {"text": "from (row) to (column)"}, "autorange": "reversed"},
              "margin": {"l": 90, "r": 20, "t": 40, "b": 20}}
    return {"id": fid, "title": title, "data": [trace], "layout": layout}


def _stat_value(s: Stat | None, unit: str):
    if s is None:
        return None, "-", "not measured"
    return round(s.median, 3), cell(s), s.text(unit)


def figures(res: P2PResult) -> list[dict]:
    if len(res.gpus) < 2:
        return []

    def one_way(what, unit):
        def v(p: Pair, i, j):
            peer = p.peer_ab if i == p.a else p.peer_ba
            s = p.get(what, i, j)
            if s is None and peer is False and what.startswith(("p2p", "lat_p2p")):
                return None, "no P2P", "CUDA reports no peer access"
            return _stat_value(s, unit)
        return v

    def pct(p: Pair, i, j):
        s = p.get("p2p", i, j)
        if s is None or p.ceiling is None:
            return None, "-", "no P2P value or no ceiling"
        f = 100 * s.median / p.ceiling.gbps
        return round(f, 1), f"{f:.0f}%", f"{s.text('GB/s')} of {p.ceiling.gbps:g} GB/s ({p.ceiling.basis})"

    def both(p: Pair, i, j):
        s = p.p2p_bidir if i < j else p.host_bidir
        v, label, detail = _stat_value(s, "GB/s")
        return v, label, ("P2P both ways: " if i < j else "through host both ways: ") + detail

    return [
        _heatmap(res, "p2p", "P2P one way (GB/s, copy engine, row writes to column)", one_way("p2p", "GB/s"),
                 "GB/s", BLUES),
        _heatmap(res, "ceiling", "P2P one way, % of the link's ceiling", pct, "%", TRAFFIC, 0, 100),
        _heatmap(res, "host", "Through pinned host memory one way (GB/s)", one_way("host", "GB/s"), "GB/s", BLUES),
        _heatmap(res, "both", "Both ways at once (GB/s summed): P2P above the diagonal, through host below",
                 both, "GB/s", BLUES),
        _heatmap(res, "lat-p2p", "P2P latency (us per 16 B copy)", one_way("lat_p2p", "us"), "us", REDS),
        _heatmap(res, "lat-host", "Latency through host memory (us per 16 B copy)", one_way("lat_host", "us"),
                 "us", REDS),
    ]


def build_html(res: P2PResult) -> str:
    esc = report.esc
    figs = figures(res)
    s = res.settings
    body = [f"<h1>commdiag p2p: {len(res.gpus)} GPU{'s' if len(res.gpus) != 1 else ''}</h1>",
            f"<p>{esc(s.size_bytes >> 20)} MiB copies x {esc(s.repeats)} repeats; latency {esc(s.latency_copies)} "
            f"x 16 B x {esc(s.latency_repeats)} repeats; pair deadline {esc(f'{s.pair_timeout_s:g}')} s; "
            f"flag below {esc(f'{s.min_fraction:.0%}')} of a ceiling. Values: median over repeats, "
            "± half the min-max range as % of the median (hover: the range and the count). "
            "GB/s = 10<sup>9</sup> B/s.</p>"]
    for n in res.notes:
        body.append(f"<p class=\"warn\">{esc(n)}</p>")
    counts = ", ".join(f"{sum(1 for f in res.flags if f.severity == sev)} {sev}" for sev in ("fail", "warn", "info")
                       if any(f.severity == sev for f in res.flags))
    body.append(f"<p><b>Flags:</b> {esc(counts) if counts else 'none: every check passed'}"
                + (" (details below the heatmaps)</p>" if counts and figs else "</p>"))
    if figs:
        body.append("<h2>GPU x GPU</h2>")
        body.append(report.plot_divs(figs))
    if res.flags:
        body.append("<h2>Flags</h2>")
        body.append(_flag_table(res))
        body.append("<h2>Pairs</h2>")
        body.append(report._table(
            ["pair", "status", "path", "CUDA peer a→b / b→a", "NVML P2P", "data check", "ceiling (one way)",
             "P2P a→b", "P2P b→a", "P2P both", "host a→b", "host b→a", "wall s"],
            [[p.name, p.status + (f" ({p.phase})" if p.phase and p.status != "ok" else ""), p.path or "?",
              f"{p.peer_ab} / {p.peer_ba}", ", ".join(f"{k} {v}" for k, v in sorted(p.nvml_p2p.items())) or "?",
              _checks(p), f"{p.ceiling.gbps:g} GB/s: {p.ceiling.basis}" if p.ceiling else "?",
              *[x.text() if x else "-" for x in (p.p2p_ab, p.p2p_ba, p.p2p_bidir, p.host_ab, p.host_ba)],
              "" if p.wall_s is None else f"{p.wall_s:.2f}"] for p in res.pairs]))
    body.append("<h2>Host link per GPU</h2>")
    body.append(report._table(
        ["GPU", "name", "bus", "status", "link under load", "max", "idle", "ceiling (one way)", "H2D GB/s",
         "D2H GB/s", "both GB/s", "H2D us", "D2H us", "local GB/s", "replays before → after"],
        [[g.index, g.name or "?", g.bus_id or "?", g.status + (f" ({g.phase})" if g.phase and g.status != "ok" else ""),
          _link(g.link.gen, g.link.width) if g.link else "?", _link(g.link.gen_max, g.link.width_max) if g.link else "?",
          _link(g.link.gen_idle, g.link.width_idle) if g.link else "?",
          f"{g.ceiling.gbps:g} GB/s: {g.ceiling.basis}" if g.ceiling else "?",
          *[x.text() if x else "-" for x in (g.h2d, g.d2h, g.host_bidir, g.lat_h2d, g.lat_d2h, g.local)],
          f"{g.replays_before} → {g.replays_after}"] for g in res.gpus]))
    env = res.environment
    body.append("<h2>Environment</h2>")
    body.append(report._table(["key", "value"], [[k, v] for k, v in sorted(env.items())]
                              + [["wall time (s)", "" if res.wall_s is None else f"{res.wall_s:.1f}"]]))
    return report.page("commdiag p2p", "\n".join(body), figs)


def _flag_table(res: P2PResult) -> str:
    """One row per check (its criterion and what to do once), every subject's evidence in it."""
    groups: dict[tuple, list] = {}
    for f in res.flags:
        groups.setdefault((f.severity, f.code, f.criterion, f.action), []).append(f)
    esc = report.esc
    rows = [[esc(sev), esc(code), "<br>".join(f"<b>{esc(f.subject)}</b>: {esc(f.evidence)}" for f in fs),
             esc(criterion), esc(action)] for (sev, code, criterion, action), fs in groups.items()]
    return report._table(["severity", "check", "evidence", "criterion", "what to do"], rows, raw_cells=True)


def _checks(p: Pair) -> str:
    parts = []
    for name, c in (("a→b", p.check_ab), ("b→a", p.check_ba)):
        if c is not None:
            parts.append(f"{name} {'ok' if c.ok else f'{c.mismatches} bytes differ'} ({c.bytes} B)")
    return ", ".join(parts) or "-"


def _link(gen, width) -> str:
    return "?" if gen is None and width is None else f"gen{gen} x{width}"
