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

from . import ncclvars
from .atomic import write_text
from .errors import CommdiagError

PROFILE_HEADER = "# commdiag-profile"
PROFILE_VERSION = 1
_PLAIN = re.compile(r"^[A-Za-z0-9_.,:^/+=-]*$")


@dataclass(frozen=True)
class Profile:
    settings: dict[str, str]
    meta: dict[str, str] = field(default_factory=dict)  # source, created, ... (free text)

    def render(self) -> str:
        lines = [f"{PROFILE_HEADER} {PROFILE_VERSION}"]
        lines += [f"# {k}: {v}" for k, v in self.meta.items()]
        for name, value in self.settings.items():
            lines.append(f"{name}={value if _PLAIN.match(value) else shlex.quote(value)}")
        return "\n".join(lines) + "\n"


def save(path: str | Path, profile: Profile) -> None:
    write_text(path, profile.render())


def parse(text: str, origin: str = "<profile>") -> Profile:
    lines = text.splitlines()
    if not lines or not lines[0].startswith(PROFILE_HEADER):
        raise CommdiagError(f"{origin}: line 1: expected '{PROFILE_HEADER} {PROFILE_VERSION}' (is this a commdiag profile?)")
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
            raise CommdiagError(f"{origin}: line {n}: expected NAME=VALUE, got {stripped!r}")
        try:
            parts = shlex.split(raw) if raw else [""]
        except ValueError as e:
            raise CommdiagError(f"{origin}: line {n}: {name}: bad quoting ({e})") from None
        value = " ".join(parts)
        error, _ = ncclvars.check_setting(name, value)
        if error:
            raise CommdiagError(f"{origin}: line {n}: {name}: {error}")
        if name in settings:  # a shell keeps the last, NCCL's conf reader the first: refuse to guess
            raise CommdiagError(f"{origin}: line {n}: {name}: set twice (first on line {first_line[name]}); "
                                f"keep one line per variable")
        settings[name] = value
        first_line[name] = n
    return Profile(settings, meta)


def load(path: str | Path) -> Profile:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise CommdiagError(f"{path}: cannot read profile: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise CommdiagError(f"{path}: not a commdiag profile: byte {e.start} is not UTF-8 text") from None
    return parse(text, str(path))
