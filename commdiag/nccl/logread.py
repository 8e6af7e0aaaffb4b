"""Read a saved log that a user hands commdiag (``explain --log``), safely and in bounded memory.

The file may be anything: a server log of many gigabytes with one TUNING line per collective, a binary
file, a FIFO or a device.  Only regular files are read (opened non-blocking, checked with fstat: a FIFO
never blocks the command); lines are read in binary, cut at MAX_LINE bytes, and decoded with
replacement; reading stops after MAX_BYTES.  What is kept is NCCL's own lines (``... NCCL INFO|WARN
...``) other than its per-call TUNING lines, which are counted into per-size choices instead.

A line may carry a launcher's tag, a timestamp, a stripped prefix or several records
(``ncclog.records``).  Besides NCCL's records, three things outside them are kept: the bare
``NCCL version 2.8.2+cuda11.1`` line older NCCL printed unprefixed, a version named in other text
(torch's ``NCCL error ..., NCCL version 2.7.8``, vLLM's ``nccl==2.21.5``, nccl-tests'
``nccl-library=21805``), and nccl-tests' ``#  Rank  0 Group  0 Pid  245 on HOST device  0 [0xc1] NAME``
lines (which process drives which GPU).
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from dataclasses import dataclass, field

from ..errors import CommdiagError, brief
from . import ncclog

MAX_LINE = 64 << 10  # an NCCL line is < 1 KB (its own buffer is 1 KB); longer lines are junk, cut here
MAX_BYTES = 4 << 30  # read at most this much of one file (4 GiB: hours of a TUNING-logging server)
PENDING_LINES = 8  # a record's message carried onto a later line is looked for this many lines on
MAX_KEPT_LINES = 200_000  # NCCL lines kept per file besides TUNING (init of 8 ranks x many comms: ~10^4)
_MESSAGE_START = re.compile(r"^(?:Ring|Channel|Trees?|Connected|comm|NET/|Using|Bootstrap|P2P|NCCL_|Setting|\d+ coll)\b")
_TAGGED_LEAD = re.compile(r"^(?:\(|\[\d+,\d+\]<|#)")  # a launcher's tag or a comment, not a message's rest
MARKERS = (b"NCCL INFO", b"NCCL WARN", b"NCCL TRACE", b"NCCL ABORT", b"NCCL version", b"nccl-library=", b"nccl==",
           b" Pid ")
_ANY_MARKER = re.compile(b"|".join(re.escape(m) for m in MARKERS))
_MENTION = re.compile(r"NCCL version (?P<v>\d+\.\d+\.\d+[^\s,;)'\"]*)|\bnccl==(?P<pip>\d+\.\d+\.\d+)|"
                      r"nccl-library=(?P<code>\d{4,6})\b")
# nccl-tests: "#  Rank  0 Group  0 Pid    245 on nccl-tests device  0 [0xc1] NVIDIA RTX A6000" ("Group" from 2.12)
_TESTS_DEVICE = re.compile(r"#\s*Rank\s+(?P<rank>\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)\s+"
                           r"device\s+(?P<dev>\d+)\s+\[(?P<bus>[^\]]+)\]\s*(?P<name>.*?)\s*$")


@dataclass
class LogFile:
    """One file as read: its NCCL lines, the TUNING choices counted, and what was cut or skipped."""

    path: str
    size: int
    read_bytes: int = 0
    lines: int = 0
    kept: list[ncclog.Record] = field(default_factory=list)  # NCCL's records, TUNING lines aside
    versions: list[tuple[str, str]] = field(default_factory=list)  # (version, where: "bare line", "torch error" ...)
    devices: list[dict] = field(default_factory=list)  # nccl-tests' "Rank N Pid P on HOST device D [bus] NAME"
    tuning: dict[tuple, int] = field(default_factory=dict)  # (host, pid, coll, bytes, algo, proto, ch) -> calls
    long_lines: int = 0  # lines cut at MAX_LINE
    dropped: int = 0  # NCCL lines over MAX_KEPT_LINES
    truncated: bool = False  # stopped at MAX_BYTES
    pending: list[tuple[int, int]] = field(default_factory=list)  # (kept index, line) of records whose
    # message a terminal or interleaved writes carried onto a later line


def _open_regular(path: str) -> tuple[int, os.stat_result]:
    from .. import readfile

    try:
        st = os.stat(path)  # (only to say what a non-file is; what is opened is judged again below)
    except OSError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, socket or device)"
        raise CommdiagError(f"{brief(path)}: {what}; --log takes saved NCCL log files")
    try:  # the one reader's open: nothing but a regular file is ever opened (no device's open runs)
        fd, st = readfile.open_regular(path)
    except readfile.Refused:
        raise CommdiagError(f"{brief(path)}: not a regular file (a FIFO, socket or device); --log takes saved "
                            "NCCL log files") from None
    except FileNotFoundError:
        raise CommdiagError(f"{brief(path)}: no such file (--log takes saved NCCL log files)") from None
    except IsADirectoryError:
        raise CommdiagError(f"{brief(path)}: is a folder; --log takes files (e.g. --log {brief(path)}/*.log)") from None
    except PermissionError:
        raise CommdiagError(f"{brief(path)}: permission denied") from None
    except OSError as e:
        raise CommdiagError(f"{brief(path)}: cannot open: {e.strerror}") from None
    return fd, st


def read(path: str, *, max_bytes: int = MAX_BYTES, max_line: int = MAX_LINE) -> LogFile:
    """Read ``path`` once, keeping NCCL's lines; raises CommdiagError (exit 2) for what cannot be read."""
    fd, st = _open_regular(str(path))
    out = LogFile(str(path), st.st_size)
    with os.fdopen(fd, "rb", buffering=1 << 20) as f:
        while out.read_bytes < max_bytes:
            raw = f.readline(max_line + 1)
            if not raw:
                break
            out.read_bytes += len(raw)
            if len(raw) > max_line and not raw.endswith(b"\n"):
                out.long_lines += 1
                while raw and not raw.endswith(b"\n") and out.read_bytes < max_bytes:  # skip the rest
                    raw = f.readline(max_line + 1)
                    out.read_bytes += len(raw)
                continue
            out.lines += 1
            if not out.pending and not _ANY_MARKER.search(raw):
                continue
            _keep(out, raw.decode("utf-8", "replace").rstrip("\r\n"), out.lines)
        else:
            out.truncated = bool(f.read(1))
    return out


def version_code(code: int) -> str:
    """NCCL_VERSION_CODE as a version: 21805 -> 2.18.5 (2.9+: X*10000 + Y*100 + Z); 2708 -> 2.7.8 (older)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _count(out: LogFile, proc: tuple, t: re.Match) -> None:
    ch = int(t["hi"]) - int(t["lo"]) + 1 if t["lo"] is not None else None
    key = (proc[0], proc[1], t["coll"] or "?", int(t["bytes"]), ncclog._name(t["algo"], ncclog.ALGO_IDS, ncclog._ALGO_NAMES),
           ncclog._name(t["proto"], ncclog.PROTO_IDS, ncclog._PROTO_NAMES), ch)
    out.tuning[key] = out.tuning.get(key, 0) + 1


def _unfinished(r: ncclog.Record) -> bool:
    """A record whose message the terminal (or interleaved writes) carried onto the next line: nothing
    after the prefix, or a connection line cut after "via"."""
    return not r.msg or r.msg.endswith(" via") or r.msg.endswith(" :")


def _keep(out: LogFile, line: str, lineno: int) -> None:
    if " Bytes -> Algo " in line and not out.pending and (f := ncclog._FAST.match(line)) \
            and (t := ncclog._TUNING.match(f["msg"])):  # most of a big log: count it, keep nothing
        _count(out, (f["host"], int(f["pid"])), t)
        return
    lead, recs = ncclog.split(line)
    rest = lead.strip()
    out.pending = [(i, n) for i, n in out.pending if n >= lineno - PENDING_LINES]
    if rest and out.pending and not _TAGGED_LEAD.match(rest):
        i, _ = out.pending[0]  # the oldest record still waiting for its message
        last = out.kept[i]
        if not (last.msg or _MESSAGE_START.match(rest)):  # an empty record takes only what reads as NCCL's
            return _keep_rest(out, line, lineno, recs)
        out.pending.pop(0)
        out.kept[i] = dataclasses.replace(last, msg=(last.msg + " " + rest).strip())
        if not recs:
            return
    _keep_rest(out, line, lineno, recs)


def _keep_rest(out: LogFile, line: str, lineno: int, recs: list[ncclog.Record]) -> None:
    if not recs:
        if (v := ncclog.bare_version(line)):
            out.versions.append((v, f"line {lineno}: a bare 'NCCL version' line (older NCCL printed it unprefixed)"))
        elif (d := _TESTS_DEVICE.search(line)):
            out.devices.append({"rank": int(d["rank"]), "pid": int(d["pid"]), "host": d["host"],
                                "dev": int(d["dev"]), "bus": d["bus"], "name": d["name"][:80]})
        elif (m := _MENTION.search(line)):
            if m["v"]:
                out.versions.append((m["v"], f"line {lineno}: named in other text: {line.strip()[:120]}"))
            elif m["pip"]:
                out.versions.append((m["pip"], f"line {lineno}: named by the application: {line.strip()[:120]}"))
            else:
                out.versions.append((version_code(int(m["code"])), f"line {lineno}: nccl-tests' nccl-library="
                                     f"{m['code']}"))
        return
    for r in recs:
        if r.level == "INFO" and " Bytes -> Algo " in r.msg:
            t = ncclog._TUNING.match(r.msg)
            if t:
                _count(out, r.proc, t)
                continue
        if len(out.kept) >= MAX_KEPT_LINES:
            out.dropped += 1
            continue
        out.kept.append(r)
        if _unfinished(r):
            out.pending.append((len(out.kept) - 1, lineno))
