"""systemd drop-ins and environment files for a service's NCCL settings (pure text, no I/O).

``install-hook --systemd UNIT`` writes ``/etc/systemd/system/UNIT.d/commdiag-nccl.conf``:
either one ``Environment=`` line per variable, or (``--systemd-env-file``) an
``EnvironmentFile=`` line naming ``/etc/commdiag/UNIT.env``.

Quoting follows systemd.exec(5) and systemd.syntax(7):

* ``Environment="NAME=VALUE"``: the assignment is one double-quoted word, in which
  backslash escapes are C-style, so ``\\`` and ``"`` are escaped; ``%`` starts a
  specifier (``%h``, ``%n``...) and must be written ``%%``.  No ``$`` expansion
  happens in Environment=.
* ``EnvironmentFile=`` lines: ``NAME="VALUE"`` with ``\\``, ``"``, ``$`` and backquote
  escaped, the subset systemd and a POSIX shell read the same way; no specifiers.

Newlines and other control characters are refused before any text is made.
"""

from __future__ import annotations

import re

from . import hooktext
from ..errors import CommdiagError

DROPIN_NAME = "commdiag-nccl.conf"
SYSTEM_DIR = "/etc/systemd/system"
ENV_DIR = "/etc/commdiag"
# systemd unit names: [A-Za-z0-9:_.\-@] plus a type suffix (systemd.unit(5)); at most 255 chars.
_UNIT = re.compile(r"^[A-Za-z0-9:_.\\@-]+$")
_SUFFIXES = (".service", ".socket", ".target", ".mount", ".timer", ".path", ".slice", ".scope")


def unit_name(unit: str) -> str:
    """Validate a unit name; a bare name gets ``.service``."""
    if not unit or len(unit) > 255 or not _UNIT.match(unit) or unit.startswith(".") or ".." in unit:
        raise CommdiagError(f"--systemd: {unit!r} is not a systemd unit name "
                            "(letters, digits and :_.-@\\, e.g. sglang.service)")
    return unit if unit.endswith(_SUFFIXES) else unit + ".service"


def dropin_path(unit: str) -> str:
    return f"{SYSTEM_DIR}/{unit_name(unit)}.d/{DROPIN_NAME}"


def env_file_path(unit: str) -> str:
    return f"{ENV_DIR}/{unit_name(unit)}.env"


def quote_environment(name: str, value: str) -> str:
    """One ``Environment=`` word: ``"NAME=VALUE"`` quoted by systemd's rules."""
    hooktext.check_values({name: value})
    body = f"{name}={value}".replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{body}"'


def quote_env_file(name: str, value: str) -> str:
    """One ``EnvironmentFile=`` line, read alike by systemd and ``sh``."""
    hooktext.check_values({name: value})
    escaped = re.sub(r'([\\"$`])', r"\\\1", value)
    return f'{name}="{escaped}"'


def _header(meta: dict[str, str]) -> list[str]:
    return ["# Managed by commdiag: remove with `commdiag install-hook --uninstall --systemd UNIT`.",
            *hooktext.marker_comment(meta)]


def dropin_text(settings: dict[str, str], *, meta: dict[str, str], env_file: str | None = None) -> str:
    """The drop-in: ``[Service]`` with Environment= lines, or one EnvironmentFile= line."""
    lines = _header(meta) + ["[Service]"]
    if env_file is not None:
        if _CONTROL_OR_SPACE.search(env_file):
            raise CommdiagError(f"{env_file!r}: an EnvironmentFile= path must not contain spaces or control characters")
        lines.append(f"EnvironmentFile={env_file.replace('%', '%%')}")
    else:
        lines += [f"Environment={quote_environment(n, v)}" for n, v in settings.items()]
    return "\n".join(lines) + "\n"


_CONTROL_OR_SPACE = re.compile(r"[\x00-\x20\x7f]")


def env_file_text(settings: dict[str, str], *, meta: dict[str, str]) -> str:
    lines = ["# Managed by commdiag (EnvironmentFile= of a systemd unit; also `set -a; . FILE` in sh).",
             *hooktext.marker_comment(meta)]
    lines += [quote_env_file(n, v) for n, v in settings.items()]
    return "\n".join(lines) + "\n"


def commands(unit: str) -> list[str]:
    """What the user runs after a drop-in changed (commdiag never restarts a service itself)."""
    u = unit_name(unit)
    return ["systemctl daemon-reload", f"systemctl restart {u}",
            f"systemctl show {u} -p Environment   # check what the unit will pass"]
