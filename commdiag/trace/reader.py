"""Reading one Kineto trace (torch.profiler's Chrome trace JSON, plain or gzipped) into a compact ``Trace``.

A server's trace can be hundreds of MB, most of it CPU operators and flow arrows commdiag never looks
at.  ``json.load`` would build every one of them as Python objects (several GB for 500 MB of JSON), so
the file is walked instead: the top-level object key by key, and its ``traceEvents`` array one event at
a time (``json.JSONDecoder.raw_decode`` on a sliding window of the text, read in 4 MiB chunks).  Each
event is looked at once and only what the analysis needs is kept, as tuples: GPU activity (kernels,
memory copies and sets), GPU and CPU annotations (steps), the CUDA runtime calls that launched GPU
work (their start time, by correlation id), and ``record_param_comms`` (collective sizes).  Memory
stays at the size of what is kept, plus one window of text.

What is refused, each as one ``CommdiagError`` naming the file (exit 2): a file that is not JSON or
has no ``traceEvents``; a truncated file or truncated gzip; a trace of another profiler or schema
(Kineto writes ``schemaVersion`` 1; the legacy ``torch.autograd.profiler`` writes none); a trace
with no GPU events at all (a CPU-only profile).
"""

from __future__ import annotations

import gzip
import io
import json
import json.scanner
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CommdiagError, brief, one_line

# Kineto's trace schema (libkineto ChromeTraceLogger writes "schemaVersion": 1 since torch 1.8.1).
SCHEMA_VERSIONS = (1,)
CHUNK = 4 << 20  # text read at a time: large enough that raw_decode's per-call cost dominates, small in memory
MAX_EVENT = 64 << 20  # one event larger than this is not a profiler's: refuse instead of buffering the file
MAX_HEADER_VALUE = 16 << 20  # distributedInfo, deviceProperties ...: a few KB in practice

GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset",
            # older Kineto and HTA's test traces spell them so
            "Kernel": "kernel", "Memcpy": "memcpy", "Memset": "memset"}
RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "Runtime", "Driver")
COMMS_OP = "record_param_comms"


@dataclass
class Trace:
    """What commdiag keeps of one rank's trace.  Times are microseconds on the trace's own clock.

    gpu: (ts, dur, stream, kind, name index, correlation, external id) per GPU activity
    gpu_annotations: (name, ts, dur, stream) (``gpu_user_annotation``: a CPU annotation's GPU span)
    cpu_annotations: (name, ts, dur, pid, tid) (``user_annotation``: ProfilerStep#N, record_function)
    launches: correlation -> (ts, dur, runtime call name index) of the CUDA runtime/driver call
    graph_launches: (ts, dur, correlation) of each ``cudaGraphLaunch``
    comms: (ts, dur, tid, external id, collective, dtype, in nelems, out nelems, group size, ranks)
    """

    path: str
    meta: dict = field(default_factory=dict)
    names: list = field(default_factory=list)
    gpu: list = field(default_factory=list)
    gpu_annotations: list = field(default_factory=list)
    cpu_annotations: list = field(default_factory=list)
    launches: dict = field(default_factory=dict)
    graph_launches: list = field(default_factory=list)
    comms: list = field(default_factory=list)
    events: int = 0

    @property
    def rank(self) -> int | None:
        info = self.meta.get("distributedInfo")
        r = info.get("rank") if isinstance(info, dict) else None
        return r if isinstance(r, int) and not isinstance(r, bool) else None

    @property
    def world_size(self) -> int | None:
        info = self.meta.get("distributedInfo")
        w = info.get("world_size") if isinstance(info, dict) else None
        return w if isinstance(w, int) and not isinstance(w, bool) else None


class _Text:
    """A sliding window over the file's text: ``buf[pos:]`` is what is not consumed yet."""

    def __init__(self, stream, path: str):
        self.stream, self.path = stream, path
        self.buf, self.pos, self.eof = "", 0, False
        self.dropped = 0  # characters consumed and dropped from the window (for error positions)

    def more(self) -> bool:
        """Read one more chunk (dropping what is consumed); False at the end of the file."""
        if self.eof:
            return False
        try:
            chunk = self.stream.read(CHUNK)
        except EOFError:  # gzip: "Compressed file ended before the end-of-stream marker was reached"
            raise CommdiagError(f"{self.path}: truncated gzip: the compressed data ends before the trace does "
                                "(copy the file again, or wait until the profiler has finished writing it)") from None
        except (gzip.BadGzipFile, zlib.error) as e:
            raise CommdiagError(f"{self.path}: damaged gzip ({e}): not a readable trace") from None
        except UnicodeDecodeError as e:
            raise CommdiagError(f"{self.path}: not UTF-8 text at byte {e.start} of a chunk: not a JSON trace") from None
        if not chunk:
            self.eof = True
            return False
        self.dropped += self.pos
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0
        return True

    def skip_ws(self) -> str:
        """The next non-blank character (consumed is only the blank), '' at the end."""
        while True:
            buf, n = self.buf, len(self.buf)
            p = self.pos
            while p < n and buf[p] in " \t\r\n":
                p += 1
            self.pos = p
            if p < n:
                return buf[p]
            if not self.more():
                return ""

    def expect(self, chars: str, what: str) -> str:
        c = self.skip_ws()
        if not c or c not in chars:
            raise self.bad(f"expected {what}")
        self.pos += 1
        return c

    def value(self, decoder: json.JSONDecoder, limit: int):
        """The next JSON value, reading more text until it is whole (at most ``limit`` characters)."""
        self.skip_ws()
        while True:
            try:
                v, end = decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if len(self.buf) - self.pos > limit:
                    raise self.bad(f"a value longer than {limit >> 20} MiB") from None
                if self.more():
                    continue
                cut = e.msg.startswith("Unterminated") or e.pos >= len(self.buf.rstrip()) - 1
                raise self.bad("the file ends inside a value (truncated)" if cut else e.msg, e.pos) from None
            except RecursionError:
                raise self.bad("nested too deeply") from None
            if end == len(self.buf) and not self.eof and isinstance(v, (int, float)):
                if self.more():  # a number cut at the window's edge: decode it again whole
                    continue
            self.pos = end
            return v

    def bad(self, why: str, at: int | None = None) -> CommdiagError:
        where = self.dropped + (self.pos if at is None else at)
        return CommdiagError(f"{self.path}: not a Chrome trace JSON file: {why} (at character {where})")


def _open_text(path: str):
    """A text stream of the file (gzip by its magic bytes, not its name); a regular file only."""
    from .. import readfile

    try:  # the one reader's open: nothing but a regular file is ever opened (no device's open runs)
        fd, _st = readfile.open_regular(path)
    except FileNotFoundError:
        raise CommdiagError(f"{path}: no such file") from None
    except readfile.Refused:
        raise CommdiagError(f"{path}: not a regular file (a FIFO, device, socket or folder): not read") from None
    except OSError as e:
        raise CommdiagError(f"{path}: cannot open: {e.strerror}") from None
    raw = os.fdopen(fd, "rb")
    head = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
    binary = gzip.GzipFile(fileobj=raw, mode="rb") if head == b"\x1f\x8b" else raw
    return io.TextIOWrapper(binary, encoding="utf-8", errors="strict"), binary, raw


def read(path: str | Path) -> Trace:
    """One trace file -> ``Trace``; CommdiagError for anything that is not a readable Kineto GPU trace."""
    path = str(path)
    text_stream, binary, raw = _open_text(path)
    try:
        trace = _walk(_Text(text_stream, path), path)
    finally:
        text_stream.close()
        raw.close()
    _check(trace)
    return trace


def _walk(t: _Text, path: str) -> Trace:
    decoder = json.JSONDecoder()
    trace = Trace(path)
    first = t.skip_ws()
    if first == "[":  # the Chrome trace "array format": events only, no header
        t.pos += 1
        trace.meta["_array_format"] = True
        _events(t, decoder, trace)
        return trace
    if first != "{":
        if not first:
            raise CommdiagError(f"{path}: empty file: not a trace")
        raise CommdiagError(f"{path}: not a Chrome trace JSON file: it starts with {brief(t.buf[t.pos:t.pos + 20])}, "
                            "not '{' (give the .json or .json.gz that torch.profiler wrote)")
    t.pos += 1
    seen_events = False
    if t.skip_ws() == "}":
        t.pos += 1
    else:
        while True:
            key = t.value(decoder, 1 << 20)
            if not isinstance(key, str):
                raise t.bad("an object key that is not a string")
            t.expect(":", "':' after a key")
            if key == "traceEvents":
                if t.expect("[", "'[' to start traceEvents") == "[":
                    _events(t, decoder, trace)
                    seen_events = True
            else:
                trace.meta[key] = t.value(decoder, MAX_HEADER_VALUE)
            if t.expect(",}", "',' or '}' in the top-level object") == "}":
                break
    if t.skip_ws():
        raise t.bad("text after the top-level object")
    if not seen_events:
        raise CommdiagError(f"{path}: no traceEvents: a JSON file, but not a profiler trace "
                            f"(top-level keys: {brief(sorted(trace.meta)[:8])})")
    return trace


_WS = re.compile(r"[ \t\n\r]*").match
_SEP = re.compile(r"[ \t\n\r]*([,\]])").match


def _events(t: _Text, decoder: json.JSONDecoder, trace: Trace) -> None:
    """The traceEvents array, one event at a time (the '[' is consumed).

    The hot loop of a 500 MB read: the C scanner decodes one event (``scan_once``, what raw_decode
    wraps), one regex finds the separator after it.  An event cut by the window's end fails to decode
    or has no separator yet: the window is refilled from the event's start and the event decoded again
    (once per 4 MiB chunk)."""
    if t.skip_ws() == "]":
        t.pos += 1
        return
    keep = _Keeper(trace)
    scan = json.scanner.make_scanner(decoder)
    while True:
        buf = t.buf
        pos = _WS(buf, t.pos).end()
        try:
            ev, end = scan(buf, pos)
            m = _SEP(buf, end)
        except StopIteration:
            ev, m = None, None
        except json.JSONDecodeError:
            ev, m = None, None
        except RecursionError:
            raise t.bad("nested too deeply") from None
        if m is None:
            t.pos = pos
            if len(buf) - pos > MAX_EVENT:
                raise t.bad(f"a value longer than {MAX_EVENT >> 20} MiB")
            if t.more():
                continue
            # the end of the file: say why with the full decoder's message
            t.value(decoder, MAX_EVENT)
            t.expect(",]", "',' or ']' between trace events")
            raise t.bad("the file ends inside traceEvents (truncated)")
        if isinstance(ev, dict):
            keep(ev)
        trace.events += 1
        t.pos = m.end()
        if m.group(1) == "]":
            return


def _inert(v) -> str:
    """A string from the trace as one inert line (``errors.one_line``): names, annotations, a collective's
    name and dtype are printed, and a line break or escape sequence in them (a trace is a file anyone
    can write) would otherwise print a line of its own on root's terminal that looks like commdiag's."""
    return one_line(v if isinstance(v, str) else str(v))


def _inert_or(v):
    """``_inert`` for a string, anything else as it is (the analysis checks the types)."""
    return one_line(v) if isinstance(v, str) else v


class _Keeper:
    """Looks at each event once and keeps what the analysis reads (see ``Trace``)."""

    def __init__(self, trace: Trace):
        self.t = trace
        self.name_ids: dict[str, int] = {}

    def name(self, n) -> int:
        n = _inert(n)
        i = self.name_ids.get(n)
        if i is None:
            i = self.name_ids[n] = len(self.t.names)
            self.t.names.append(n)
        return i

    def __call__(self, ev: dict) -> None:
        if ev.get("ph") != "X":
            return
        cat = ev.get("cat")
        try:
            ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            return
        args = ev.get("args")
        if not isinstance(args, dict):
            args = {}
        kind = GPU_CATS.get(cat)
        if kind is not None:
            stream = args.get("stream", ev.get("tid"))
            self.t.gpu.append((ts, dur, stream if isinstance(stream, int) else -1, kind, self.name(ev.get("name", "")),
                               args.get("correlation"), args.get("External id")))
        elif cat in RUNTIME_CATS:
            corr = args.get("correlation")
            name = ev.get("name", "")
            if corr is not None:
                self.t.launches[corr] = (ts, dur, self.name(name))
            if name == "cudaGraphLaunch" or name == "cuGraphLaunch":
                self.t.graph_launches.append((ts, dur, corr))
        elif cat == "gpu_user_annotation":
            self.t.gpu_annotations.append((_inert(ev.get("name", "")), ts, dur, ev.get("tid")))
        elif cat == "user_annotation" or (cat == "cpu_op" and str(ev.get("name", "")).startswith("ProfilerStep#")):
            # older Kineto writes torch.profiler's ProfilerStep#N as a cpu_op
            self.t.cpu_annotations.append((_inert(ev.get("name", "")), ts, dur, ev.get("pid"), ev.get("tid")))
        elif cat == "cpu_op" and ev.get("name") == COMMS_OP:
            self.t.comms.append((ts, dur, ev.get("tid"), args.get("External id"), _inert_or(args.get("Collective name")),
                                 _inert_or(args.get("dtype")), args.get("In msg nelems"), args.get("Out msg nelems"),
                                 args.get("Group size"), args.get("Process Group Ranks")))


def _check(trace: Trace) -> None:
    path = trace.path
    version = trace.meta.get("schemaVersion")
    if version is None:
        raise CommdiagError(f"{path}: no schemaVersion: not a Kineto (torch.profiler) trace; the legacy "
                            "torch.autograd.profiler and other tools' Chrome traces are not read "
                            "(record with torch.profiler.profile(activities=[CPU, CUDA]), docs/trace.md)")
    if version not in SCHEMA_VERSIONS:
        raise CommdiagError(f"{path}: schemaVersion: {brief(version)} is a trace format this commdiag does not read "
                            f"(it reads Kineto schemaVersion {', '.join(map(str, SCHEMA_VERSIONS))}); "
                            "upgrade commdiag, or record with a torch.profiler that writes it")
    if not trace.gpu:
        raise CommdiagError(f"{path}: no GPU events (kernels, memory copies): a CPU-only profile "
                            f"({trace.events} events); record with activities=[ProfilerActivity.CPU, "
                            "ProfilerActivity.CUDA] on the GPU machine (docs/trace.md)")
