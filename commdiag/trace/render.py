"""``commdiag trace``'s text: the one-line answer, then per rank and step the split, the collectives'
sizes and NCCL's choice, the stragglers, what --sweep's winner would save, and the notes."""

from __future__ import annotations

from .analysis import pct, size_text
from .result import TraceReport

MAX_STEP_ROWS = 12  # per rank; the JSON has every step


def _ms(us: float) -> str:
    return f"{us / 1000:.3f}" if us < 10_000 else f"{us / 1000:.1f}"


def render(rep: TraceReport) -> str:
    t = rep.typical
    lines = [rep.headline, "",
             f"typical step {_ms(t['step_us'])} ms (each rank's median step, mean over {len(rep.ranks)} rank"
             f"{'s' if len(rep.ranks) != 1 else ''}): compute {pct(t['compute'])}, communication {pct(t['comm'])} "
             f"(exposed {pct(t['comm_exposed'])}), memory copies {pct(t['memory'])}, idle {pct(t['idle'])} "
             f"(host-caused {pct(t['host_idle'])}); verdict: {rep.verdict}", ""]
    head = (f"{'rank':>4} {'step':<16} {'GPU ms':>8} {'compute':>8} {'comm':>7} {'exposed':>8} {'memcpy':>7} "
            f"{'idle':>6} {'host':>6} {'CPU ms':>8}")
    lines.append(head)
    for r in rep.ranks:
        shown = r.steps if len(r.steps) <= MAX_STEP_ROWS else r.steps[:MAX_STEP_ROWS]
        for s in shown:
            sp = s.split
            name = s.name if len(s.name) <= 16 else s.name[:15] + "~"
            lines.append(f"{r.rank:>4} {name:<16} {_ms(sp.step_us):>8} {pct(sp.share('compute_us')):>8} "
                         f"{pct(sp.share('comm_us')):>7} {pct(sp.share('comm_exposed_us')):>8} "
                         f"{pct(sp.share('memory_us')):>7} {pct(sp.share('idle_us')):>6} "
                         f"{pct(sp.share('host_idle_us')):>6} {'-' if s.cpu_us is None else _ms(s.cpu_us):>8}")
        if len(r.steps) > len(shown):
            lines.append(f"{'':>4} ... {len(r.steps) - len(shown)} more steps (--json has every one)")
    lines.append("  shares of the step's GPU time: compute + exposed + memcpy + idle = 100%; comm = all communication "
                 "(exposed + overlapped with compute); host = idle while nothing was queued (the CPU had not "
                 "launched the next kernel yet); CPU ms = the step's CPU annotation")
    lines.append("")
    lines.append("collectives (sizes from record_param_comms; algorithm/protocol from NCCL's kernel names):")
    any_size = False
    for r in rep.ranks:
        for z in r.sizes:
            any_size = True
            size = ("size unknown (graph replay)" if z.nelems is None
                    else f"{z.nelems} x {z.dtype} = {size_text(z.bytes)}" if z.bytes is not None
                    else f"{z.nelems} x {z.dtype}")
            group = f", group of {z.group_size}" if z.group_size else ""
            lines.append(f"  rank {r.rank}: {z.collective} {size}{group}: NCCL chose {z.algorithm}/{z.protocol}; "
                         f"{z.count} calls, median {z.median_us:.1f} us")
        if r.steps:
            sp = r.typical().split
            if sp.by_collective:
                lines.append(f"  rank {r.rank}, typical step: " + ", ".join(
                    f"{c} {pct(us / sp.step_us if sp.step_us else 0)} ({pct(ex / sp.step_us if sp.step_us else 0)} "
                    "exposed)" for c, us, ex in sp.by_collective))
    if not any_size:
        lines.append("  none: no NCCL kernel in these steps")
    if rep.stragglers:
        lines.append("")
        lines.append("stragglers (per step across ranks; the late rank spends least time inside collectives, "
                     "the others wait for it there):")
        for s in rep.stragglers[:MAX_STEP_ROWS]:
            late = (f"; rank {s.late_rank} arrived last: the others waited up to {_ms(s.waited_us)} ms for it"
                    if s.late_rank is not None and s.waited_us >= max(1.0, 0.01 * s.slowest_us) else "")
            lines.append(f"  step {s.index}: slowest rank {s.slowest_rank} {_ms(s.slowest_us)} ms, "
                         f"{s.excess:.1%} over rank {s.fastest_rank}{late}")
        if len(rep.stragglers) > MAX_STEP_ROWS:
            lines.append(f"  ... {len(rep.stragglers) - MAX_STEP_ROWS} more steps (--json)")
    if rep.savings is not None:
        lines.append("")
        lines.append(f"what {rep.sweep}'s certified winners would save of this step at most "
                     "((1 - ratio) x the band's all-reduce share):")
        for sv in rep.savings:
            sizes = ", ".join(size_text(b) for b in sv.sizes) or "no all-reduce of this trace"
            if sv.config is None:
                lines.append(f"  {sv.band} ({sizes}; {pct(sv.band_share)} of the step): no certified winner, "
                             f"keep NCCL defaults: saves nothing")
            else:
                lines.append(f"  {sv.band} ({sizes}; {pct(sv.band_share)} of the step): {sv.config}, ratio "
                             f"{sv.ratio:.3f} ({sv.mode}): at most {pct(sv.at_most)} of the step")
            if sv.note and sv.config is not None:
                lines.append(f"    {sv.note}")
    by_note: dict[str, list] = {}
    for r in rep.ranks:
        for n in r.notes:
            by_note.setdefault(n, []).append(str(r.rank))
    notes = list(rep.notes) + [f"rank{'s' if len(rs) > 1 else ''} {', '.join(rs)}: {n}" for n, rs in by_note.items()]
    sources = {r.step_source for r in rep.ranks}
    lines.append("")
    lines.append("steps: " + "; ".join(sorted(sources)))
    for n in notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)
