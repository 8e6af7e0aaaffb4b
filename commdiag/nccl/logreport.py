"""``explain --log``: what NCCL said in a saved log of any process (a user's own server or job, one file
per rank or one combined file, from one box or many): the nodes and GPUs, the transport per GPU pair,
what NCCL applied and warned, and the cause where the log shows one.

Pure over files: ``explain_logs(paths)`` reads them (``logread``: bounded, regular files only, any
launcher prefix) and returns a ``LogReport``; ``render`` gives the text, ``to_json`` the body of the
versioned envelope ``commdiag-nccl-log`` (docs/explain.md, "The JSON").  Everything is keyed by host
and pid: in containers two hosts often share a pid.  A host is a node (the ``host:pid:tid`` prefix of
every line), whether or not a ``comm ... nNodes K`` line made it into the file.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass, field

from ..errors import terminal_safe
from . import logread, ncclog, transports, tunerlog

# 3: nodes[] (each host with its processes and ranks), processes keyed "host:pid", applied/tuning by
#    "host:pid", network, failed connections, P2P-disabled pairs, version sources, causes; transports
#    endpoints carry their host.  2: multi-node transports keyed by rank/GPU.  1: by GPU index only.
LOG_FORMAT, LOG_VERSION = "commdiag-nccl-log", 3
CLIP = 300  # characters of one value/message kept in the report (a hostile log's 64 KB line is not)

# WARNs that are not a problem: NCCL looks for InfiniBand (libibverbs) and a net plugin on every start
BENIGN = re.compile(r"Failed to open libibverbs|libibverbs\.so|NET/Plugin|libnccl-net|No plugin found|"
                    r"Could not find: libnccl-(?:net|tuner)|NCCL_IB_DISABLE|NET/IB : No device found")


def _clip(text: str, n: int = CLIP) -> str:
    return text if len(text) <= n else text[:n] + " [...]"


def pid_text(host: str, pid) -> str:
    return f"{host}:{pid if pid is not None else '?'}"


@dataclass
class LogReport:
    files: list[dict]
    nodes: list[dict]
    processes: list[dict]
    version: dict  # versions seen, where each came from, the older forms read
    applied: dict[str, dict[str, list[str]]]  # NAME -> value -> ["host:pid", ...]
    transports: dict
    tuner: list[dict]
    tuning: list[dict]  # per collective and size: the choice(s) NCCL logged, with calls and processes
    network: list[dict] = field(default_factory=list)  # per host: what NCCL said about its network
    p2p_disabled: list[dict] = field(default_factory=list)  # per process: "P2P is disabled between ..."
    failed: list[dict] = field(default_factory=list)  # connections whose setup NCCL WARNed about
    warnings: list[dict] = field(default_factory=list)  # every WARN, with its process, benign or not
    causes: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # lines of a form this reader does not know
    notes: list[str] = field(default_factory=list)
    multi_node: bool = False  # endpoints keyed by rank/GPU: several nodes (host names, nNodes, connections)
    more_nodes: list[str] = field(default_factory=list)  # why the connections need more nodes than hosts

    def to_json(self) -> dict:
        return {"files": self.files, "nodes": self.nodes, "processes": self.processes, "nccl_version": self.version,
                "applied": self.applied, "transports": self.transports, "network": self.network,
                "p2p_disabled": self.p2p_disabled, "failed": self.failed, "warnings": self.warnings,
                "tuner": self.tuner, "tuning": self.tuning, "causes": self.causes, "unknown_forms": self.unknown,
                "multi_node": self.multi_node, "more_nodes_than_hosts": self.more_nodes, "notes": self.notes}


def _bus_of(text: str) -> str | None:
    """nccl-tests' bracket ("0xc1", "0000:c1:00.0") as NCCL's busId hex ("c1000")."""
    t = text.strip().lower()
    if t.startswith("0x"):
        return (t[2:].lstrip("0") or "0") + "000"
    digits = re.sub(r"[^0-9a-f]", "", t.split(":", 1)[1] if t.count(":") == 2 else t)
    return digits.lstrip("0") or None


def explain_logs(paths) -> LogReport:
    """Read every file and explain what NCCL said in them; CommdiagError (exit 2) for an unreadable one."""
    files = [logread.read(str(p)) for p in paths]
    _mend_hosts(files)
    recs = [r for f in files for r in f.kept]
    procs_tr = transports.parse_records(recs, extra=[(d["host"], d["pid"], _bus_of(d["bus"]), d["dev"], d["rank"])
                                                     for f in files for d in f.devices])
    procs_env = ncclog.parse_records(recs)
    tuners = tunerlog.parse_records(recs)
    tests_dev = {(d["host"], d["pid"]): d for f in files for d in f.devices}
    keys = sorted(set(procs_tr) | set(procs_env) | {(d["host"], d["pid"]) for f in files for d in f.devices},
                  key=lambda k: (k[0], -1 if k[1] is None else k[1]))
    file_versions = _file_versions(files)
    processes = []
    for key in keys:
        p = procs_tr.get(key) or transports.ProcessTransports(key[0], key[1], None)
        env = procs_env.get(key)
        version, source = p.version or (env.version if env else None), "NCCL's version line"
        if version is None and key in file_versions:
            version, source = file_versions[key]
        devices = sorted(set(p.devices) | {d["dev"] for d in (f.devices for f in files) for d in d
                                           if (d["host"], d["pid"]) == key})
        ranks = _ranks_of(p, devices)
        processes.append({
            "id": pid_text(*key), "host": key[0], "pid": key[1], "device": devices[0] if devices else None,
            "devices": devices, "ranks": ranks, "tag_rank": p.tag_rank, "tag_ip": p.tag_ip,
            "version": version, "version_source": source if version else None,
            "applied": {k: _clip(v) for k, v in (env.applied.items() if env else [])},
            "warnings": [_clip(w) for w in (env.warnings[:20] if env else [])],
            "comms": [{"comm": c.comm, "rank": c.rank, "nranks": c.nranks, "nnodes": c.nnodes,
                       "local_ranks": c.local_ranks, "cuda_dev": c.cuda_dev, "nvml_dev": c.nvml_dev}
                      for c in p.comms if c.nranks is not None],
            "gpu_names": sorted({d["name"] for f in files for d in f.devices if (d["host"], d["pid"]) == key}),
            "nvml": {d: i for d, i in sorted(p.nvml.items())},
            "connections": len(p.connections), "connected": sorted(set(p.connected)),
            "network": list(p.network), "forms": list(p.forms)})
    applied: dict[str, dict[str, list[str]]] = {}
    for pr in processes:
        for name, value in pr["applied"].items():
            applied.setdefault(name, {}).setdefault(value, []).append(pr["id"])
    tuner = [{"id": pid_text(*k), "pid": k[1], "host": k[0], "device": t.device, "summary": _clip(t.summary()),
              "problems": [_clip(x) for x in t.problems()], "rules_fired": len(t.events)}
             for k, t in sorted(tuners.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1)) if t.wanted or t.loaded]
    summary = transports.summary_json(procs_tr.values())
    _ranks_from_endpoints(processes, summary)
    report = LogReport([_file_json(f) for f in files], _nodes(processes, summary), processes,
                       _version(processes, files, procs_tr), applied, summary, tuner, _tuning(files))
    report.network = _network(procs_tr)
    report.p2p_disabled = [{"id": pid_text(*k), "host": k[0], "pid": k[1],
                            "pairs": sorted({tuple(sorted(x)) for x in p.p2p_disabled}), "lines": len(p.p2p_disabled)}
                           for k, p in procs_tr.items() if p.p2p_disabled]
    report.failed = [{"src": pr["src"], "dst": pr["dst"], "via": via, "warn": _clip(w)}
                     for pr in summary["pairs"] for via, w in pr.get("failed", {}).items()]
    report.warnings = [{"id": pr["id"], "host": pr["host"], "pid": pr["pid"], "text": w, "benign": bool(BENIGN.search(w))}
                       for pr in processes for w in pr["warnings"]]
    report.unknown = [_clip(u, 160) for p in procs_tr.values() for u in p.unknown][:20]
    report.multi_node = transports.multi_node(procs_tr.values())
    report.more_nodes = transports._more_nodes_than_hosts(list(procs_tr.values()))[:4] if len(report.nodes) < 2 \
        and report.multi_node else []
    report.causes = _causes(report, procs_tr)
    report.notes = _notes(report, files, recs)
    return report


def _ranks_from_endpoints(processes: list[dict], summary: dict) -> None:
    """A process that printed no rank of its own, on one GPU that a connection line of its host shows as
    a rank (RCCL's "Connected all rings comm ... busId" beside its peers' lines): that rank."""
    by_gpu: dict[tuple, set] = {}
    for e in summary.get("endpoints", {}).values():
        if e.get("host") and e["gpu"].isdigit():
            by_gpu.setdefault((e["host"], int(e["gpu"])), set()).update(e["ranks"])
    taken = {(p["host"], d) for p in processes if p["ranks"] for d in p["devices"]}
    for p in processes:
        if p["ranks"] or len(p["devices"]) != 1 or (p["host"], p["devices"][0]) in taken:
            continue
        ranks = by_gpu.get((p["host"], p["devices"][0]))
        if ranks and len(ranks) == 1 and sum(1 for q in processes if q["host"] == p["host"]
                                             and q["devices"] == p["devices"]) == 1:
            p["ranks"] = [{"device": p["devices"][0], "ranks": sorted(ranks), "from": "its GPU in the connections"}]


def _mend_hosts(files: list[logread.LogFile]) -> None:
    """A paste that lost the first characters of a line ("eepseek-v2-5-0:641:641" beside
    "deepseek-v2-5-0:641:641"): a host that ends another host of the same pid is that host."""
    hosts: dict[int, set] = {}
    for f in files:
        for r in f.kept:
            if r.host and r.pid is not None:
                hosts.setdefault(r.pid, set()).add(r.host)
    fix = {(h, pid): full for pid, hs in hosts.items() if len(hs) > 1 for h in hs
           for full in hs if full != h and full.endswith(h)}
    if fix:
        for f in files:
            f.kept = [dataclasses.replace(r, host=fix[(r.host, r.pid)]) if (r.host, r.pid) in fix else r
                      for r in f.kept]


def _ranks_of(p: transports.ProcessTransports, devices: list[int]) -> list[dict]:
    """Per GPU of the process: the ranks NCCL printed it as (several: one per communicator)."""
    out = []
    for dev, ranks in sorted(p.ranks.items()):
        out.append({"device": None if dev < 0 else dev, "ranks": sorted(ranks), "from": "NCCL"})
    if not out and p.tag_rank is not None:
        out.append({"device": devices[0] if len(devices) == 1 else None, "ranks": [p.tag_rank],
                    "from": "the launcher's tag"})
    return out


def _file_versions(files: list[logread.LogFile]) -> dict[tuple, tuple[str, str]]:
    """A version outside NCCL's prefixed lines (bare line, torch's error text, nccl-tests' header) holds for
    the processes of the file it was found in that printed no version line of their own."""
    out = {}
    for f in files:
        if not f.versions:
            continue
        version, where = f.versions[0]
        for r in f.kept:
            out.setdefault(r.proc, (version, where))
        for d in f.devices:
            out.setdefault((d["host"], d["pid"]), (version, where))
    return out


def _version(processes: list[dict], files: list[logread.LogFile], procs_tr: dict) -> dict:
    seen = sorted({p["version"] for p in processes if p["version"]})
    loose = [{"version": v, "where": w} for f in files for v, w in f.versions][:8]
    forms = sorted({x for p in procs_tr.values() for x in p.forms})
    return {"versions": seen, "sources": sorted({p["version_source"] for p in processes if p["version_source"]}),
            "found_outside_nccl_lines": loose, "forms": forms, "hint": None if seen else _version_hint(forms, files)}


# what each form says of the version: (first, last) NCCL that prints it, None where open
_FORM_RANGES = [
    ("'via direct shared memory'", None, (2, 8), "'via direct shared memory'"),
    ("'Ring NN : a -> b via", None, (2, 5), "'Ring NN : a -> b via' lines"),
    ("'Ring NN : 0 1 2", None, (2, 5), "'Ring NN : 0 1 ...' lines"),
    ("double binary trees", (2, 5), (2, 7), "double trees"),
    ("PCI bus ids", None, (2, 18), "bus ids in the brackets"),
]


def _version_hint(forms: list[str], files) -> str | None:
    """What the forms of a log without a version line say of its NCCL version: one range, and the forms
    that give it ("NCCL 2.5-2.7 (double trees; bus ids in the brackets)")."""
    found = [(lo, hi, why) for key, lo, hi, why in _FORM_RANGES if any(f.startswith(key) or key in f for f in forms)]
    msgs = [r.msg for f in files for r in f.kept]
    if any("via P2P/CUMEM" in m for m in msgs):
        found.append(((2, 18), None, "P2P/CUMEM"))
    if any(m.startswith("TUNER/Plugin") for m in msgs):
        found.append(((2, 19), None, "tuner plugin lines"))
    if any(" nvls channels" in m for m in msgs):
        found.append(((2, 17), None, "'nvls channels'"))
    if any("channel{Lo..Hi}" in m for m in msgs) or any(t[2] != "?" and t[6] is not None for f in files
                                                          for t in f.tuning):
        found.append(((2, 24), None, "TUNING lines with channel ranges"))
    if any(t[2] == "?" for f in files for t in f.tuning):
        found.append(((2, 19), (2, 23), "TUNING lines without the collective's name"))
    if not found:
        return None
    los = [lo for lo, _, _ in found if lo]
    his = [hi for _, hi, _ in found if hi]
    lo, hi = (max(los) if los else None), (min(his) if his else None)
    why = "; ".join(dict.fromkeys(w for _, _, w in found))
    v = lambda t: ".".join(map(str, t))  # noqa: E731
    if lo and hi and lo > hi:
        return f"forms of different NCCL versions ({why})"
    if lo and hi:
        text = f"NCCL {v(lo)}" if lo == hi else f"NCCL {v(lo)}-{v(hi)}"
    else:
        text = f"NCCL >= {v(lo)}" if lo else f"NCCL <= {v(hi)}"
    if text == "NCCL <= 2.18" and any("PCI bus ids" in f for f in forms):
        text = "NCCL < 2.18.3"
    return f"{text} ({why})"


def _nodes(processes: list[dict], summary: dict) -> list[dict]:
    """Each host with its processes, GPUs and ranks: a node is a host name of the prefix."""
    by_host: dict[str, list[dict]] = {}
    for p in processes:
        by_host.setdefault(p["host"], []).append(p)
    extra_ranks: dict[str, set] = {}
    labels: dict[str, list[str]] = {}
    for label, e in summary.get("endpoints", {}).items():
        if e.get("host"):
            extra_ranks.setdefault(e["host"], set()).update(e["ranks"])
            labels.setdefault(e["host"], []).append(label)
    out = []
    for host, ps in by_host.items():
        ranks = sorted({r for p in ps for x in p["ranks"] for r in x["ranks"]} | extra_ranks.get(host, set()))
        out.append({"host": host, "processes": [p["pid"] for p in ps], "gpus": sorted({d for p in ps for d in p["devices"]}),
                    "ranks": ranks, "gpu_names": sorted({n for p in ps for n in p["gpu_names"]}),
                    "endpoints": labels.get(host, [])})
    return out


def _network(procs_tr: dict) -> list[dict]:
    """Per host: the network NCCL chose ("Using network IB") and what it said finding it."""
    by_host: dict[str, list[str]] = {}
    for (host, _), p in procs_tr.items():
        for line in p.network:
            if line not in by_host.setdefault(host, []):
                by_host[host].append(line)
    out = []
    for host, lines in by_host.items():
        using = next((m.group(1).strip() for l in lines if (m := re.match(r"Using network (.+)$", l))), None)
        out.append({"host": host, "using": using, "lines": [_clip(l, 160) for l in lines[:8]]})
    return out


def _file_json(f: logread.LogFile) -> dict:
    return {"path": f.path, "size": f.size, "read_bytes": f.read_bytes, "lines": f.lines, "nccl_lines": len(f.kept),
            "tuning_lines": sum(f.tuning.values()), "long_lines_skipped": f.long_lines,
            "nccl_lines_dropped": f.dropped, "truncated": f.truncated}


def _tuning(files: list[logread.LogFile], limit: int = 64) -> list[dict]:
    """Per (collective, size): the choice NCCL logged most, with its share of the calls and the processes."""
    calls: dict[tuple[str, int], Counter] = {}
    who: dict[tuple[str, int], set] = {}
    for f in files:
        for (host, pid, coll, size, algo, proto, ch), n in f.tuning.items():
            calls.setdefault((coll, size), Counter())[(algo, proto, ch)] += n
            who.setdefault((coll, size), set()).add(pid_text(host, pid))
    out = []
    for (coll, size), counter in sorted(calls.items())[:limit]:
        (algo, proto, ch), n = counter.most_common(1)[0]
        out.append({"collective": coll, "bytes": size, "algo": algo, "proto": proto, "channels": ch,
                    "calls": sum(counter.values()), "share": round(n / sum(counter.values()), 3),
                    "other_choices": len(counter) - 1, "processes": sorted(who[(coll, size)])})
    return out


def _set(r: LogReport, name: str, values: tuple[str, ...]) -> list[str]:
    """The processes that applied NAME with one of ``values``."""
    return [who for v, ids in r.applied.get(name, {}).items() if v.upper() in values for who in ids]


def _causes(r: LogReport, procs_tr: dict) -> list[str]:
    """What the log itself shows went wrong or why a transport was taken; nothing the log does not show."""
    out = []
    p2p_off = _set(r, "NCCL_P2P_DISABLE", ("1",)) + _set(r, "NCCL_P2P_LEVEL", ("LOC", "0"))
    for f in r.failed:
        text = f"{f['src']}->{f['dst']} via {f['via']}: NCCL's setup failed: {f['warn']}"
        if "peer access is not supported" in f["warn"] or "217" in f["warn"]:
            text += (": these two GPUs cannot reach each other's memory (no peer access: GeForce cards, many "
                     "VMs and some PCIe topologies), yet NCCL tried P2P")
            if not p2p_off:
                text += "; with NCCL_P2P_DISABLE=1 NCCL moves their data through host memory (SHM) instead"
        out.append(text)
    for d in r.p2p_disabled:
        pairs = ", ".join(f"{a}-{b}" for a, b in d["pairs"][:12])
        out.append(f"{d['id']}: NCCL found no P2P between GPU pair(s) {pairs} ({d['lines']} line(s) 'P2P is "
                   "disabled between connected GPUs'): it sends between them through host memory or the network")
    cells = {(p["src"], p["dst"]): p for p in r.transports["pairs"]}
    eps = r.transports.get("endpoints", {})
    by_host: dict[str, Counter] = {}
    for (a, b), p in cells.items():
        host = (eps.get(a) or {}).get("host") or "?"
        for via in p["transports"]:
            k = transports.kind_of(via)
            by_host.setdefault(host, Counter())[k if k != transports.NET or _same_host(eps, a, b) else "NET-x"] += 1
    nvlink = {h for (h, _), p in procs_tr.items() if p.nvlink}
    for host, kinds in by_host.items():
        if kinds.get(transports.SHM) and host in nvlink:
            out.append(f"{host}: the topology NCCL read shows NVLink, yet GPU pairs use SHM (host memory): P2P was "
                       "turned off (NCCL_P2P_DISABLE, NCCL_P2P_LEVEL) or NCCL could not open it between them")
        if kinds.get(transports.SHM) and not kinds.get(transports.P2P):
            if p2p_off:
                out.append(f"{host}: SHM (host memory) between every GPU pair because P2P was turned off: "
                           + ", ".join(f"{n}={v} in {w}" for n in ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL")
                                       for v, ids in r.applied.get(n, {}).items() for w in ids[:3]
                                       if w in p2p_off))
            elif not r.failed:
                out.append(f"{host}: every GPU pair connected goes through host memory (SHM), none by P2P: NCCL "
                           "found no usable P2P path (GeForce cards have none; on others a VM, ACS or NCCL_P2P_LEVEL "
                           "can hide it: `commdiag p2p` checks each pair)")
        elif kinds.get(transports.SHM) and kinds.get(transports.P2P):
            out.append(f"{host}: P2P between some GPU pairs, SHM (host memory) between others: NCCL uses P2P only "
                       "where its P2P level allows (by default not across a CPU's host bridge or between sockets)")
    socket_x = [p for (a, b), p in cells.items() if not _same_host(eps, a, b)
                and any(v.startswith("NET/Socket") for v in p["transports"])]
    uses_socket = [n["host"] for n in r.network if n["using"] == "Socket"]
    if socket_x or (len(r.nodes) > 1 and uses_socket):
        no_ib = [n["host"] for n in r.network if any("NET/IB : No device found" in l for l in n["lines"])]
        ib_off = _set(r, "NCCL_IB_DISABLE", ("1",))
        why = ("NCCL_IB_DISABLE=1 in " + ", ".join(ib_off[:3]) if ib_off else
               "NET/IB found no device on " + ", ".join(no_ib[:3]) if no_ib else "")
        out.append("traffic between nodes goes over TCP sockets (NET/Socket)" + (f": {why}" if why else "")
                   + "; on an InfiniBand or RoCE cluster NCCL needs the IB devices (and libibverbs) inside "
                     "the container to use them")
    first = next((w for w in r.warnings if not w["benign"]), None)
    if first and not r.failed:
        text = first["text"]
        if "Duplicate GPU detected" in text:
            out.append("Duplicate GPU detected: two ranks of one node were given the same GPU; each rank needs a "
                       "GPU of its own (LOCAL_RANK -> torch.cuda.set_device, or CUDA_VISIBLE_DEVICES per rank)")
        else:
            out.append(f"the first error NCCL reported ({first['id']}): {_clip(text, 240)}")
    return out


def _same_host(eps: dict, a: str, b: str) -> bool:
    ha, hb = (eps.get(a) or {}).get("host"), (eps.get(b) or {}).get("host")
    return ha is not None and ha == hb


def _notes(r: LogReport, files: list[logread.LogFile], recs) -> list[str]:
    out = []
    if not recs and not r.processes:
        if any(f.versions for f in files):
            out.append("the log names an NCCL version but holds no NCCL INFO/WARN line: NCCL_DEBUG=INFO prints them "
                       "('host:pid:tid [dev] NCCL INFO ...')")
        else:
            out.append("no NCCL lines found: the log needs NCCL_DEBUG=INFO (lines 'host:pid:tid [dev] NCCL INFO ...')")
    elif not r.transports["pairs"] and r.warnings and not any(w["benign"] for w in r.warnings[:1]) \
            and not r.p2p_disabled:
        out.append("no connection lines: NCCL warned before it connected anything (WARN lines above)")
    elif not r.transports["pairs"] and not r.p2p_disabled:
        out.append("no connection lines: NCCL prints them at init (subsystem INIT, part of NCCL_DEBUG=INFO's "
                   "default), since 2.22 when the first collective connects; this log or excerpt has none")
    ranks_seen = {x for p in r.processes for g in p["ranks"] for x in g["ranks"]}
    nranks = max((c["nranks"] or 0 for p in r.processes for c in p["comms"]), default=0)
    if r.processes and r.transports["pairs"] and 0 < len(ranks_seen) < nranks:
        out.append(f"the log holds {len(ranks_seen)} of the {nranks} ranks of a communicator ({len(r.processes)} "
                   "process(es)): NCCL prints P2P and SHM connections on the sending rank only, so pairs from the "
                   "missing ranks show '.'")
    if len(r.version["versions"]) > 1:
        out.append(f"processes run different NCCL versions: {', '.join(r.version['versions'])}")
    for name, values in r.applied.items():
        if len(values) > 1:
            out.append(f"{name} differs between processes: " + "; ".join(
                f"{_clip(v, 40)} in {', '.join(ids[:6])}" for v, ids in values.items()))
    if r.unknown:
        out.append(f"{len(r.unknown)} line(s) look like connections or graphs in a form this reader does not know "
                   f"(an NCCL older or newer than it reads?), e.g. {r.unknown[0]!r}")
    if r.more_nodes:
        out.append("the connections show more nodes than the log's host names (one node's file of a multi-node "
                   "job, host names that repeat or were redacted): " + "; ".join(r.more_nodes[:2])
                   + "; GPU pairs are keyed by rank")
    if any(p["host"] == "?" for p in r.processes):
        out.append("some lines carry no host:pid:tid prefix (stripped when pasted): their process is shown as '?'")
    tagged = [p for p in r.processes for g in p["ranks"] if g["from"] == "the launcher's tag"]
    if tagged:
        out.append("ranks marked (tag) come from the launcher's tag ([1,N]<stdout>:, [N]), not from NCCL")
    for f in files:
        if f.truncated:
            out.append(f"{f.path}: read the first {f.read_bytes} bytes only (limit {logread.MAX_BYTES})")
        if f.long_lines:
            out.append(f"{f.path}: skipped {f.long_lines} line(s) longer than {logread.MAX_LINE} bytes")
        if f.dropped:
            out.append(f"{f.path}: kept the first {logread.MAX_KEPT_LINES} NCCL lines, skipped {f.dropped}")
    return out


def _ranks_text(p: dict) -> str:
    parts = []
    for g in p["ranks"]:
        who = ", ".join(map(str, g["ranks"])) + {"NCCL": "", "the launcher's tag": " (tag)"}.get(
            g["from"], " (from its GPU in the connections)")
        parts.append(f"GPU {g['device']} rank {who}" if g["device"] is not None and len(p["ranks"]) > 1 else
                     f"rank {who}")
    return "; ".join(parts)


def render(r: LogReport) -> str:
    lines = []
    n_lines = sum(f["lines"] for f in r.files)
    named = [n for n in r.nodes if n["host"] != "?"]
    lines.append(f"NCCL log: {len(r.files)} file(s), {n_lines} lines, {len(r.processes)} NCCL process(es) on "
                 f"{len(named)} node(s)" + (" (and lines without a host prefix)" if len(named) < len(r.nodes) else ""))
    v = r.version
    if not v["versions"] and v["found_outside_nccl_lines"]:
        first = v["found_outside_nccl_lines"][0]
        lines.append(f"NCCL version: {first['version']} ({first['where']})")
    elif v["versions"]:
        src = f" ({'; '.join(v['sources'])})" if v["sources"] and v["sources"] != ["NCCL's version line"] else ""
        lines.append(f"NCCL version: {', '.join(v['versions'])}{src}")
    else:
        lines.append("NCCL version: not in the log" + (f"; its forms say {v['hint']}" if v["hint"] else
                                                       " (NCCL prints it at init)"))
    if v["forms"]:
        lines.append("older forms read: " + "; ".join(v["forms"]))
    lines.append("")
    nnodes = max((c["nnodes"] or 0 for p in r.processes for c in p["comms"]), default=0)
    head = f"Nodes and GPUs ({len(named)} node(s) in the log"
    head += f", NCCL says nNodes {nnodes}):" if nnodes and nnodes != len(r.nodes) else "):"
    lines.append(head)
    for n in r.nodes[:32]:
        names = f" [{', '.join(n['gpu_names'])}]" if n["gpu_names"] else ""
        gpus = ", ".join(map(str, n["gpus"])) or "?"
        ranks = f", ranks {_ranges(n['ranks'])}" if n["ranks"] else ""
        seen = [g for g in n["endpoints"] if not g.isdigit() or int(g) not in n["gpus"]]
        also = f"; its connections show {', '.join(n['endpoints'])}" if seen else ""
        lines.append(f"  node {n['host']}: {len(n['processes'])} process(es), GPU(s) {gpus}{ranks}{names}{also}")
        procs = [p for p in r.processes if p["host"] == n["host"]]
        shown = procs if len(r.nodes) == 1 or len(procs) <= 8 else procs[:4]  # many nodes: their heads
        for p in shown[:32]:
            own = sorted({x for g in p["ranks"] for x in g["ranks"]})
            comms = "; ".join(dict.fromkeys(
                f"rank {c['rank'] if c['rank'] is not None else own[0] if len(own) == 1 else '?'}/{c['nranks']}"
                + (f" nNodes {c['nnodes']}" if c["nnodes"] else "") for c in p["comms"][:4]))
            if len(p["devices"]) > 1 or not comms:
                comms = _ranks_text(p) or comms or "no rank in the log"
            devs = ", ".join(map(str, p["devices"])) or "?"
            if p["nvml"]:
                devs += " (nvidia-smi GPU " + ", ".join(str(p["nvml"][d]) for d in p["devices"] if d in p["nvml"]) + ")"
            several = f" (one process, {len(p['devices'])} GPUs)" if len(p["devices"]) > 1 else ""
            lines.append(f"  pid {p['pid'] if p['pid'] is not None else '?'} on {p['host']} GPU {devs}{several}: "
                         f"{comms}")
        if len(procs) > len(shown[:32]):
            lines.append(f"  ... and {len(procs) - len(shown[:32])} more process(es) on {n['host']} (see --json)")
    if len(r.nodes) > 32:
        lines.append(f"  ... and {len(r.nodes) - 32} more nodes (see --json)")
    if r.network:
        lines.append("Network (what NCCL said at init):")
        groups: dict[tuple, list[str]] = {}
        for n in r.network:
            groups.setdefault(tuple(n["lines"]), []).append(n["host"])
        for text, hosts in list(groups.items())[:8]:
            who = hosts[0] if len(hosts) == 1 else f"{len(hosts)} nodes ({', '.join(hosts[:3])}...)"
            said = [t for t in text if not t.startswith(("Bootstrap", "NET/Plugin"))] or list(text)
            lines.append(f"  {who}: " + "; ".join(said))
    lines.append("")
    lines.append("Transport per GPU pair (what NCCL connected; row: sender, column: receiver):")
    lines += transports.render_matrix(r.transports)
    eps = r.transports.get("endpoints", {})
    if len(r.nodes) > 1 and eps:
        where: dict[str, list[str]] = {}
        for label, e in eps.items():
            where.setdefault(e.get("host") or "a node not in the log", []).append(label)
        lines.append("  nodes: " + "; ".join(f"{h}: {', '.join(ls)}" for h, ls in where.items()))
    if 0 < len(r.transports["pairs"]) <= 12:
        for p in r.transports["pairs"]:
            ranks = [",".join(map(str, eps.get(x, {}).get("ranks", []))) for x in (p["src"], p["dst"])]
            chans = "; ".join(f"{via} on channel(s) {transports.channel_ranges(sorted({s[0] for s in slots}))}"
                              for via, slots in p["transports"].items())
            lines.append(f"  {p['src']} -> {p['dst']} (rank {ranks[0]} -> {ranks[1]}): {chans}")
    for d in r.p2p_disabled:
        lines.append(f"  P2P disabled by NCCL ({d['id']}, GPUs as that process numbers them): "
                     + ", ".join(f"{a}-{b}" for a, b in d["pairs"]))
    graphs = transports.render_graphs(r.transports)
    if graphs:
        lines.append("")
        lines.append("Rings (printed by rank 0) and trees (per rank), per communicator:")
        lines += graphs
    if r.transports["connected"]:
        lines.append("  connected: " + "; ".join(r.transports["connected"]))
    lines.append("")
    lines.append("NCCL_* values NCCL says it applied ('set by environment', from the environment or nccl.conf):")
    if not r.applied:
        lines.append("  none in the log (NCCL prints one line for each NCCL_* variable it reads)")
    for name, values in sorted(r.applied.items()):
        for value, ids in values.items():
            who = "every process" if len(ids) == len(r.processes) else ", ".join(ids[:6])
            lines.append(f"  {name}={_clip(value, 60)}  ({who})")
    if r.tuner:
        lines.append("")
        lines.append("Tuner plugin:")
        for t in r.tuner[:16]:
            lines.append(f"  {t['id']}: {t['summary']}")
            lines += [f"    FAILED: {x}" for x in t["problems"]]
    if r.tuning:
        lines.append("")
        lines.append("NCCL's choice per collective and size (TUNING lines; most frequent choice):")
        for t in r.tuning:
            ch = "?" if t["channels"] is None else t["channels"]
            other = f", {t['other_choices']} other choice(s)" if t["other_choices"] else ""
            coll = t["collective"] if t["collective"] != "?" else "(unnamed)"
            lines.append(f"  {coll[:14]:<14} {t['bytes']:>12} B: {t['algo']}/{t['proto']}/{ch} in "
                         f"{t['share']:.0%} of {t['calls']} calls{other}")
        if any(t["collective"] == "?" for t in r.tuning):
            lines.append("  (unnamed): NCCL ~2.19-2.23 printed no collective name and numeric ids "
                         f"(Algo {'/'.join(f'{i}={a}' for i, a in enumerate(ncclog.ALGO_IDS[:3]))}, proto "
                         f"{'/'.join(f'{i}={a}' for i, a in enumerate(ncclog.PROTO_IDS))}), mapped here")
    if r.warnings:
        lines.append("")
        lines.append(f"NCCL WARN lines ({len(r.warnings)}):")
        for w in r.warnings[:12]:
            lines.append(f"  {w['id']}: {_clip(w['text'], 300)}" + ("  (benign: NCCL looks for it on every start)"
                                                                       if w["benign"] else ""))
    if r.causes:
        lines.append("")
        lines.append("What the log shows:")
        lines += [f"  - {c}" for c in r.causes]
    for n in r.notes:
        lines.append(f"note: {n}")
    return "\n".join(_wrap([terminal_safe(l) for l in lines]))


def _ranges(nums: list[int]) -> str:
    return transports.channel_ranges(sorted(nums)).replace(",", ", ")


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
