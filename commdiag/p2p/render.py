"""``commdiag p2p`` as text: GPU x GPU matrices (rows send to columns), the per-GPU host link
table, then the flags grouped by check.  Every line fits 100 columns for 8 GPUs: a cell is 10
characters, ``54.8±1%`` (median, and half the min-max range as a percentage of it)."""

from __future__ import annotations

import textwrap

from .result import FAIL, HUNG, INFO, NOT_RUN, OK, WARN, FAILED, Gpu, P2PResult, Pair, Stat, num

WIDTH = 100
CELL = 10
LABEL = 6


def cell(s: Stat | None) -> str:
    if s is None:
        return "-"
    pct = s.spread_pct
    return f"{num(s.median)}±{pct:.0f}%" if pct < 99.5 else f"{num(s.median)}±>99%"


def _status_cell(p: Pair | None) -> str | None:
    if p is None:
        return "?"
    return {HUNG: "HUNG", FAILED: "FAILED", NOT_RUN: "not run"}.get(p.status)


def _matrix(res: P2PResult, title: str, value, legend: str | None = None) -> list[str]:
    """``value(pair, src, dst) -> str`` per off-diagonal cell."""
    n = [g.index for g in res.gpus]
    lines = _wrap(title)
    lines.append(" " * LABEL + "".join(f"{'GPU' + str(j):>{CELL}}" for j in n))
    for i in n:
        row = []
        for j in n:
            if i == j:
                row.append("-")
                continue
            p = res.pair(i, j)
            row.append(_status_cell(p) or value(p, i, j))
        lines.append(f"{'GPU' + str(i):<{LABEL}}" + "".join(f"{c[:CELL - 1]:>{CELL}}" for c in row))
    if legend:
        lines += _wrap(legend, indent="")
    return lines


def _flagged(res: P2PResult) -> set[str]:
    return {f.subject for f in res.flags if f.severity in (FAIL, WARN)}


def render(res: P2PResult) -> str:
    s = res.settings
    n = len(res.gpus)
    wall = f" in {res.wall_s:.1f} s" if res.wall_s is not None else ""
    out = _wrap(f"commdiag p2p: {n} GPU{'s' if n != 1 else ''}, {_mib(s.size_bytes)} copies x {s.repeats} "
                f"repeats, latency {s.latency_copies} x 16 B x {s.latency_repeats} repeats{wall}")
    for g in res.gpus:
        nv = f" (NVML {g.nvml_index})" if g.nvml_index is not None and g.nvml_index != g.index else ""
        out.append(f"  GPU{g.index}  {(g.name or '?')[:48]}  {g.bus_id or ''}{nv}".rstrip())
    out += _wrap("Values: median over repeats, ± half the min-max range as % of the median; GB/s = 10^9 B/s.")
    if n >= 2:
        flagged = _flagged(res)
        out.append("")
        out += _matrix(res, "Peer access: CUDA (y/n) / NVML P2P read and write (ok, no, part), and the path",
                       lambda p, i, j: f"{_yn(p.peer_ab if i == p.a else p.peer_ba)}/{_nvml(p)} {p.path or '?'}")
        out.append("")
        out += _matrix(res, "P2P one way, GB/s (copy engine, row writes to column; * flagged)",
                       lambda p, i, j: _p2p_cell(p, "p2p", i, j, flagged))
        out.append("")
        out += _matrix(res, "P2P one way, % of the link's ceiling (ceilings below)",
                       lambda p, i, j: _pct(p.get("p2p", i, j), p))
        out.append("")
        out += _matrix(res, "Through pinned host memory one way, GB/s (D2H then H2D, 4 MiB pipeline)",
                       lambda p, i, j: cell(p.get("host", i, j)))
        out.append("")
        out += _matrix(res, "Both ways at once, GB/s summed (above the diagonal: P2P; below: through host)",
                       lambda p, i, j: cell(p.p2p_bidir if i < j else p.host_bidir))
        out.append("")
        out += _matrix(res, "P2P latency, us per 16 B copy (queued behind a spin kernel, row to column)",
                       lambda p, i, j: _p2p_cell(p, "lat_p2p", i, j, set()))
        out.append("")
        out += _matrix(res, "Latency through host memory, us per 16 B copy (D2H, then H2D on the peer)",
                       lambda p, i, j: cell(p.get("lat_host", i, j)))
        ceilings = sorted({(p.ceiling.gbps, p.ceiling.basis) for p in res.pairs if p.ceiling is not None})
        for gbps, basis in ceilings:
            out += _wrap(f"  ceiling {gbps:g} GB/s one way: {basis}", indent="    ")
    out.append("")
    out += _gpu_table(res.gpus)
    out.append("")
    out += render_flags(res)
    for note in res.notes:
        out += _wrap(f"note: {note}")
    return "\n".join(out)


def _gpu_table(gpus: tuple[Gpu, ...]) -> list[str]:
    head = (f"{'GPU':<4}{'link (load/max)':<16}{'H2D GB/s':>11}{'D2H GB/s':>11}{'both GB/s':>11}"
            f"{'H2D us':>11}{'D2H us':>11}{'local GB/s':>11}{'replays':>9}")
    lines = ["Host link per GPU (pinned host memory; link as NVML reads it while copies run)", head]
    for g in gpus:
        link = "?"
        if g.link is not None:
            load = f"{_gen(g.link.gen, g.link.width)}"
            link = f"{load}/{_gen(g.link.gen_max, g.link.width_max)}"
        if g.status != OK:
            vals = [{HUNG: "HUNG", FAILED: "FAILED", NOT_RUN: "not run"}.get(g.status, g.status)] + [""] * 5
        else:
            vals = [cell(s) for s in (g.h2d, g.d2h, g.host_bidir, g.lat_h2d, g.lat_d2h, g.local)]
        d = g.replay_delta
        rep = "?" if d is None else f"+{d}"
        lines.append(f"{g.index:<4}{link[:15]:<16}" + "".join(f"{v[:10]:>11}" for v in vals) + f"{rep:>9}")
    ceil = sorted({(g.ceiling.gbps, g.ceiling.basis) for g in gpus if g.ceiling is not None})
    for gbps, basis in ceil:
        lines += _wrap(f"  ceiling {gbps:g} GB/s one way: {basis}", indent="    ")
    lines += _wrap("link: g5x16 is PCIe gen5 x16, the highest NVML reading while copies ran / the most this "
                   "device and system allow; local: a copy within the GPU, read + write counted "
                   "(p2pBandwidthLatencyTest's diagonal); replays: growth of NVML's PCIe replay counter "
                   "during the run.")
    return lines


def render_flags(res: P2PResult) -> list[str]:
    if not res.flags:
        return ["Flags: none (every check passed)" if res.pairs or res.gpus else "Flags: none"]
    counts = {sev: sum(1 for f in res.flags if f.severity == sev) for sev in (FAIL, WARN, INFO)}
    lines = ["Flags: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v)]
    groups: dict[tuple, list] = {}
    for f in res.flags:
        groups.setdefault((f.severity, f.code, f.criterion, f.action), []).append(f)
    for (sev, code, criterion, action), fs in groups.items():
        lines += _wrap(f"{sev.upper()} {code} ({len(fs)}): {criterion}")
        for f in fs:
            lines += _wrap(f"  {f.subject}: {f.evidence}", indent="      ")
        lines += _wrap(f"  what to do: {action}", indent="      ")
    return lines


def _p2p_cell(p: Pair, what: str, i: int, j: int, flagged: set[str]) -> str:
    peer = p.peer_ab if i == p.a else p.peer_ba
    s = p.get(what, i, j)
    if s is None and peer is False:
        return "no P2P"
    return cell(s) + ("*" if f"{i}->{j}" in flagged else "")


def _pct(s: Stat | None, p: Pair) -> str:
    if s is None or p.ceiling is None:
        return "-"
    return f"{100 * s.median / p.ceiling.gbps:.0f}%"


def _yn(v) -> str:
    return "?" if v is None else ("y" if v else "n")


def _nvml(p: Pair) -> str:
    vals = [p.nvml_p2p.get(c) for c in ("READ", "WRITE")]
    if all(v is None for v in vals):
        return "?"
    ok = [v == "OK" for v in vals]
    return "ok" if all(ok) else ("part" if any(ok) else "no")


def _gen(gen, width) -> str:
    return f"g{gen if gen is not None else '?'}x{width if width is not None else '?'}"


def _mib(n: int) -> str:
    return f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n} B"


def _wrap(text: str, indent: str = "    ") -> list[str]:
    return textwrap.wrap(text, WIDTH, subsequent_indent=indent, break_on_hyphens=False) or [""]
