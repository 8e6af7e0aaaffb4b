"""The one output-path writer: every file commdiag writes (run.json, CSVs, report.html,
profiles, --out/--html targets) goes through ``write_text``/``write_json``.

What it writes, and how it refuses:

* **Regular files, atomically**: a sibling temporary file, fsync, rename over the target.  A
  sweep killed at any moment leaves either the old or the new file, never half of one.  A new
  file gets the mode open() would give it (umask), a replaced one keeps its own.
* **Anything that is not a regular file is refused**, before a byte is written: a device node
  (``--out /dev/null`` as root would otherwise replace /dev/null with a regular file), a FIFO,
  a socket, a directory.  The error names the path and what it is.
* **Symbolic links are refused**, not followed and not replaced: as root, following a link
  planted in a shared directory writes wherever it points, and replacing it silently breaks
  whoever made it.  The error names the link's target; give that path instead.
* An empty path, a missing parent directory or a parent that is not a directory is one clear
  error; so is any OSError while writing (read-only file system, no space, name too long),
  which also removes the temporary file.

Every refusal is a ``CommdiagError`` (exit 2 in the CLI) naming the path and the reason.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

from .errors import CommdiagError

_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def _mode_for(st: os.stat_result | None) -> int:
    """The target's own mode, else what open() would create under the umask (mkstemp makes 0600)."""
    if st is not None:
        return stat.S_IMODE(st.st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def check_target(path: str | Path) -> os.stat_result | None:
    """Refuse a target that is not a regular file (or absent) in an existing directory;
    returns its lstat (None when absent).  Usable before long work, to fail early."""
    if str(path) == "":
        raise CommdiagError("output path is empty: give a file name")
    path = Path(path)
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        st = None
    except OSError as e:
        raise CommdiagError(f"{path}: cannot write here: {e.strerror}") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(path)
            except OSError:
                target = "?"
            raise CommdiagError(f"{path}: is a symbolic link (to {target}); commdiag neither follows nor replaces "
                                "links when writing: give the file's real path")
        for test, what in _KINDS:
            if test(st.st_mode):
                raise CommdiagError(f"{path}: is {what}; commdiag writes only regular files (give a file path)")
        if not stat.S_ISREG(st.st_mode):
            raise CommdiagError(f"{path}: is not a regular file; commdiag writes only regular files")
        return st
    parent = path.parent
    if not parent.is_dir():
        why = "is not a directory" if parent.exists() else "does not exist"
        raise CommdiagError(f"{path}: cannot write: the directory {parent} {why}")
    return None


def write_text(path: str | Path, text: str) -> None:
    st = check_target(path)
    path = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:100]}.", suffix=".tmp")
        os.fchmod(fd, _mode_for(st))
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        check_target(path)  # became something else while we wrote: leave it alone
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise CommdiagError(f"{path}: cannot write: {e.strerror or e}") from None
    finally:
        discard(tmp)


def discard(tmp: str | None) -> None:
    """Remove a temporary file left by a write that did not complete (None: nothing to remove)."""
    if tmp is not None:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def write_json(path: str | Path, data) -> None:
    write_text(path, json.dumps(data, indent=1, sort_keys=False, default=str) + "\n")
