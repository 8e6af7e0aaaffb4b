"""Atomic file writes: write a sibling temp file, fsync, rename over the target.

A sweep killed at any moment leaves either the old or the new file, never half of one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
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
