"""Atomic file writes: write a sibling temp file, fsync, rename over the target.

A sweep killed at any moment leaves either the old or the new file, never half of one.
A new file gets the mode open() would give it (umask), a replaced one keeps its own.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path


def _mode_for(path: Path) -> int:
    """The target's own mode, else what open() would create under the umask (mkstemp makes 0600)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    mode = _mode_for(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path: str | Path, data) -> None:
    write_text(path, json.dumps(data, indent=1, sort_keys=False, default=str) + "\n")
