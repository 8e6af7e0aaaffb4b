"""Profiles: a small file of NCCL settings (NAME=VALUE) plus where they came from.

A sweep writes its winner as ``RUN_DIR/profile.env``; ``install-hook --profile``,
``install-hook --from RUN_DIR`` and ``check-env --profile`` read it.  The format is
a shell-compatible env file, so ``set -a; . profile.env`` and systemd's
``EnvironmentFile=`` also understand it::

    # commdiag-profile 1
    # source: reports/20261129T120000Z-pcie8 (band decode: config seed)
    # created: 2026-11-29T12:00:00Z
    NCCL_PROTO=LL
    NCCL_ALGO=Ring

Lines starting with ``#`` are comments; ``# key: value`` comments after the
header are metadata.  Values are written unquoted when they are plain
(letters, digits and ``_.,:^/+-``); otherwise single-quoted, shell-style.

Format history: 1  first version.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ..nccl import ncclvars
from .. import readfile
from ..atomic import write_text
from ..errors import CommdiagError, brief

PROFILE_HEADER = "# commdiag-profile"
PROFILE_VERSION = 1
PROFILE_LIMIT = 1 << 20  # a profile is a few lines; 1 MiB is far above any real one
_PLAIN = re.compile(r"^[A-Za-z0-9_.,:^/+=-]*$")
_META_KEY = re.compile(r"[A-Za-z_][\w-]*")
# Within a line, anything sh would not read as plain text of that line: a lone CR (sh keeps it
# in the value, Python's splitlines makes it two lines), other C0/C1 controls, U+2028/9.
_LINE_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


@dataclass(frozen=True)
class Profile:
    settings: dict[str, str]
    meta: dict[str, str] = field(default_factory=dict)  # source, created, ... (free text)

    def render(self) -> str:
        """The file's text.  Every line is exactly one line for sh, systemd and ``parse``:
        meta keys are identifiers and meta values go through ``hooktext.comment_safe``
        (control characters and non-ASCII escaped, so a band name or run-folder path with a
        newline cannot end its comment), settings are validated names and values without
        control characters (``hooktext.check_values``), quoted shell-style."""
        from ..install.hooktext import check_values, comment_safe

        check_values(self.settings)
        lines = [f"{PROFILE_HEADER} {PROFILE_VERSION}"]
        for k, v in self.meta.items():
            if not _META_KEY.fullmatch(str(k)):
                raise CommdiagError(f"profile metadata key {brief(k)} is not an identifier")
            lines.append(f"# {k}: {comment_safe(v)}")
        for name, value in self.settings.items():
            lines.append(f"{name}={value if _PLAIN.match(value) else shlex.quote(value)}")
        return "\n".join(lines) + "\n"


def save(path: str | Path, profile: Profile) -> None:
    write_text(path, profile.render())


def parse(text: str, origin: str = "<profile>") -> Profile:
    """Read a profile the way sh reads it (lines end at LF only); a line sh and Python would
    read differently (a lone CR, other control characters) is refused, never guessed at.
    A leading UTF-8 byte-order mark (some editors add one) is ignored."""
    text = text.removeprefix("\ufeff")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for n, line in enumerate(lines, start=1):
        bad = _LINE_CONTROL.search(line)
        if bad:
            what = "a carriage return (CR)" if bad.group() == "\r" else f"control character {ascii(bad.group())}"
            raise CommdiagError(f"{origin}: line {n}: contains {what}; sh and commdiag would read this line "
                                "differently, so it is refused (save the file with plain LF line ends)")
    if not lines or not lines[0].startswith(PROFILE_HEADER):
        raise CommdiagError(f"{origin}: line 1: expected '{PROFILE_HEADER} {PROFILE_VERSION}' (is this a commdiag profile? "
                             "The format: docs/formats.md#profiles)")
    try:
        version = int(lines[0][len(PROFILE_HEADER):].strip())
    except ValueError:
        raise CommdiagError(f"{origin}: line 1: version is not an integer") from None
    if version > PROFILE_VERSION:
        raise CommdiagError(f"{origin}: line 1: profile version {version} is newer than this commdiag ({PROFILE_VERSION}); upgrade commdiag")
    settings: dict[str, str] = {}
    first_line: dict[str, int] = {}
    meta: dict[str, str] = {}
    for n, line in enumerate(lines[1:], start=2):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            key, sep, value = stripped[1:].strip().partition(":")
            if sep and re.fullmatch(r"[A-Za-z_][\w-]*", key):
                meta[key] = value.strip()
            continue
        name, sep, raw = stripped.partition("=")
        if not sep:
            raise CommdiagError(f"{origin}: line {n}: expected NAME=VALUE, got {brief(stripped)}")
        try:
            parts = shlex.split(raw) if raw else [""]
        except ValueError as e:
            raise CommdiagError(f"{origin}: line {n}: {name}: bad quoting ({e})") from None
        if len(parts) != 1:  # sh would run the second word as a command with NAME set for it
            raise CommdiagError(f"{origin}: line {n}: {name}: the value is {len(parts)} words; quote it "
                                "(sh would run the rest of the line as a command)")
        if _expands(raw):
            raise CommdiagError(f"{origin}: line {n}: {name}: '$' or '`' outside single quotes; sh would "
                                "expand it (run a command, read a variable) when the file is sourced")
        value = parts[0]
        error, _ = ncclvars.check_setting(name, value)
        if error:
            raise CommdiagError(f"{origin}: line {n}: {name}: {error}")
        if name in settings:  # a shell keeps the last, NCCL's conf reader the first: refuse to guess
            raise CommdiagError(f"{origin}: line {n}: {name}: set twice (first on line {first_line[name]}); "
                                f"keep one line per variable")
        settings[name] = value
        first_line[name] = n
    return Profile(settings, meta)


def _expands(raw: str) -> bool:
    """True when sh would expand something in ``raw``: ``$`` or a backquote that is neither in
    single quotes nor backslash-escaped (double quotes do not stop expansion)."""
    state, i = None, 0
    while i < len(raw):
        c = raw[i]
        if state == "'":
            state = None if c == "'" else state
        elif c == "\\":
            i += 1  # the next character is literal
        elif c in "$`":
            return True
        elif c == "'" and state is None:
            state = "'"
        elif c == '"':
            state = None if state == '"' else '"'
        i += 1
    return False


def load(path: str | Path) -> Profile:
    try:
        text = readfile.read_text(path, PROFILE_LIMIT, what="profile")
    except OSError as e:
        raise CommdiagError(f"{path}: cannot read profile: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise CommdiagError(f"{path}: not a commdiag profile: byte {e.start} is not UTF-8 text") from None
    return parse(text, str(path))
