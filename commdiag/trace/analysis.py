"""From read traces (reader.Trace, one per rank) to the answer: pure functions, no I/O.

Steps (``find_steps``), in this order unless ``step`` names a pattern: torch.profiler's
``ProfilerStep#N``; else a repeated CPU annotation with a number at its end (``decode_step_3``, a
server's own ``record_function``); else each CUDA graph launch; else the whole trace as one step.  A
step's GPU window runs from the first to the last GPU activity it launched (the GPU work whose CUDA
runtime call lies inside the CPU annotation, or that one graph launch's kernels), as Kineto's
``gpu_user_annotation`` and HTA's per-iteration kernel span do.

The split of a window (``split``) follows HTA's temporal breakdown: compute = the union of compute
kernels; communication exposed = NCCL (and custom all-reduce) time while no compute kernel runs; memory =
copies and sets while neither runs; idle = the window less all GPU activity (union over every stream).
Host-caused idle: each idle gap whose next kernel's launch call began after the gap began, i.e. the GPU
had nothing queued (HTA's host_wait, here over the union of streams rather than per stream).
"""

from __future__ import annotations

import bisect
import re
import statistics
from collections import defaultdict

from . import intervals, kernels
from .reader import Trace
from .result import (COMM_BOUND, COMPUTE_BOUND, IDLE_OTHER, LAUNCH_BOUND, MEMORY_BOUND, RankTrace, Size, Split,
                     Step, Straggler, TraceReport)

# Host-caused idle at or above this share of a step calls the step launch-bound: the GPU then spends
# at least a fifth of the step waiting for the CPU, which CUDA graphs remove and no NCCL variable touches.
LAUNCH_BOUND_SHARE = 0.2
_NUMBERED = re.compile(r"^(.*?[_#\s.:-]?)(\d+)$")
PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")


def find_steps(trace: Trace, step: str | None = None) -> tuple[str, list[tuple[str, float, float, list[int]]]]:
    """(how they were found, [(name, cpu start, cpu duration or None, GPU event indices)]) of one trace."""
    gpu = trace.gpu
    by_launch = sorted((trace.launches[g[5]][0], i) for i, g in enumerate(gpu)
                       if g[5] is not None and g[5] in trace.launches)
    launch_ts = [t for t, _ in by_launch]

    def launched_in(ts: float, dur: float) -> list[int]:
        lo, hi = bisect.bisect_left(launch_ts, ts), bisect.bisect_right(launch_ts, ts + dur)
        return sorted(i for _, i in by_launch[lo:hi])

    def from_annotations(anns, source):
        out = []
        for name, ts, dur, _pid, _tid in sorted(anns, key=lambda a: a[1]):
            members = launched_in(ts, dur)
            if members:
                out.append((name, ts, dur, members))
        return source, out

    anns = trace.cpu_annotations
    if step is not None:
        pat = re.compile(step)
        chosen = [a for a in anns if pat.search(a[0])]
        source, steps = from_annotations(chosen, f"CPU annotations matching {step!r}")
        return source, steps
    prof = [a for a in anns if PROFILER_STEP.match(a[0])]
    if prof:
        source, steps = from_annotations(prof, "ProfilerStep#N (torch.profiler's step annotations)")
        if steps:
            return source, steps
    groups: dict[str, list] = defaultdict(list)
    for a in anns:
        m = _NUMBERED.match(a[0])
        if m and m.group(1):
            groups[m.group(1)].append(a)
    ranked = sorted(((len(v), -min(a[1] for a in v), k) for k, v in groups.items() if len(v) >= 2), reverse=True)
    for _n, _t, prefix in ranked:
        source, steps = from_annotations(groups[prefix], f"the annotations {prefix}N (record_function)")
        if len(steps) >= 2:
            return source, steps
    if trace.graph_launches:
        by_corr: dict = defaultdict(list)
        for i, g in enumerate(gpu):
            by_corr[g[5]].append(i)
        steps = [(f"graph replay {n}", ts, None, by_corr[c]) for n, (ts, dur, c) in
                 enumerate(sorted(trace.graph_launches)) if by_corr.get(c)]
        if steps:
            return "CUDA graph launches (one step per replay)", steps
    return "the whole trace (no step annotations, no graph launches)", [("whole trace", None, None,
                                                                          list(range(len(gpu))))]


def split(trace: Trace, start: float, end: float) -> tuple[Split, tuple]:
    """The time split of [start, end] on this rank's GPU, and its segments (start, end, part)."""
    gpu = trace.gpu
    parts: dict[str, list] = {"compute": [], "comm": [], "memory": []}
    per_coll: dict[str, list] = defaultdict(list)
    starts: dict[float, int] = {}
    count = 0
    kinds = _kinds(trace)
    for i in _in_window(trace, start, end):
        ts, dur, _stream, cat, name_i, corr, _ext = gpu[i]
        s, e = max(ts, start), min(ts + dur, end)
        if e <= s and not (dur == 0 and start <= ts <= end):
            continue
        count += 1
        k, coll = kinds[(name_i, cat)]
        if k == kernels.COMPUTE:
            parts["compute"].append((s, e))
        elif k == kernels.MEMORY:
            parts["memory"].append((s, e))
        else:
            parts["comm"].append((s, e))
            per_coll[coll].append((s, e))
        # of several kernels starting at once, the one launched first says whether anything was queued
        if ts >= start and (ts not in starts or _launch(trace, corr) < _launch(trace, gpu[starts[ts]][5])):
            starts[ts] = i
    compute = intervals.union(parts["compute"])
    comm = intervals.union(parts["comm"])
    memory = intervals.union(parts["memory"])
    busy = intervals.union(compute + comm + memory)
    step_us = end - start
    idle_gaps = intervals.gaps(busy, start, end)
    host_gaps, other_gaps = [], []
    for g0, g1 in idle_gaps:
        nxt = starts.get(g1)
        (host_gaps if nxt is not None and _launch(trace, gpu[nxt][5]) > g0 else other_gaps).append((g0, g1))
    host = intervals.length(host_gaps)
    comm_exposed = intervals.minus(comm, compute)
    mem_exposed = intervals.minus(memory, intervals.union(compute + comm))
    by_coll = tuple(sorted(((c, intervals.length(u := intervals.union(v)), intervals.minus(u, compute))
                            for c, v in per_coll.items()), key=lambda x: -x[1]))
    sp = Split(step_us=step_us, compute_us=intervals.length(compute), comm_exposed_us=comm_exposed,
               memory_us=mem_exposed, idle_us=step_us - intervals.length(busy), comm_us=intervals.length(comm),
               comm_overlapped_us=intervals.overlap(comm, compute), host_idle_us=host, kernels=count,
               by_collective=by_coll)
    return sp, _segments(compute, comm, memory, other_gaps, host_gaps)


def _kinds(trace: Trace) -> dict:
    """(name index, category) -> (kernels.kind, collective): each distinct kernel name classified once."""
    cached = getattr(trace, "_kinds_cache", None)
    if cached is None:
        cached = {}
        for g in trace.gpu:
            key = (g[4], g[3])
            if key not in cached:
                k = kernels.kind(trace.names[g[4]], g[3])
                coll = (kernels.parse_nccl(trace.names[g[4]]).collective if k == kernels.NCCL
                        else "custom all-reduce" if k == kernels.CUSTOM_COMM else None)
                cached[key] = (k, coll)
        trace._kinds_cache = cached
    return cached


def _launch(trace: Trace, corr) -> float:
    """When the CUDA call that launched this GPU work began (-inf: unknown, i.e. queued long before)."""
    hit = trace.launches.get(corr) if corr is not None else None
    return hit[0] if hit else float("-inf")


def _in_window(trace: Trace, start: float, end: float) -> list[int]:
    order = _order(trace)
    ts_sorted, longest = order
    lo = bisect.bisect_left(ts_sorted[0], start - longest)
    hi = bisect.bisect_right(ts_sorted[0], end)
    gpu = trace.gpu
    return [i for i in ts_sorted[1][lo:hi] if gpu[i][0] + gpu[i][1] >= start]


def _order(trace: Trace):
    cached = getattr(trace, "_order_cache", None)
    if cached is None or cached[2] != len(trace.gpu):
        idx = sorted(range(len(trace.gpu)), key=lambda i: trace.gpu[i][0])
        ts = [trace.gpu[i][0] for i in idx]
        longest = max((g[1] for g in trace.gpu), default=0.0)
        cached = ((ts, idx), longest, len(trace.gpu))
        trace._order_cache = cached
    return cached[0], cached[1]


def _segments(compute, comm, memory, idle, host_idle) -> tuple:
    """The window as disjoint (start, end, part) runs in the split's precedence: compute, then NCCL, then
    memory, then idle, host-caused or not (what the timeline picture draws)."""
    out = [(s, e, "compute") for s, e in compute]
    out += [(s, e, "communication") for s, e in intervals.difference(comm, compute)]
    out += [(s, e, "memory") for s, e in intervals.difference(memory, intervals.union(compute + comm))]
    out += [(s, e, "idle") for s, e in idle]
    out += [(s, e, "idle (host)") for s, e in host_idle]
    return tuple(sorted(out))


def sizes(trace: Trace, members: list[int]) -> list[Size]:
    """Per collective x message size x what NCCL chose: how many, how long (``members``: GPU event indices)."""
    by_ext = {c[3]: c for c in trace.comms if c[3] is not None}
    comms_sorted = sorted(trace.comms, key=lambda c: c[0])
    comm_ts = [c[0] for c in comms_sorted]
    rows: dict[tuple, list] = defaultdict(list)
    for i in members:
        ts, dur, _stream, cat, name_i, corr, ext = trace.gpu[i]
        name = trace.names[name_i]
        if kernels.kind(name, cat) != kernels.NCCL:
            continue
        nk = kernels.parse_nccl(name)
        rec = by_ext.get(ext) if ext is not None else None
        if rec is None and corr in trace.launches:  # no External id: the record_param_comms around the launch
            lt = trace.launches[corr][0]
            j = bisect.bisect_right(comm_ts, lt) - 1
            if j >= 0 and comms_sorted[j][0] + comms_sorted[j][1] >= lt:
                rec = comms_sorted[j]
        nelems, dtype, group = None, nk.dtype, None
        if rec is not None:
            nelems = rec[6] if isinstance(rec[6], int) and not isinstance(rec[6], bool) else None
            dtype = rec[5] if isinstance(rec[5], str) else dtype
            group = rec[8] if isinstance(rec[8], int) else None
        rows[(nk.collective, dtype, nelems, nk.algorithm, nk.protocol, group)].append(dur)
    out = []
    for (coll, dtype, nelems, algo, proto, group), durs in rows.items():
        nbytes = nelems * kernels.DTYPE_BYTES[dtype] if nelems is not None and dtype in kernels.DTYPE_BYTES else None
        out.append(Size(coll, dtype, nelems, nbytes, algo, proto, len(durs), sum(durs), statistics.median(durs), group))
    return sorted(out, key=lambda s: (s.collective, s.bytes or 0, s.algorithm, s.protocol))


def rank_trace(trace: Trace, rank: int, step: str | None = None) -> RankTrace:
    source, found = find_steps(trace, step)
    gpu = trace.gpu
    steps, members_all, notes = [], [], []
    gann: dict[str, list] = defaultdict(list)
    for name, ts, dur, _tid in trace.gpu_annotations:
        gann[name].append((ts, ts + dur))
    for n, (name, cpu_ts, cpu_dur, members) in enumerate(found):
        start = min(gpu[i][0] for i in members)
        end = max(gpu[i][0] + gpu[i][1] for i in members)
        sp, segs = split(trace, start, end)
        steps.append(Step(n, name, start, sp, cpu_dur, segs))
        members_all += members
    if not steps:
        raise _no_steps(trace, source)
    if step is None and source.startswith("the whole trace"):
        notes.append("no step annotations and no CUDA graph launches in this trace: the whole trace is one step; "
                     "give --step NAME for your server's own step annotation (docs/trace.md)")
    sz = sizes(trace, sorted(set(members_all)))
    if any(s.nelems is None for s in sz) and sz:
        notes.append("message sizes unknown for some collectives: CUDA graph replays record no record_param_comms "
                     "(the sizes are recorded when the graph is captured); profile an eager step to see them")
    info = trace.meta.get("distributedInfo") if isinstance(trace.meta.get("distributedInfo"), dict) else {}
    props = trace.meta.get("deviceProperties")
    device = props[0].get("name") if isinstance(props, list) and props and isinstance(props[0], dict) else None
    return RankTrace(rank=rank, path=trace.path, world_size=trace.world_size,
                     nccl_version=info.get("nccl_version") if isinstance(info.get("nccl_version"), str) else None,
                     device=device if isinstance(device, str) else None, step_source=source, steps=tuple(steps),
                     sizes=tuple(sz), notes=tuple(notes))


def _no_steps(trace: Trace, source: str):
    from ..errors import CommdiagError

    return CommdiagError(f"{trace.path}: no step found ({source}) that launched GPU work; "
                         "give --step NAME with a CPU annotation that encloses the launches (docs/trace.md)")


def stragglers(ranks: list[RankTrace]) -> list[Straggler]:
    """Per step index present on every rank (ranks ran the same steps in the same order)."""
    if len(ranks) < 2:
        return []
    n = min(len(r.steps) for r in ranks)
    out = []
    for i in range(n):
        steps = [(r.rank, r.steps[i].split) for r in ranks]
        slow = max(steps, key=lambda x: x[1].step_us)
        fast = min(steps, key=lambda x: x[1].step_us)
        with_comm = [x for x in steps if x[1].comm_us > 0]
        late = min(with_comm, key=lambda x: x[1].comm_us) if len(with_comm) >= 2 else None
        waited = (max(x[1].comm_us for x in with_comm) - late[1].comm_us) if late else 0.0
        out.append(Straggler(i, slow[0], slow[1].step_us, fast[0], fast[1].step_us,
                             late[0] if late else None, waited))
    return out


def typical_shares(ranks: list[RankTrace]) -> dict:
    """Shares of each rank's typical (median) step, averaged over ranks."""
    keys = ("compute_us", "comm_us", "comm_exposed_us", "memory_us", "idle_us", "host_idle_us")
    out = {k[:-3]: statistics.fmean(r.typical().split.share(k) for r in ranks) for k in keys}
    out["step_us"] = statistics.fmean(r.typical().split.step_us for r in ranks)
    return out


def verdict(t: dict) -> str:
    host, comm = t["host_idle"], t["comm_exposed"]
    if host >= LAUNCH_BOUND_SHARE and host >= comm:
        return LAUNCH_BOUND
    shares = {COMM_BOUND: comm, COMPUTE_BOUND: t["compute"], MEMORY_BOUND: t["memory"],
              IDLE_OTHER: t["idle"] - host, LAUNCH_BOUND: host}
    return max(shares, key=shares.get)


def pct(x: float) -> str:
    p = 100 * x
    return f"{p:.0f}%" if p >= 9.5 or p == 0 else f"{p:.1f}%" if p >= 0.05 else "<0.1%"


def headline(t: dict, v: str, ranks: list[RankTrace]) -> str:
    """The answer in one line of plain words."""
    comm = f"communication is {pct(t['comm'])} of this step"
    if t["comm"] > 0 and t["comm_exposed"] < t["comm"] - 0.005:
        comm += f" ({pct(t['comm_exposed'])} exposed, the rest overlapped with compute)"
    host = f"the GPU waits for the CPU {pct(t['host_idle'])} of the time"
    if v == LAUNCH_BOUND:
        return f"{comm}; {host} (eager launches): CUDA graphs, not NCCL settings, are where the time is"
    if v == COMM_BOUND:
        sizes = sorted({(s.collective, s.bytes, s.algorithm, s.protocol) for r in ranks for s in r.sizes},
                       key=lambda s: -1 if s[1] is None else s[1])
        chose = ", ".join(f"{c} {a}/{p}" if b is None else f"{c} {size_text(b)} {a}/{p}" for c, b, a, p in sizes[:3]) + (" ..." if len(sizes) > 3 else "")
        return (f"{comm} (NCCL chose {chose}); {host}: communication is where the time is; the stragglers say "
                "whether a rank waits for another, commdiag sweep at these sizes whether a setting is faster")
    if v == COMPUTE_BOUND:
        return f"{comm}; compute kernels are {pct(t['compute'])}: the kernels themselves, not NCCL settings, are where the time is"
    if v == MEMORY_BOUND:
        return f"{comm}; memory copies are {pct(t['memory'])}: the copies, not NCCL settings, are where the time is"
    return (f"{comm}; the GPU is idle {pct(t['idle'])} of the time but the host caused only {pct(t['host_idle'])} "
            "of it (synchronisation or waiting on something outside the GPU): not NCCL settings")


def size_text(n: int | None) -> str:
    if n is None:
        return "size ?"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            v = n / div
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.3g} {unit}"
    return f"{n} B"


def analyse(traces: list[Trace], step: str | None = None) -> TraceReport:
    """Every rank's trace -> the report (ranks numbered by distributedInfo.rank, else by file order)."""
    ranks = []
    for n, t in enumerate(traces):
        ranks.append(rank_trace(t, t.rank if t.rank is not None else n, step))
    ranks.sort(key=lambda r: r.rank)
    t = typical_shares(ranks)
    v = verdict(t)
    notes = []
    counts = {len(r.steps) for r in ranks}
    if len(counts) > 1:
        notes.append("the ranks recorded different numbers of steps (" + ", ".join(
            f"rank {r.rank}: {len(r.steps)}" for r in ranks) + "): stragglers compare the first "
            f"{min(counts)} by position")
    ws = {r.world_size for r in ranks if r.world_size}
    if ws and max(ws) > len(ranks):
        notes.append(f"{len(ranks)} of {max(ws)} ranks' traces given: the straggler is among these only")
    return TraceReport(headline=headline(t, v, ranks), verdict=v, typical=t, ranks=tuple(ranks),
                       stragglers=tuple(stragglers(ranks)), notes=tuple(notes))
