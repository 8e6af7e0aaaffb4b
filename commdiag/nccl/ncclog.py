"""Parse NCCL's own debug output: what NCCL says it applied.

With ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ENV`` NCCL prints, once per process at
init, ``NCCL_PROTO set by environment to LL`` for every variable it read (from
the process environment or from nccl.conf, which NCCL loads with setenv without
overwriting).  Integer parameters end with a period (``... to 16.``), strings do
not.  Lines look like ``host:pid:tid [cudaDev] NCCL INFO <message>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# INFO: "host:pid:tid [dev] NCCL INFO msg"; WARN (NCCL 2.28.9, seen on 2x H200): "[YYYY-MM-DD hh:mm:ss]
# host:pid:tid [dev] file.c:line NCCL WARN msg" -- a timestamp first and the source location before NCCL.
_PREFIX = re.compile(r"^(?:\[[^\]]*\] )?(?P<host>[^:\s\[]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
                     r"(?:\S+:\d+ )?NCCL (?P<level>\w+) (?P<msg>.*)$")
_SET = re.compile(r"^(?P<name>NCCL_\w+) set by environment to (?P<value>.*)$")
_VERSION = re.compile(r"^NCCL version (?P<version>\S+)")


# ----------------------------------------------------------------------------- records, whatever the launcher
# NCCL writes "host:pid:tid [dev] [file.cc:line ]NCCL LEVEL msg".  What users paste has more around it: a
# launcher's tag first (Ray "(RayWorkerWrapper pid=581, ip=10.0.0.1) ", "(pid=N) ", OpenMPI --tag-output
# "[1,2]<stdout>:", Slurm "0: ", torchrun "[default0]:", "[N] "), a container's timestamp, a prefix
# stripped or redacted ("[0] NCCL INFO ..." or "xxx:xxx:xxx [0] ..."), several records joined on one line
# by a terminal, Ray's " [repeated 3x across cluster]" suffix.  A record is found at each "NCCL LEVEL"
# marker and the prefix read backwards from it; everything before the first prefix is the launcher's.
_FAST = re.compile(r"(?P<host>[^\s:\[\]()|]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?:[\w./-]+\.\w+:\d+ )?"
                   r"NCCL (?P<level>INFO|WARN|TRACE|ABORT) ?(?P<msg>.*)")
HEAD_MAX = 400  # characters before a marker in which its prefix is looked for
_MARK = re.compile(r"NCCL (?P<level>INFO|WARN|TRACE|ABORT) ?")
_HEAD = re.compile(r"(?:(?P<host>[^\s:\[\]()|]+):(?P<pid>[^\s:\[\]]+):(?P<tid>[^\s:\[\]]+) )?"
                   r"(?:\[(?P<dev>\d+)\] )?(?:(?P<loc>[\w./-]+\.\w+:\d+) )?$")
# Ray/vLLM: "(RayWorkerWrapper pid=581, ip=10.0.0.1)", "(pid=N)", "(VllmWorker rank=1 pid=9)", "(VllmWorker TP0 pid=9)"
_RAY = re.compile(r"\((?P<pre>[^()]*?)\bpid=(?P<pid>\d+)(?:, ip=(?P<ip>[\d.:a-fA-F]+))?\)")
_RAY_RANK = re.compile(r"\brank=(?P<a>\d+)|\bTP(?P<b>\d+)\b")
_SGLANG = re.compile(r"^\[[^\]]*\bTP(?P<rank>\d+)\]")  # SGLang: "[2024-10-10 10:00:00 TP1] "
_MPI = re.compile(r"\[\d+,(?P<rank>\d+)\]<std(?:out|err)>:")
_TAGGED_RANK = re.compile(r"^(?:\[(?P<a>\d+)\]|(?P<b>\d+):|\[default(?P<c>\d+)\]:|\[rank(?P<d>\d+)\]:)\s*")
_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_BARE_VERSION = re.compile(r"^\s*NCCL version (?P<version>\d+\.\d+\.\d+\S*)\s*$")


@dataclass(frozen=True)
class Record:
    """One NCCL record as its process wrote it, with what the launcher put before it.

    ``host``/``pid``/``tid``/``dev`` are None where the poster stripped or redacted them (a redacted host
    is kept as written); ``tag_rank``/``tag_pid``/``tag_ip`` come from the launcher's tag."""

    host: str | None
    pid: int | None
    tid: int | None
    dev: int | None
    level: str
    msg: str
    tag_rank: int | None = None
    tag_pid: int | None = None
    tag_ip: str | None = None

    @property
    def proc(self) -> tuple[str, int | None]:
        """The process key: (host, pid); a host the line does not show is the launcher's ip, else "?"."""
        return (self.host or self.tag_ip or "?", self.pid if self.pid is not None else self.tag_pid)


def _tag(text: str) -> tuple[int | None, int | None, str | None]:
    rank = pid = ip = None
    if (m := _RAY.search(text)):
        pid, ip = int(m["pid"]), m["ip"]
        if (r := _RAY_RANK.search(m["pre"])):
            rank = int(r["a"] or r["b"])
    elif (m := _SGLANG.match(text)):
        rank = int(m["rank"])
    if (m := _MPI.search(text)):
        rank = int(m["rank"])
    elif (m := _TAGGED_RANK.match(text)) and rank is None:
        rank = int(next(g for g in m.groups() if g is not None))
    return rank, pid, ip


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def records(line: str) -> list[Record]:
    """Every NCCL record in one line of a log (none for a line without a ``NCCL INFO|WARN`` marker)."""
    return split(line)[1]


def split(line: str) -> tuple[str, list[Record]]:
    """(the text before the first record's prefix, every NCCL record in the line).  The text before is the
    launcher's tag, or the end of a record that the terminal broke onto this line."""
    f = _FAST.match(line)
    if f and "NCCL " not in f["msg"]:  # the common case: one record, NCCL's own prefix first on the line
        return "", [Record(f["host"], int(f["pid"]), int(f["tid"]), int(f["dev"]), f["level"],
                           _REPEATED.sub("", f["msg"]).rstrip())]
    marks = list(_MARK.finditer(line))
    if not marks:
        return line, []
    out: list[Record] = []
    tag = None
    start = 0
    heads = []
    for m in marks:
        at = max(start, m.start() - HEAD_MAX)  # a prefix is < 300 characters: never scan a 64 KB junk line
        h = _HEAD.search(line, at, m.start())
        heads.append((h.start(), h))
        start = m.end()
    for i, m in enumerate(marks):
        head_at, h = heads[i]
        if i == 0:
            lead = line[:head_at]
            tag = _tag(lead)
        end = heads[i + 1][0] if i + 1 < len(marks) else len(line)
        msg = _REPEATED.sub("", line[m.end():end]).rstrip()
        if out and not h.group(0):  # "... NCCL INFO a NCCL INFO b": the second is the first one's process
            prev = out[-1]
            out.append(Record(prev.host, prev.pid, prev.tid, prev.dev, m["level"], msg, *tag))
            continue
        out.append(Record(h["host"], _int(h["pid"]), _int(h["tid"]), _int(h["dev"]), m["level"], msg, *tag))
    return lead, out


def bare_version(line: str) -> str | None:
    """``NCCL version 2.8.2+cuda11.1`` on a line of its own (older NCCL printed it to stdout unprefixed)."""
    m = _BARE_VERSION.match(line[_tag_end(line):])
    return m["version"] if m else None


def _tag_end(line: str) -> int:
    for rx in (_RAY, _MPI):
        if (m := rx.match(line)):
            return m.end() + (1 if line[m.end():m.end() + 1] == " " else 0)
    m = _TAGGED_RANK.match(line)
    return m.end() if m else 0


@dataclass
class ProcessLog:
    """What one NCCL process said: its variables as NCCL applied them, and its version."""

    host: str
    pid: int
    device: int
    applied: dict[str, str] = field(default_factory=dict)
    version: str | None = None
    warnings: list[str] = field(default_factory=list)


def _value(raw: str) -> str:
    raw = raw.rstrip()
    # "%lld." for integer parameters: drop the sentence's period, keep string values intact.
    if raw.endswith(".") and re.fullmatch(r"-?\d+\.", raw):
        return raw[:-1]
    return raw


def parse(text: str) -> dict[int, ProcessLog]:
    """Map pid -> ProcessLog for every NCCL process seen in ``text`` (other lines are ignored).  For one
    host's log (a run's own workers); a log of several hosts needs ``parse_records`` (pids repeat)."""
    return {pid: p for (_, pid), p in parse_records(r for line in text.splitlines() for r in records(line)).items()}


def parse_records(recs) -> dict[tuple[str, int | None], ProcessLog]:
    """(host, pid) -> ProcessLog: in containers two hosts often share a pid, so nothing is keyed by pid alone."""
    procs: dict[tuple[str, int | None], ProcessLog] = {}
    for r in recs:
        key = r.proc
        proc = procs.get(key)
        if proc is None:
            proc = procs[key] = ProcessLog(key[0], key[1], r.dev if r.dev is not None else -1)
        msg = r.msg
        if (s := _SET.match(msg)):
            proc.applied[s["name"]] = _value(s["value"])
        elif (v := _VERSION.match(msg)):
            proc.version = v["version"]
        elif r.level == "WARN":
            proc.warnings.append(msg)
    return procs


# TUNING lines (NCCL_DEBUG_SUBSYS=TUNING), one per collective call:
#   NCCL >= 2.24:  "AllReduce: 917504 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..23}"
#   older:         "AllReduce: 917504 Bytes -> Algo 1 proto 0 time 12.345000" (numeric ids)
#   ~2.19-2.23:    "8 Bytes -> Algo 0 proto 0 time 25.200924" (numeric ids, no collective named)
_TUNING = re.compile(r"^(?:(?P<coll>\w+): )?(?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)"
                     r"(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\})?")
# nccl.h / src/include/device.h order of NCCL_ALGO_* and NCCL_PROTO_* ids
ALGO_IDS = ["Tree", "Ring", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT"]
PROTO_IDS = ["LL", "LL128", "Simple"]
_ALGO_NAMES = {a.upper(): a for a in ALGO_IDS}
_PROTO_NAMES = {p.upper(): p for p in PROTO_IDS}


@dataclass(frozen=True)
class TuningChoice:
    """What NCCL chose for one collective call."""

    collective: str
    bytes: int
    algo: str
    proto: str
    channels: int | None  # None when the log format does not say


def _name(token: str, ids: list[str], names: dict[str, str]) -> str:
    if token.isdigit():
        i = int(token)
        return ids[i] if i < len(ids) else f"id{i}"
    return names.get(token.upper(), token)


def parse_tuning(text: str) -> dict[int, list[TuningChoice]]:
    """pid -> every TUNING choice that process logged, in order."""
    out: dict[int, list[TuningChoice]] = {}
    for r in (r for line in text.splitlines() for r in records(line)):
        t = _TUNING.match(r.msg)
        if not t:
            continue
        channels = int(t["hi"]) - int(t["lo"]) + 1 if t["lo"] is not None else None
        out.setdefault(r.proc[1], []).append(TuningChoice(
            t["coll"] or "?", int(t["bytes"]), _name(t["algo"], ALGO_IDS, _ALGO_NAMES),
            _name(t["proto"], PROTO_IDS, _PROTO_NAMES), channels))
    return out
