"""Read a saved log that a user hands commdiag (``explain --log``), safely and in bounded memory.

The file may be anything: a server log of many gigabytes with one TUNING line per collective, a binary
file, a FIFO or a device.  Only regular files are read (opened non-blocking, checked with fstat: a FIFO
never blocks the command); lines are read in binary, cut at MAX_LINE bytes, and decoded with
replacement; reading stops after MAX_BYTES.  What is kept is NCCL's own lines (``... NCCL INFO|WARN
...``) other than its per-call TUNING lines, which are counted into per-size choices instead.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

from ..errors import CommdiagError, brief
from . import ncclog

MAX_LINE = 64 << 10  # an NCCL line is < 1 KB (its own buffer is 1 KB); longer lines are junk, cut here
MAX_BYTES = 4 << 30  # read at most this much of one file (4 GiB: hours of a TUNING-logging server)
MAX_KEPT_LINES = 200_000  # NCCL lines kept per file besides TUNING (init of 8 ranks x many comms: ~10^4)
MARKERS = (b" NCCL INFO ", b" NCCL WARN ")


@dataclass
class LogFile:
    """One file as read: its NCCL lines, the TUNING choices counted, and what was cut or skipped."""

    path: str
    size: int
    read_bytes: int = 0
    lines: int = 0
    kept: list[str] = field(default_factory=list)
    tuning: dict[tuple, int] = field(default_factory=dict)  # (host, pid, coll, bytes, algo, proto, ch) -> calls
    long_lines: int = 0  # lines cut at MAX_LINE
    dropped: int = 0  # NCCL lines over MAX_KEPT_LINES
    truncated: bool = False  # stopped at MAX_BYTES


def _open_regular(path: str) -> tuple[int, os.stat_result]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise CommdiagError(f"{brief(path)}: no such file (--log takes saved NCCL log files)") from None
    except IsADirectoryError:
        raise CommdiagError(f"{brief(path)}: is a folder; --log takes files (e.g. --log {brief(path)}/*.log)") from None
    except PermissionError:
        raise CommdiagError(f"{brief(path)}: permission denied") from None
    except OSError as e:
        raise CommdiagError(f"{brief(path)}: cannot open: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        what = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, socket or device)"
        raise CommdiagError(f"{brief(path)}: {what}; --log takes saved NCCL log files")
    os.set_blocking(fd, True)
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
            if not any(m in raw for m in MARKERS):
                continue
            _keep(out, raw.decode("utf-8", "replace").rstrip("\r\n"))
        else:
            out.truncated = bool(f.read(1))
    return out


def _keep(out: LogFile, line: str) -> None:
    m = ncclog._PREFIX.match(line.strip())
    if m is None:
        return
    if m["level"] == "INFO" and " Bytes -> Algo " in m["msg"]:
        t = ncclog._TUNING.match(m["msg"])
        if t:
            ch = int(t["hi"]) - int(t["lo"]) + 1 if t["lo"] is not None else None
            key = (m["host"], int(m["pid"]), t["coll"], int(t["bytes"]),
                   ncclog._name(t["algo"], ncclog.ALGO_IDS, ncclog._ALGO_NAMES),
                   ncclog._name(t["proto"], ncclog.PROTO_IDS, ncclog._PROTO_NAMES), ch)
            out.tuning[key] = out.tuning.get(key, 0) + 1
            return
    if len(out.kept) >= MAX_KEPT_LINES:
        out.dropped += 1
        return
    out.kept.append(line)
