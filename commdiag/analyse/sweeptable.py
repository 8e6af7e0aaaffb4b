"""The sweep's console table: one row per size x mode x config, and a line for every row that looks odd.

The time is the gmean (celltime.py), the number the verdicts, the report and ``compare``
use; beside it the range of the launch values and their count (never a time without its
spread and launch count).  Rows can differ for reasons the table cannot show: a size
listed in bytes has no token count and so lies in no band, and stage 2 measures only the
band sizes, the claims' mode and the claimed configs; a failed launch is not counted.
Each such reason is one line under the table, so that no row is left unexplained.
Pure: a loaded run and its launch values in, text out.
"""

from __future__ import annotations

from . import celltime
from .. import linewrap
from .report import _fit
from .stats import LaunchValue, usable_launches
from ..measure import collectives

# size(B), tok, mode, config, gmean, min-max, launches, busbw, wrong: 100 columns in all
CONFIG_WIDTH = 21


def render(data, values: list[LaunchValue]) -> str:
    """The table (under 100 columns per line) with its legend and the notes on odd rows."""
    summary = data.summary
    if summary.empty:
        return "no samples"
    times = celltime.cell_times(values)
    step = bool(data.run.get("spec", {}).get("model"))  # a step's time is no all-reduce's: no bandwidth
    nranks = data.run.get("world_size") or 0
    lines = linewrap.fit_line(celltime.LEGEND + ("" if step else "; busbw: GB/s at the gmean"))
    lines.append(f"{'size(B)':>10} {'tok':>5} {'mode':<13} {'config':<{CONFIG_WIDTH}} {'gmean(us)':>9} "
                 f"{'min-max(us)':>15} {'launches':>8} {'busbw':>6} {'wrong':>5}")
    rows = []
    for r in summary.itertuples(index=False):
        tokens = _tokens(r.tokens)
        t = times.get((str(r.config), int(r.size_bytes), str(r.mode)))
        rows.append((str(r.config), int(r.size_bytes), tokens, str(r.mode), t))
        if t is None:  # samples, but no usable launch (every launch failed): nothing to show as a time
            gm, spread, n, bw = "n/a", "-", 0, "-"
        else:
            gm, spread, n = f"{t.us:.2f}", f"{t.lo_us:.1f}-{t.hi_us:.1f}", t.launches
            bw = "-" if step else f"{collectives.busbw_gbps(int(r.size_bytes), t.us, nranks):.2f}"
        lines.append(f"{r.size_bytes:>10} {'' if tokens is None else tokens:>5} {r.mode:<13} "
                     f"{_fit(str(r.config), CONFIG_WIDTH):<{CONFIG_WIDTH}} {gm:>9} {spread:>15} {n:>8} {bw:>6} "
                     f"{r.wrong:>5}")
    lines += [l for n in row_notes(data.run, rows, values) for l in linewrap.fit_line(n)]
    return "\n".join(lines)


def row_notes(run: dict, rows: list[tuple], values: list[LaunchValue]) -> list[str]:
    """One line per reason a row has no token count or fewer launches than others.
    ``rows``: (config, size_bytes, tokens, mode, CellTime or None) as the table shows them."""
    stage2 = {}  # (config, size, mode) -> stage-2 launches
    for v in values:
        if v.stage == 2:
            stage2[(v.config, v.size_bytes, v.mode)] = stage2.get((v.config, v.size_bytes, v.mode), 0) + 1
    confirmed = bool(stage2)
    notes = []
    no_tokens = sorted({size for _, size, tokens, _, _ in rows if tokens is None})
    if no_tokens and any(tokens is not None for _, _, tokens, _, _ in rows):
        sizes = ", ".join(f"{s} B" for s in no_tokens)
        notes.append(f"note: {sizes}: no token count (listed under sizes.bytes), so in no band"
                     + (" and not measured in stage 2: screening launches only" if confirmed else ""))
    if confirmed:
        configs2 = {c for c, _, _ in stage2}
        modes2 = {m for _, _, m in stage2}
        sizes2 = {s for _, s, _ in stage2}
        # default is every claim's reference, never a claim itself (after a Ctrl-C it may have no
        # stage-2 launch yet)
        plain = [c for c in dict.fromkeys(r[0] for r in rows) if c not in configs2 and c != "default"]
        if plain:
            notes.append(f"note: {', '.join(plain)}: screening launches only (not a stage-2 claim)")
        modes = [m for m in dict.fromkeys(r[3] for r in rows) if m not in modes2]
        if modes:
            notes.append(f"note: {', '.join(modes)} mode: screening launches only (stage 2 measures only the "
                         f"claims' mode, {', '.join(sorted(modes2))})")
        outside = sorted({size for _, size, tokens, _, _ in rows if tokens is not None and size not in sizes2})
        if outside:
            notes.append(f"note: {', '.join(f'{s} B' for s in outside)}: screening launches only (outside every "
                         "band; stage 2 measures band sizes)")
    bad = {}
    usable = usable_launches(run)
    for l in run.get("launches", []):
        if l.get("status") not in (None, "pending") and l["index"] not in usable:
            bad.setdefault(l["config"], []).append(l["status"])
    for config, statuses in bad.items():
        counts = ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses))
        notes.append(f"note: {config}: {counts} launch(es) not counted (their times are not evidence)")
    return notes


def _tokens(v):
    return None if v is None or str(v) in ("<NA>", "nan", "None") else int(v)
