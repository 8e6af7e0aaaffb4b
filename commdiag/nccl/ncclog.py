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
    """Map pid -> ProcessLog for every NCCL process seen in ``text`` (other lines are ignored)."""
    procs: dict[int, ProcessLog] = {}
    for line in text.splitlines():
        m = _PREFIX.match(line.strip())
        if not m:
            continue
        pid = int(m["pid"])
        proc = procs.setdefault(pid, ProcessLog(m["host"], pid, int(m["dev"])))
        msg = m["msg"]
        if (s := _SET.match(msg)) :
            proc.applied[s["name"]] = _value(s["value"])
        elif (v := _VERSION.match(msg)):
            proc.version = v["version"]
        elif m["level"] == "WARN":
            proc.warnings.append(msg)
    return procs


# TUNING lines (NCCL_DEBUG_SUBSYS=TUNING), one per collective call:
#   NCCL >= 2.24:  "AllReduce: 917504 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..23}"
#   older:         "AllReduce: 917504 Bytes -> Algo 1 proto 0 time 12.345000" (numeric ids)
_TUNING = re.compile(r"^(?P<coll>\w+): (?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)"
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
    for line in text.splitlines():
        m = _PREFIX.match(line.strip())
        if not m:
            continue
        t = _TUNING.match(m["msg"])
        if not t:
            continue
        channels = int(t["hi"]) - int(t["lo"]) + 1 if t["lo"] is not None else None
        out.setdefault(int(m["pid"]), []).append(TuningChoice(
            t["coll"], int(t["bytes"]), _name(t["algo"], ALGO_IDS, _ALGO_NAMES),
            _name(t["proto"], PROTO_IDS, _PROTO_NAMES), channels))
    return out
