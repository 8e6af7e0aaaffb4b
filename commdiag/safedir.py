"""Reaching a directory without following a symbolic link, and changing files only through it.

install-hook writes as root into directories that another user may be able to change between
the plan and the write (a venv under ``--allow-user-owned``, a site-packages that someone turns
into a link to the system's).  A plain path would follow whatever is there at that moment.  So
every directory is opened from a base (``/``, or ``--root``) one component at a time with
``O_NOFOLLOW | O_DIRECTORY``: a component that is a symbolic link, or no directory, stops the
walk (``NotReal``).  Every read, write, rename and removal is then relative to the directory's
descriptor (``openat``, ``renameat``, ``unlinkat``, ``mkdirat``), and a directory is known by
its identity, ``(st_dev, st_ino)``, which the install manifest records: uninstall acts only in
the very directory it installed into.

``real_path`` resolves the links of a path once, when the plan is made (a venv's ``lib64`` link,
a distribution's ``/lib``): from then on the resolved path is walked and must stay link-free.
Under ``--root`` an absolute link target is read inside the root, as a chroot would.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat

_PATH = getattr(os, "O_PATH", os.O_RDONLY)  # O_PATH: passing through needs no read permission
_WALK = _PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINKS = 40  # the kernel's own limit on links in one lookup


class NotReal(OSError):
    """A component on the way is a symbolic link, or not a directory."""

    def __init__(self, path: str, what: str):
        super().__init__(errno.ELOOP, what, path)
        self.path, self.what = path, what


def components(path: str, base: str) -> list[str]:
    """The names below ``base`` that lead to ``path`` (both absolute and normalized)."""
    path, base = posixpath.normpath(path), posixpath.normpath(base)
    if path == base:
        return []
    if not path.startswith(base.rstrip("/") + "/"):
        raise ValueError(f"{path} is not inside {base}")
    return path[len(base.rstrip("/")) + 1:].split("/")


def _what(dfd: int, name: str) -> str:
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return "not a directory"
    return "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"


def open_dir(path: str, base: str = "/") -> int:
    """A descriptor of directory ``path``, reached from ``base`` without following a link.

    Raises NotReal (a link or a non-directory on the way), FileNotFoundError, PermissionError."""
    names = components(path, base)
    # the base itself (/, or --root as given) is opened as it is named
    fd = os.open(base, (os.O_RDONLY if not names else _PATH) | os.O_DIRECTORY | os.O_CLOEXEC)
    here = posixpath.normpath(base)
    try:
        for i, name in enumerate(names):
            try:
                nfd = os.open(name, _DIR if i == len(names) - 1 else _WALK, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise NotReal(posixpath.join(here, name), _what(fd, name)) from None
                raise
            os.close(fd)
            fd, here = nfd, posixpath.join(here, name)
        return fd
    except BaseException:
        os.close(fd)
        raise


def identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def real_path(path: str, base: str = "/") -> str:
    """``path`` with every symbolic link resolved, reading absolute targets inside ``base``;
    components that do not exist are kept as they are."""
    base = posixpath.normpath(base)
    todo = components(path, base)
    done: list[str] = []
    links = 0
    while todo:
        name = todo.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            if done:
                done.pop()
            continue
        here = posixpath.join(base, *done, name)
        try:
            st = os.lstat(here)
        except OSError:
            done.append(name)
            continue
        if not stat.S_ISLNK(st.st_mode):
            done.append(name)
            continue
        links += 1
        if links > MAX_LINKS:
            raise NotReal(here, "too many levels of symbolic links")
        target = os.readlink(here)
        if target.startswith("/"):
            done = []
        todo = [n for n in target.split("/") if n] + todo
    return posixpath.join(base, *done) if done else base


# --- operations inside an opened directory --------------------------------------------------------

def lstat_in(dfd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def read_in(dfd: int, name: str, limit: int | None = None) -> bytes:
    """The bytes of regular file ``name`` (never through a link; a FIFO cannot block)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotReal(name, "not a regular file")
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            if limit is not None and sum(map(len, chunks)) > limit:
                raise NotReal(name, f"larger than {limit} bytes")
    finally:
        os.close(fd)


def _tmp_name(name: str) -> str:
    return f".{name[:100]}.commdiag-{os.getpid()}-{os.urandom(4).hex()}.tmp"


def write_in(dfd: int, name: str, data: bytes, mode: int, *, uid: int | None = None, gid: int | None = None,
             mtime_ns: int | None = None) -> None:
    """Put a regular file ``name`` in the directory: a new temporary file there (O_EXCL, never
    through a link), its bytes, mode, owner and mtime, fsync, renamed over ``name``, fsync."""
    tmp = _tmp_name(name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            if uid is not None and os.geteuid() == 0:
                os.fchown(fd, uid, gid if gid is not None else -1)
            os.fsync(fd)
            if mtime_ns is not None:
                os.utime(fd, ns=(mtime_ns, mtime_ns))
        finally:
            os.close(fd)
    except BaseException:
        _drop(dfd, tmp)
        raise
    _replace(dfd, tmp, name)


def symlink_in(dfd: int, name: str, target: str, *, uid: int | None = None, gid: int | None = None) -> None:
    tmp = _tmp_name(name)
    os.symlink(target, tmp, dir_fd=dfd)
    try:
        if uid is not None and os.geteuid() == 0:
            os.chown(tmp, uid, gid if gid is not None else -1, dir_fd=dfd, follow_symlinks=False)
    except BaseException:
        _drop(dfd, tmp)
        raise
    _replace(dfd, tmp, name)


def _replace(dfd: int, tmp: str, name: str) -> None:
    """The finished temporary ``tmp`` becomes ``name`` in one rename (removed if the rename fails)."""
    try:
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        _drop(dfd, tmp)
        raise
    os.fsync(dfd)


def _drop(dfd: int, tmp: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(tmp, dir_fd=dfd)


def unlink_in(dfd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dfd)
        os.fsync(dfd)


def mkdir_in(dfd: int, name: str, mode: int) -> bool:
    """Create directory ``name`` with exactly ``mode`` (no umask); False when it existed."""
    try:
        os.mkdir(name, mode, dir_fd=dfd)
    except FileExistsError:
        return False
    fd = os.open(name, _DIR, dir_fd=dfd)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return True


def make_dirs(path: str, base: str, mode: int) -> list[str]:
    """Create ``path`` and its missing parents below ``base`` (never through a link); returns
    the directories created, top-down."""
    created = []
    missing, up = [], posixpath.normpath(base)
    while not os.path.isdir(up):  # --root DIR that does not exist yet: made as it is named
        missing.append(up)
        up = posixpath.dirname(up)
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, mode)
            os.chmod(d, mode)
            created.append(d)
    fd = os.open(base, _PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    here = posixpath.normpath(base)
    try:
        for name in components(path, base):
            if mkdir_in(fd, name, mode):
                created.append(posixpath.join(here, name))
            try:
                nfd = os.open(name, _WALK, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise NotReal(posixpath.join(here, name), _what(fd, name)) from None
                raise
            os.close(fd)
            fd, here = nfd, posixpath.join(here, name)
    finally:
        os.close(fd)
    return created


class Dirs:
    """Directories opened by ``open_dir`` during one apply, each once; closed together."""

    def __init__(self, base: str):
        self.base = base
        self.fds: dict[str, int] = {}

    def fd(self, path: str) -> int:
        if path not in self.fds:
            self.fds[path] = open_dir(path, self.base)
        return self.fds[path]

    def forget(self, path: str) -> None:
        fd = self.fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
