"""The one output-path writer: every file commdiag writes (run.json, CSVs, report.html,
profiles, --out/--html targets) goes through ``write_text``/``write_json``.

What it writes, and how it refuses:

* **Through the folder's descriptor, never a link**: the folder is opened from ``/`` one component
  at a time without following a link (``safedir``; links in the path as given are resolved once
  before, and as root only where no other user can change them); the temporary file, the rename
  and any removal are relative to that descriptor.  Output folders are made the same way
  (``make_dirs``), and removed without following links inside (``remove_tree``).
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

import contextlib
import json
import os
import posixpath
import shutil
import stat
from pathlib import Path

from . import safedir
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


def _trusted_links(folder: str) -> str:
    """``folder`` with its links resolved once (``safedir.real_path``), the path every later step walks
    without following a link.  As root, a link on the way is followed only where no other user could
    have put it there or can change it (``ownership``: the link, its folder and every folder above):
    a user who owns a run folder could otherwise swap it for a link between commdiag's reads and its
    write, and have root write wherever the link points."""
    folder = posixpath.normpath(os.path.abspath(folder))
    if os.geteuid() == 0:
        from . import ownership

        w = ownership.Walker()
        resolved = w.path(folder)
        if w.links and w.findings:
            f = w.findings[0]
            raise CommdiagError(f"{folder}: as root, commdiag writes through a symbolic link ({w.links[0]}) "
                                f"only where no other user can change it, and {f.path} is {f.why}; give a "
                                "folder root owns, by its real path")
        if w.findings:
            # Another user can change this path, and it had no link when walked: walk it as named from
            # here on, never resolving a link (one she plants after the walk would be followed by a
            # resolution now; unresolved, it stops safedir's O_NOFOLLOW walk instead).
            return folder
        # Nobody else can change what the walk followed: its own resolution, not a second one (a link
        # she plants at a name that was missing during the walk, in /tmp, would be followed unseen).
        return resolved
    try:
        return safedir.real_path(folder)
    except OSError as e:
        raise CommdiagError(f"{folder}: cannot write here: {e.strerror or e}") from None


def real_path(path: str | Path) -> str:
    """``path`` absolute, its links resolved (``safedir.real_path``; what does not exist kept as named)."""
    return safedir.real_path(posixpath.normpath(os.path.abspath(str(path))))


@contextlib.contextmanager
def folder_fd(folder: str | Path):
    """A descriptor of the existing folder ``folder``, reached from ``/`` without following a link
    (links in the path as given are resolved first, once: ``_trusted_links``).  Everything written
    relative to it lands in that very folder, whatever is renamed or linked on the way meanwhile."""
    real = _trusted_links(str(folder))
    try:
        fd = safedir.open_dir(real, "/")
    except safedir.NotReal as e:
        raise CommdiagError(f"{folder}: cannot write: {e.path} is {e.what} (it changed while commdiag "
                            "worked?)") from None
    except OSError as e:
        raise CommdiagError(f"{folder}: cannot write: {e.strerror or e}") from None
    try:
        yield fd
    finally:
        os.close(fd)


def write_bytes(path: str | Path, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` atomically, through its folder's descriptor (``folder_fd``): an
    ``O_EXCL|O_NOFOLLOW`` temporary file there, fsync, renamed over the name.  ``mode``: the new
    file's mode (default: the old file's, else what open() would give under the umask)."""
    check_target(path)  # the early, readable refusal; checked again inside the folder below
    path = Path(path)
    with folder_fd(path.parent) as dfd:
        st = _check_in(dfd, path)
        try:
            safedir.write_in(dfd, path.name, bytes(data), _mode_for(st) if mode is None else mode)
        except OSError as e:
            raise CommdiagError(f"{path}: cannot write: {e.strerror or e}") from None


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def _check_in(dfd: int, path: Path) -> os.stat_result | None:
    """The target's lstat inside the opened folder (None: absent); a link or a non-regular file is refused."""
    try:
        st = safedir.lstat_in(dfd, path.name)
    except OSError as e:
        raise CommdiagError(f"{path}: cannot write here: {e.strerror}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else next(
            (w for t, w in _KINDS if t(st.st_mode)), "not a regular file")
        raise CommdiagError(f"{path}: is {what}; commdiag writes only regular files and never through a link")
    return st


def make_dirs(path: str | Path, mode: int = 0o755) -> list[str]:
    """Create folder ``path`` and its missing parents without following a link on the way (links that
    exist are resolved once, as ``folder_fd`` does; as root only those no other user can change).
    Returns the folders created, top-down."""
    path = posixpath.normpath(os.path.abspath(str(path)))
    real = _trusted_links(path)
    try:
        return safedir.make_dirs(real, "/", mode)
    except safedir.NotReal as e:
        raise CommdiagError(f"{path}: cannot create: {e.path} is {e.what}") from None
    except OSError as e:
        raise CommdiagError(f"{path}: cannot create: {e.strerror or e}") from None


def remove_tree(folder: str | Path) -> None:
    """Remove ``folder`` and everything in it, relative to its parent's descriptor: a link there (or
    anywhere inside) is removed as a link, never followed.  Absent: nothing to do."""
    folder = Path(os.path.abspath(str(folder)))
    if not os.path.lexists(folder):
        return  # (its parent may not exist yet either); what is there is removed below, by descriptor
    with folder_fd(folder.parent) as dfd:
        st = safedir.lstat_in(dfd, folder.name)
        if st is None:
            return
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(folder.name, dir_fd=dfd)
            return
        shutil.rmtree(folder.name, dir_fd=dfd)


def discard(tmp: str | None) -> None:
    """Remove a temporary file left by a write that did not complete (None: nothing to remove)."""
    if tmp is not None:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def write_json(path: str | Path, data) -> None:
    write_text(path, json.dumps(data, indent=1, sort_keys=False, default=str) + "\n")
