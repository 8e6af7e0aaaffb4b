"""``commdiag trace --html FILE``: the same answer as the text, as one offline page in the report's style
(analyse/report.py: its CSS, escaping and embedded plotly.js), with a timeline per rank: each step a row,
its GPU time drawn as compute, communication, memory copies, idle the host caused and other idle, from the step's first GPU activity.

A step of thousands of kernels is drawn at a bounded resolution (``MAX_SEGMENTS`` runs per step: the
part that filled most of each slice), and at most ``MAX_TIMELINE_STEPS`` steps per rank are drawn; the
tables always hold every number.
"""

from __future__ import annotations

from ..analyse import report
from ..errors import CommdiagError
from .analysis import pct, size_text
from .result import TraceReport

MAX_TIMELINE_STEPS = 8
MAX_SEGMENTS = 2000
COLOURS = {"compute": "#2ca02c", "communication": "#d62728", "memory": "#9467bd", "idle (host)": "#ff7f0e",
           "idle": "#c7c7c7"}


def check_plotly() -> None:
    """Before reading traces: the page needs plotly (a long read must not end in an import error)."""
    missing = report.plotly_missing()
    if missing:
        raise CommdiagError(f"--html needs plotly: {missing}; or print --json here and keep the text")


def _coarse(segments: tuple, start: float, end: float) -> list[tuple[float, float, str]]:
    """At most MAX_SEGMENTS runs: each slice of the window drawn as the part that filled most of it."""
    if len(segments) <= MAX_SEGMENTS or end <= start:
        return list(segments)
    width = (end - start) / MAX_SEGMENTS
    fill = [dict() for _ in range(MAX_SEGMENTS)]
    for s, e, part in segments:
        a, b = int((s - start) / width), min(int((e - start) / width), MAX_SEGMENTS - 1)
        for k in range(max(a, 0), b + 1):
            lo, hi = max(s, start + k * width), min(e, start + (k + 1) * width)
            if hi > lo:
                fill[k][part] = fill[k].get(part, 0.0) + hi - lo
    out: list[list] = []
    for k, f in enumerate(fill):
        part = max(f, key=f.get) if f else "idle"
        s = start + k * width
        if out and out[-1][2] == part:
            out[-1][1] = s + width
        else:
            out.append([s, s + width, part])
    return [tuple(x) for x in out]


def timeline(rank) -> dict:
    steps = rank.steps[:MAX_TIMELINE_STEPS]
    data = []
    for part, colour in COLOURS.items():
        base, x, y, text = [], [], [], []
        for st in steps:
            label = f"{st.index}: {st.name}"
            for s, e, p in _coarse(st.segments, st.start_us, st.start_us + st.split.step_us):
                if p != part:
                    continue
                base.append(round((s - st.start_us) / 1000, 6))
                x.append(round((e - s) / 1000, 6))
                y.append(report.plot_text(label))
                text.append(report.plot_text(f"{label}: {part} {e - s:.1f} us at {(s - st.start_us) / 1000:.3f} ms"))
        data.append({"type": "bar", "orientation": "h", "name": part, "base": base, "x": x, "y": y,
                     "customdata": text, "marker": {"color": colour, "line": {"width": 0}}, "hovertemplate": "%{customdata}<extra></extra>"})
    more = f" (the first {len(steps)} of {len(rank.steps)} steps)" if len(rank.steps) > len(steps) else ""
    layout = {"barmode": "overlay", "height": 140 + 38 * len(steps), "bargap": 0.25,
              "xaxis": {"title": {"text": "ms since the step's first GPU activity"}},
              "yaxis": {"type": "category", "autorange": "reversed"},
              "margin": {"l": 160, "r": 20, "t": 30, "b": 50}, "legend": {"orientation": "h", "y": 1.12}}
    return {"id": f"timeline-rank{rank.rank}", "title": f"rank {rank.rank}: GPU timeline per step{more}",
            "data": data, "layout": layout}


def split_figure(rep: TraceReport) -> dict:
    parts = (("compute", "compute_us", COLOURS["compute"]), ("communication exposed", "comm_exposed_us", COLOURS["communication"]),
             ("memory copies", "memory_us", COLOURS["memory"]), ("idle (host)", "host_idle_us", COLOURS["idle (host)"]),
             ("idle (other)", None, COLOURS["idle"]))
    xs = [f"rank {r.rank}" for r in rep.ranks]
    data = []
    for name, key, colour in parts:
        ys = []
        for r in rep.ranks:
            sp = r.typical().split
            ys.append(round(100 * (sp.share(key) if key else sp.share("idle_us") - sp.share("host_idle_us")), 3))
        data.append({"type": "bar", "name": name, "x": xs, "y": ys, "marker": {"color": colour},
                     "hovertemplate": f"{name}: %{{y:.2f}}% of the step<extra></extra>"})
    layout = {"barmode": "stack", "height": 360, "yaxis": {"title": {"text": "% of the typical step"}, "range": [0, 100]},
              "margin": {"l": 60, "r": 20, "t": 30, "b": 40}}
    return {"id": "split", "title": "The typical (median) step of each rank", "data": data, "layout": layout}


def build_html(rep: TraceReport) -> str:
    esc = report.esc
    figs = [split_figure(rep)] + [timeline(r) for r in rep.ranks]
    t = rep.typical
    body = ["<h1>commdiag trace</h1>", f"<p class=\"headline\"><b>{esc(rep.headline)}</b></p>",
            f"<p>Typical step {esc(format(t['step_us'] / 1000, '.3f'))} ms: compute {esc(pct(t['compute']))}, communication "
            f"{esc(pct(t['comm']))} (exposed {esc(pct(t['comm_exposed']))}), memory copies {esc(pct(t['memory']))}, "
            f"idle {esc(pct(t['idle']))} (host-caused {esc(pct(t['host_idle']))}). Verdict: {esc(rep.verdict)}. "
            f"How to read it: {report.doc_link('trace.md')}.</p>"]
    body.append(report.plot_divs(figs[:1]))
    body.append("<h2>Per rank and step</h2>")
    rows = []
    for r in rep.ranks:
        for s in r.steps:
            sp = s.split
            rows.append([r.rank, s.name, f"{sp.step_us / 1000:.3f}", pct(sp.share("compute_us")),
                         pct(sp.share("comm_us")), pct(sp.share("comm_exposed_us")), pct(sp.share("memory_us")),
                         pct(sp.share("idle_us")), pct(sp.share("host_idle_us")),
                         "-" if s.cpu_us is None else f"{s.cpu_us / 1000:.3f}",
                         ", ".join(f"{c} {us:.0f} us ({ex:.0f} exposed)" for c, us, ex in sp.by_collective), sp.kernels])
    body.append(report.table(["rank", "step", "GPU ms", "compute", "comm", "comm exposed", "memcpy", "idle",
                              "idle (host)", "CPU ms", "by collective", "GPU events"], rows))
    body.append("<h2>Collectives: sizes and what NCCL chose</h2>")
    body.append(report.table(["rank", "collective", "elements", "dtype", "bytes", "group", "algorithm", "protocol",
                              "calls", "median us", "total us"],
                             [[r.rank, z.collective, "?" if z.nelems is None else z.nelems, z.dtype,
                               "?" if z.bytes is None else size_text(z.bytes), z.group_size or "?", z.algorithm,
                               z.protocol, z.count, f"{z.median_us:.1f}", f"{z.total_us:.0f}"]
                              for r in rep.ranks for z in r.sizes]))
    if rep.stragglers:
        body.append("<h2>Stragglers</h2>")
        body.append(report.table(["step", "slowest rank", "ms", "over fastest", "fastest rank", "arrived last",
                                  "others waited up to (ms)"],
                                 [[s.index, s.slowest_rank, f"{s.slowest_us / 1000:.3f}", f"{s.excess:.1%}",
                                   s.fastest_rank, "-" if s.late_rank is None else s.late_rank,
                                   f"{s.waited_us / 1000:.3f}"] for s in rep.stragglers]))
    if rep.savings is not None:
        body.append(f"<h2>What {esc(rep.sweep)}'s certified winners would save, at most</h2>")
        body.append(report.table(["band", "mode", "winner", "ratio", "trace sizes in it", "share of step", "saves at most",
                                  "note"],
                                 [[s.band, s.mode, s.config or "none (keep NCCL defaults)",
                                   "-" if s.ratio is None else f"{s.ratio:.3f}",
                                   ", ".join(size_text(b) for b in s.sizes) or "-", pct(s.band_share), pct(s.at_most),
                                   s.note] for s in rep.savings]))
    body.append("<h2>Timelines</h2>")
    body.append(report.plot_divs(figs[1:]))
    body.append("<h2>Traces</h2>")
    body.append(report.table(["rank", "file", "world size", "NCCL", "device", "steps found by"],
                             [[r.rank, r.path, r.world_size or "-", r.nccl_version or "-", r.device or "-",
                               r.step_source] for r in rep.ranks]))
    notes = list(rep.notes) + [f"rank {r.rank}: {n}" for r in rep.ranks for n in r.notes]
    if notes:
        body.append("<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    return report.page("commdiag trace", "\n".join(body), figs)
