"""``explain --log``: what NCCL chose in a saved log of any process (a user's own server, one file per
rank or one combined file): version, the NCCL_* values NCCL says it applied, the transport per GPU
pair, rings and trees, the tuner plugin's lines and, where TUNING was logged, the choice per size.

Pure over files: ``explain_logs(paths)`` reads them (``logread``: bounded, regular files only) and
returns a ``LogReport``; ``render`` gives the text, ``to_json`` the body of the versioned envelope
``commdiag-nccl-log`` (docs/formats.md, "A saved NCCL log").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..errors import terminal_safe
from . import logread, ncclog, transports, tunerlog

# 2: a log with a multi-node communicator keys transports by rank/GPU ("r8/GPU0"); 1 folded them by GPU index
LOG_FORMAT, LOG_VERSION = "commdiag-nccl-log", 2
CLIP = 300  # characters of one value/message kept in the report (a hostile log's 64 KB line is not)


def _clip(text: str, n: int = CLIP) -> str:
    return text if len(text) <= n else text[:n] + " [...]"


@dataclass
class LogReport:
    files: list[dict]
    processes: list[dict]
    applied: dict[str, dict[str, list[int]]]  # NAME -> value -> pids
    transports: dict
    tuner: list[dict]
    tuning: list[dict]  # per collective and size: the choice(s) NCCL logged, with calls and pids
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"files": self.files, "processes": self.processes, "applied": self.applied,
                "transports": self.transports, "tuner": self.tuner, "tuning": self.tuning, "notes": self.notes}


def explain_logs(paths) -> LogReport:
    """Read every file and explain what NCCL said in them; CommdiagError (exit 2) for an unreadable one."""
    files = [logread.read(str(p)) for p in paths]
    kept = [line for f in files for line in f.kept]
    text = "\n".join(kept)
    procs_env = ncclog.parse(text)
    procs_tr = transports.parse_lines(kept)
    tuners = tunerlog.parse(text)
    processes = []
    for (host, pid), p in sorted(procs_tr.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        env = procs_env.get(pid)
        processes.append({
            "host": host, "pid": pid, "device": p.device, "version": p.version or (env.version if env else None),
            "applied": {k: _clip(v) for k, v in (env.applied.items() if env else [])},
            "warnings": [_clip(w) for w in (env.warnings[:20] if env else [])],
            "comms": [{"comm": c.comm, "rank": c.rank, "nranks": c.nranks, "nnodes": c.nnodes,
                       "local_ranks": c.local_ranks, "cuda_dev": c.cuda_dev, "nvml_dev": c.nvml_dev}
                      for c in p.comms if c.nranks is not None],
            "connections": len(p.connections), "connected": sorted(set(p.connected))})
    for pid, env in sorted(procs_env.items()):  # processes with only ENV lines (NCCL_DEBUG_SUBSYS=ENV)
        if not any(pr["pid"] == pid for pr in processes):
            processes.append({"host": env.host, "pid": pid, "device": env.device, "version": env.version,
                              "applied": {k: _clip(v) for k, v in env.applied.items()},
                              "warnings": [_clip(w) for w in env.warnings[:20]], "comms": [], "connections": 0,
                              "connected": []})
    applied: dict[str, dict[str, list[int]]] = {}
    for pr in processes:
        for name, value in pr["applied"].items():
            applied.setdefault(name, {}).setdefault(value, []).append(pr["pid"])
    tuner = [{"pid": pid, "device": t.device, "summary": _clip(t.summary()), "problems": [_clip(x) for x in t.problems()],
              "rules_fired": len(t.events)} for pid, t in sorted(tuners.items()) if t.wanted or t.loaded]
    report = LogReport([_file_json(f) for f in files], processes, applied,
                       transports.summary_json(procs_tr.values()), tuner, _tuning(files))
    report.notes = _notes(report, files)
    return report


def _file_json(f: logread.LogFile) -> dict:
    return {"path": f.path, "size": f.size, "read_bytes": f.read_bytes, "lines": f.lines, "nccl_lines": len(f.kept),
            "tuning_lines": sum(f.tuning.values()), "long_lines_skipped": f.long_lines,
            "nccl_lines_dropped": f.dropped, "truncated": f.truncated}


def _tuning(files: list[logread.LogFile], limit: int = 64) -> list[dict]:
    """Per (collective, size): the choice NCCL logged most, with its share of the calls and the pids."""
    calls: dict[tuple[str, int], Counter] = {}
    pids: dict[tuple[str, int], set] = {}
    for f in files:
        for (host, pid, coll, size, algo, proto, ch), n in f.tuning.items():
            calls.setdefault((coll, size), Counter())[(algo, proto, ch)] += n
            pids.setdefault((coll, size), set()).add(pid)
    out = []
    for (coll, size), counter in sorted(calls.items())[:limit]:
        (algo, proto, ch), n = counter.most_common(1)[0]
        out.append({"collective": coll, "bytes": size, "algo": algo, "proto": proto, "channels": ch,
                    "calls": sum(counter.values()), "share": round(n / sum(counter.values()), 3),
                    "other_choices": len(counter) - 1, "pids": sorted(pids[(coll, size)])})
    return out


def _notes(r: LogReport, files: list[logread.LogFile]) -> list[str]:
    out = []
    if not r.processes:
        out.append("no NCCL lines found: the log needs NCCL_DEBUG=INFO (lines 'host:pid:tid [dev] NCCL INFO ...')")
    elif not r.transports["pairs"] and any(p["warnings"] for p in r.processes):
        out.append("no connection lines: NCCL warned before it connected anything (WARN lines above)")
        if any("Duplicate GPU detected" in w for p in r.processes for w in p["warnings"]):
            out.append("Duplicate GPU detected: two ranks of one node were given the same GPU; each rank needs a "
                       "GPU of its own (LOCAL_RANK -> torch.cuda.set_device, or CUDA_VISIBLE_DEVICES per rank)")
    elif not r.transports["pairs"]:
        out.append("no connection lines: they need NCCL_DEBUG_SUBSYS with INIT (or P2P, SHM, NET), and NCCL "
                   ">= 2.22 prints them when the first collective connects")
    if r.processes and not r.applied:
        out.append("no 'set by environment' lines: they need NCCL_DEBUG_SUBSYS with ENV (or ALL)")
    nranks = max((c["nranks"] or 0 for p in r.processes for c in p["comms"]), default=0)
    if r.processes and len(r.processes) < nranks:
        out.append(f"the log holds {len(r.processes)} process(es) of a {nranks}-rank communicator: NCCL prints P2P "
                   "and SHM connections on the sending rank only, so pairs from the missing ranks show '.' "
                   "(give every rank's file)")
    versions = sorted({p["version"] for p in r.processes if p["version"]})
    if len(versions) > 1:
        out.append(f"processes run different NCCL versions: {', '.join(versions)}")
    for name, values in r.applied.items():
        if len(values) > 1:
            out.append(f"{name} differs between processes: " + "; ".join(
                f"{_clip(v, 40)} in pid(s) {', '.join(map(str, pids[:6]))}" for v, pids in values.items()))
    for f in files:
        if f.truncated:
            out.append(f"{f.path}: read the first {f.read_bytes} bytes only (limit {logread.MAX_BYTES})")
        if f.long_lines:
            out.append(f"{f.path}: skipped {f.long_lines} line(s) longer than {logread.MAX_LINE} bytes")
        if f.dropped:
            out.append(f"{f.path}: kept the first {logread.MAX_KEPT_LINES} NCCL lines, skipped {f.dropped}")
    return out


def render(r: LogReport) -> str:
    lines = []
    n_lines = sum(f["lines"] for f in r.files)
    lines.append(f"NCCL log: {len(r.files)} file(s), {n_lines} lines, {len(r.processes)} NCCL process(es)")
    versions = sorted({p["version"] for p in r.processes if p["version"]})
    lines.append(f"NCCL version: {', '.join(versions) or 'not in the log (NCCL prints it at init)'}")
    for p in r.processes[:32]:
        comms = "; ".join(f"rank {c['rank']}/{c['nranks']}" + (f" nNodes {c['nnodes']}" if c["nnodes"] else "")
                          for c in p["comms"][:4]) or "no communicator line"
        lines.append(f"  pid {p['pid']} on {p['host'][:24]} GPU {p['device']}: {comms}")
    if len(r.processes) > 32:
        lines.append(f"  ... and {len(r.processes) - 32} more processes (see --json)")
    lines.append("")
    lines.append("NCCL_* values NCCL says it applied ('set by environment', from the environment or nccl.conf):")
    if not r.applied:
        lines.append("  none logged")
    for name, values in sorted(r.applied.items()):
        for value, pids in values.items():
            who = "every process" if len(pids) == len(r.processes) else f"pid(s) {', '.join(map(str, pids[:6]))}"
            lines.append(f"  {name}={_clip(value, 60)}  ({who})")
    lines.append("")
    lines.append("Transport per GPU pair (what NCCL connected; row: sender, column: receiver):")
    lines += transports.render_matrix(r.transports)
    graphs = transports.render_graphs(r.transports)
    if graphs:
        lines.append("")
        lines.append("Rings (printed by rank 0) and trees (per rank), per communicator:")
        lines += graphs
    if r.transports["connected"]:
        lines.append("  connected: " + "; ".join(r.transports["connected"]))
    if r.tuner:
        lines.append("")
        lines.append("Tuner plugin:")
        for t in r.tuner[:16]:
            lines.append(f"  pid {t['pid']}: {t['summary']}")
            lines += [f"    FAILED: {x}" for x in t["problems"]]
    if r.tuning:
        lines.append("")
        lines.append("NCCL's choice per collective and size (TUNING lines; most frequent choice):")
        for t in r.tuning:
            ch = "?" if t["channels"] is None else t["channels"]
            other = f", {t['other_choices']} other choice(s)" if t["other_choices"] else ""
            lines.append(f"  {t['collective'][:14]:<14} {t['bytes']:>12} B: {t['algo']}/{t['proto']}/{ch} in "
                         f"{t['share']:.0%} of {t['calls']} calls{other}")
    warnings = [(p["pid"], w) for p in r.processes for w in p["warnings"]]
    if warnings:
        lines.append("")
        lines.append(f"NCCL WARN lines ({len(warnings)}):")
        lines += [f"  pid {pid}: {_clip(w, 80)}" for pid, w in warnings[:10]]
    for n in r.notes:
        lines.append(f"note: {n}")
    return "\n".join(_wrap([terminal_safe(l) for l in lines]))


def _wrap(lines: list[str]) -> list[str]:
    """Every line within 100 columns: wrapped at spaces with the line's indent plus two."""
    import textwrap

    out = []
    for line in lines:
        if len(line) <= transports.WIDTH:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip()) + 2)
        out += textwrap.wrap(line, transports.WIDTH, subsequent_indent=indent, break_on_hyphens=False) or [""]
    return out
