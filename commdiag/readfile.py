"""The one reader of files commdiag did not just write: profiles, specs, rules, run folders, recordings,
saved results.  A regular file only, at most ``limit`` bytes, opened without blocking; and, as root,
only where no other user can change it.

* **No blocking open, no endless read.**  As root, ``commdiag report DIR`` on a folder another user
  made would otherwise block forever on a FIFO planted as run.json, or read a link to a character
  device (``/dev/zero``) until memory ran out on a production box.  The open is ``O_NONBLOCK`` (a FIFO
  opens without a writer), then anything but a regular file is refused before a byte is read.
* **As root, nothing another user can change** (``ownership``: the file and every folder above it,
  links followed hop by hop, POSIX ACLs included).  A profile, spec, rules file, run folder or
  recording such a user can change is refused: its owner would choose what root installs, runs or
  prints, and could swap the file between commdiag's checks and its use.  ``allow_others(True)``
  (the CLI's ``--allow-user-files``) accepts them; the install allowlist and every value check
  still apply to what is read.

Links to regular files are followed (a run folder may be linked into place); as root the link and
the folders around it must be root's as well.  Every refusal is ``Refused``, an OSError, so each
reader's own handler names the file in its message.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

LIMIT = 256 << 20  # far above any run.json commdiag writes (a few MB for thousands of launches)
OPTION = "--allow-user-files"
_allow_others = False


class Refused(OSError):
    """Not a regular file, larger than the limit, or (as root) changeable by another user: an
    OSError, so every reader's handler takes it."""

    def __str__(self) -> str:
        return str(self.strerror)


def allow_others(on: bool) -> None:
    """As root, read files another user can change (``--allow-user-files``; off by default)."""
    global _allow_others
    _allow_others = bool(on)


def others_allowed() -> bool:
    return _allow_others


def check_others(path: str | Path, what: str = "file") -> None:
    """As root, refuse ``path`` when a user other than root could change it or a folder above it
    (Refused naming the component, its owner and the option).  A no-op for other users: what they
    read is theirs to trust."""
    if os.geteuid() != 0 or _allow_others:
        return
    from . import ownership

    f = ownership.first_finding(str(path))
    if f is not None:
        raise Refused(errno.EPERM, f"as root, commdiag reads a {what} only where no other user can change it, "
                                   f"and {f.path} is {f.why}: copy it to a folder root owns, or run commdiag "
                                   f"{OPTION} COMMAND ... (its owner then chooses what root reads, and can change "
                                   "it while commdiag works)")


def _check_opened(fd: int, st: os.stat_result, path: str | Path, what: str) -> None:
    """As root, the file actually opened must be one only root can change, and the name, walked after
    the open, must still name it: between the open and the walk its owner could rename her file away
    (a missing name is no finding) and back, or put another file at the name."""
    if os.geteuid() != 0 or _allow_others:
        return
    from . import ownership

    f = ownership.inspect(str(path), st, fd)
    if f is not None:
        raise Refused(errno.EPERM, f"as root, commdiag reads a {what} only where no other user can change it, "
                                   f"and {path} is {f.why}: copy it to a folder root owns, or run commdiag "
                                   f"{OPTION} COMMAND ...")
    try:
        now = os.stat(path)
    except OSError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        raise Refused(errno.EPERM, f"{path} changed while commdiag read it (another file is at that name now): "
                                   "not read")


_O_PATH = getattr(os, "O_PATH", 0)


def open_regular(path: str | Path) -> tuple[int, os.stat_result]:
    """A read descriptor of regular file ``path`` and its fstat (FileNotFoundError, Refused), the one
    way a file commdiag did not write is opened.  The name is first opened with ``O_PATH``, which opens
    nothing (no device driver's open runs: ``/dev/watchdog`` arms a reboot on open, a tape rewinds, a
    FIFO's waiting writer is released), and only a regular file is then opened for reading, through
    that very descriptor (``/proc/self/fd/N``), so a swap in between cannot change what is read."""
    if not _O_PATH:  # (not Linux) a FIFO still opens without a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise Refused(errno.EINVAL, "not a regular file (a FIFO, device, socket or folder): not read")
        return fd, st
    pfd = os.open(path, _O_PATH | os.O_CLOEXEC)
    try:
        st = os.fstat(pfd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(errno.EINVAL, "not a regular file (a FIFO, device, socket or folder): not read")
        fd = os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(pfd)
    again = os.fstat(fd)
    if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino):  # (cannot happen: the same open file)
        os.close(fd)
        raise Refused(errno.EINVAL, f"{path} changed while commdiag opened it: not read")
    os.set_blocking(fd, True)
    return fd, again


def read_bytes(path: str | Path, limit: int = LIMIT, *, what: str = "file", check_owner: bool = True) -> bytes:
    """The bytes of regular file ``path`` (FileNotFoundError as open() raises it; Refused).
    ``check_owner=False`` only for a file whose content grants nothing (check_env's expectation)."""
    fd, st = open_regular(path)
    try:
        if check_owner:
            check_others(path, what)
            _check_opened(fd, st, path, what)
        data = bytearray()
        while len(data) <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - len(data)))
            if not chunk:
                break
            data += chunk
        if len(data) > limit:
            raise Refused(errno.EFBIG, f"larger than {_size(limit)}: not read")
    finally:
        os.close(fd)
    return bytes(data)


def read_text(path: str | Path, limit: int = LIMIT, *, what: str = "file", check_owner: bool = True) -> str:
    """The UTF-8 text of ``path`` (FileNotFoundError; Refused; UnicodeDecodeError)."""
    return read_bytes(path, limit, what=what, check_owner=check_owner).decode("utf-8")


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB" if limit >= 1 << 10 else f"{limit} bytes"
