"""Reading a file commdiag did not just write (run.json, a launch's result.json), from a folder that
another user may own: a regular file only, and at most ``limit`` bytes.

As root, ``commdiag report DIR`` on such a folder would otherwise block forever on a FIFO planted as
run.json, or read a link to a character device (a /dev/zero) until memory ran out on a production
box.  Links to regular files are followed (a run folder may be linked into place)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

LIMIT = 256 << 20  # far above any run.json commdiag writes (a few MB for thousands of launches)


class Refused(OSError):
    """Not a regular file, or larger than the limit: an OSError, so every reader's handler takes it."""

    def __str__(self) -> str:
        return str(self.strerror)


def read_text(path: str | Path, limit: int = LIMIT) -> str:
    """The UTF-8 text of ``path`` (FileNotFoundError as open() raises it; Refused; UnicodeDecodeError)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO opens without a writer
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(errno.EINVAL, "not a regular file (a FIFO, device, socket or folder): not read")
        data = bytearray()
        while len(data) <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - len(data)))
            if not chunk:
                break
            data += chunk
        if len(data) > limit:
            raise Refused(errno.EFBIG, f"larger than {limit >> 20} MiB: not read")
    finally:
        os.close(fd)
    return data.decode("utf-8")
