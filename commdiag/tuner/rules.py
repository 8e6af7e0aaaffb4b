"""The tuner rules file: commdiag's per-size algorithm/protocol choices, read by the plugin.

Owns the format (docs/tuner.md "Rules file") in Python: ``parse_text``/``load`` read it
exactly as ``commdiag_tuner.c`` does -- same grammar, same limits, same first error, same
words -- and ``render``/``write`` produce it.  tests/test_tuner.py holds the two parsers to
agreement on generated and fuzzed files.  ``write`` is the only thing here that touches disk
(through ``atomic.write_text``).

A file::

    # commdiag-tuner-rules 1
    # any comment
    coll=allreduce min_bytes=1048576 max_bytes=4194304 nranks=2 nnodes=1 algo=ring proto=ll

The first rule (file order) that matches a collective applies; a collective no rule matches
is left to NCCL, channels included.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass, field
from pathlib import Path

from .. import readfile
from ..errors import CommdiagError

# Format history (the version is the number after the header; the plugin refuses any other):
#   1  (commdiag 0.1) coll, min_bytes, max_bytes (inclusive), nranks, nnodes, algo, proto;
#      optional channels (0 = NCCL decides) and mode (any | graph | eager = NCCL's regBuff hint).
FORMAT_VERSION = 1
HEADER = "# commdiag-tuner-rules "

# Limits: the same numbers as commdiag_tuner.c (CT_MAX_*), which says why they are these.
MAX_FILE_BYTES = 1 << 20
MAX_LINE = 512
MAX_RULES = 1024
MAX_BYTES = (1 << 63) - 1
MAX_COUNT = (1 << 31) - 1
MAX_CHANNELS = 64  # MAXCHANNELS from NCCL 2.28 (32 in 2.24); NCCL clamps to what the communicator has

# Names in NCCL's index order (ncclFunc_t 0..4, NCCL_ALGO_* 0..6, NCCL_PROTO_* 0..2).
COLLS = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
ALGOS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOS = ("ll", "ll128", "simple")
MODES = ("any", "graph", "eager")

KEYS = ("coll", "min_bytes", "max_bytes", "nranks", "nnodes", "algo", "proto", "channels", "mode")
REQUIRED = KEYS[:7]
_ALLOWED = {
    "coll": " ".join(COLLS), "min_bytes": "an integer 0..2^63-1", "max_bytes": "an integer 0..2^63-1",
    "nranks": "an integer 1..2^31-1", "nnodes": "an integer 1..2^31-1", "algo": " ".join(ALGOS),
    "proto": " ".join(PROTOS), "channels": "an integer 0..64 (0: NCCL decides)", "mode": " ".join(MODES),
}
_NAMES = {"coll": COLLS, "algo": ALGOS, "proto": PROTOS, "mode": MODES}
_INT_RANGE = {"min_bytes": (0, MAX_BYTES), "max_bytes": (0, MAX_BYTES), "nranks": (1, MAX_COUNT),
              "nnodes": (1, MAX_COUNT), "channels": (0, MAX_CHANNELS)}
_DIGITS = re.compile(rb"[0-9]{1,19}")
_BLANKS = re.compile(rb"[ \t]+")


@dataclass(frozen=True)
class Rule:
    """One line of the file: for ``coll`` of ``min_bytes``..``max_bytes`` bytes (inclusive) on a
    communicator of ``nranks`` ranks over ``nnodes`` nodes, choose ``algo``/``proto``."""

    coll: str
    min_bytes: int
    max_bytes: int
    nranks: int
    nnodes: int
    algo: str
    proto: str
    channels: int = 0
    mode: str = "any"
    line: int = field(default=0, compare=False)

    def to_line(self) -> str:
        return " ".join(f"{k}={getattr(self, k)}" for k in KEYS)

    def canonical(self) -> str:
        """The form ``commdiag_tuner_check`` prints: what the tests compare."""
        return f"line={self.line} {self.to_line()}"


class RulesError(CommdiagError):
    """A rules file the plugin would refuse: ``FILE: line N: why`` (N is 0 for the whole file)."""

    def __init__(self, path: str, line: int, why: str):
        self.path, self.line, self.why = str(path), line, why
        super().__init__(f"{path}: {self.detail}")

    @property
    def detail(self) -> str:
        """The words commdiag_tuner.c uses after ``NCCL_TUNER_CONFIG_FILE=PATH:``."""
        return f"line {self.line}: {self.why}" if self.line else self.why


def _text(b: bytes, n: int = 40) -> str:
    return b[:n].decode("ascii")  # every byte was checked to be printable ASCII or tab


def _parse_rule(text: bytes) -> Rule | str:
    """A rule line (leading blanks stripped) -> Rule, or the reason it is refused."""
    values: dict[str, object] = {}
    for tok in _BLANKS.split(text):
        if not tok:
            continue
        if b"=" not in tok:
            return f"'{_text(tok)}' is not key=value"
        key_b, val = tok.split(b"=", 1)
        key = key_b.decode("ascii")
        if key not in KEYS:
            return f"unknown key '{_text(key_b)}' (allowed: {' '.join(KEYS)})"
        if key in values:
            return f"key '{key}' given twice"
        if key in _NAMES:
            ok = val.decode("ascii") in _NAMES[key]
            value: object = val.decode("ascii")
        else:
            lo, hi = _INT_RANGE[key]
            ok = bool(_DIGITS.fullmatch(val)) and lo <= int(val) <= hi
            value = int(val) if ok else None
        if not ok:
            return f"{key}='{_text(val)}' (allowed: {_ALLOWED[key]})"
        values[key] = value
    for key in REQUIRED:
        if key not in values:
            return f"missing key '{key}'"
    if values["max_bytes"] < values["min_bytes"]:
        return f"max_bytes {values['max_bytes']} < min_bytes {values['min_bytes']}"
    if values["nnodes"] > values["nranks"]:
        return f"nnodes {values['nnodes']} > nranks {values['nranks']}"
    return Rule(**values)  # type: ignore[arg-type]


def parse_bytes(data: bytes, path: str = "<rules>") -> list[Rule]:
    """The rules in ``data``, in file order; ``RulesError`` at the first problem, as the plugin."""
    if len(data) > MAX_FILE_BYTES:
        raise RulesError(path, 0, f"larger than {MAX_FILE_BYTES} bytes")
    lines = data.split(b"\n")
    if len(lines) > 1 and lines[-1] == b"":
        lines.pop()  # the final newline ends the last line; it does not start another
    rules: list[Rule] = []
    for n, line in enumerate(lines, 1):
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > MAX_LINE:
            raise RulesError(path, n, f"line longer than {MAX_LINE} bytes")
        for col, c in enumerate(line, 1):
            if not (c == 0x09 or 0x20 <= c < 0x7F):
                raise RulesError(path, n, f"byte 0x{c:02x} at column {col} (allowed: printable ASCII and tab)")
        if n == 1:
            head = HEADER.encode()
            if line.startswith(head):
                if line[len(head):] == str(FORMAT_VERSION).encode():
                    continue
                raise RulesError(path, 1, f"format version '{_text(line[len(head):], 20)}' not supported (this "
                                          f"commdiag reads {FORMAT_VERSION}: upgrade commdiag and rebuild the plugin)")
            raise RulesError(path, 1, f"first line must be '{HEADER}{FORMAT_VERSION}'")
        body = line.lstrip(b" \t")
        if not body or body.startswith(b"#"):
            continue
        rule = _parse_rule(body)
        if isinstance(rule, str):
            raise RulesError(path, n, rule)
        if len(rules) == MAX_RULES:
            raise RulesError(path, n, f"more than {MAX_RULES} rules")
        rules.append(Rule(**{k: getattr(rule, k) for k in KEYS}, line=n))
    return rules


def read_error(e: OSError) -> str:
    """What readfile's refusal or an OSError means for a rules file, worded as the plugin words it."""
    if isinstance(e, readfile.Refused):
        return f"larger than {MAX_FILE_BYTES} bytes" if e.errno == errno.EFBIG else str(e)
    return f"cannot open: {e.strerror or e}"


def load(path: str | Path) -> list[Rule]:
    """The rules in the file at ``path`` (a regular file, at most 1 MiB)."""
    try:
        data = readfile.read_bytes(path, MAX_FILE_BYTES + 1, what="rules file")
    except OSError as e:
        raise RulesError(path, 0, read_error(e)) from None
    return parse_bytes(data, str(path))


def render(rules: list[Rule], comments: tuple[str, ...] = ()) -> str:
    """The file text for ``rules`` (in this order: the first match wins) with ``comments`` under the
    header.  Checked by parsing it back, so what is written is what the plugin will read."""
    for c in comments:
        if not all(ch == "\t" or " " <= ch < "\x7f" for ch in c):
            raise CommdiagError(f"rules comment {c!r}: only printable ASCII and tab (one line each)")
    out = [f"{HEADER}{FORMAT_VERSION}"]
    out += [f"# {c}" for c in comments]
    out += [r.to_line() for r in rules]
    text = "\n".join(out) + "\n"
    try:
        back = parse_bytes(text.encode("ascii"), "<rendered rules>")
    except UnicodeEncodeError:
        back = None
    if back != list(rules):
        raise CommdiagError(f"rules do not render to what they say (a value outside the format?): "
                            f"{[r.to_line() for r in rules][:3]}")
    return text


def write(path: str | Path, rules: list[Rule], comments: tuple[str, ...] = ()) -> Path:
    """Write ``rules`` to ``path`` atomically; returns the path."""
    from ..atomic import write_text

    write_text(path, render(rules, comments))
    return Path(path)
