"""Bounded, read-only access to a sysfs tree: the live ``/`` or a captured copy (``--sysfs-root``).

Everything the PCIe audit reads goes through ``SysfsTree``, which makes a hostile or damaged tree
cost a skip, never a hang or a crash:

* symbolic links are resolved here, component by component, *inside the root* (an absolute
  target or a ``..`` past the top stays in the tree, as in a chroot), at most 40 of them per path
  (the kernel's own limit): a loop is a skip with its path in ``problems``;
* a file is read only when it is a regular file (a FIFO or a device node in a captured tree would
  block or never end), opened without following a final link and without blocking, and at most
  ``limit`` bytes of it;
* a directory listing stops after ``MAX_ENTRIES`` names.

Nothing is ever opened for writing.  With ``trace=True`` the tree remembers every link, file and
listing it read, which is exactly what ``sysfscapture`` copies for a bug report.
"""

from __future__ import annotations

import os
import stat

MAX_LINKS = 40  # links followed per path: the kernel's MAXSYMLINKS
MAX_ENTRIES = 4096  # names read from one directory (a box has a few hundred PCI functions)
TEXT_LIMIT = 4096  # a sysfs attribute is at most one page
MAX_PROBLEMS = 20


class SysfsTree:
    def __init__(self, root: str = "/", *, trace: bool = False):
        self.root = os.path.abspath(root)
        self.problems: list[str] = []
        self.links: dict[str, str] | None = {} if trace else None  # rel path -> link text
        self.files: dict[str, bytes] | None = {} if trace else None  # rel path -> bytes read
        self.listings: dict[str, list[str]] | None = {} if trace else None  # rel dir -> names

    def _problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS and text not in self.problems:
            self.problems.append(text)

    def full(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else self.root

    def resolve(self, rel: str) -> str | None:
        """``rel`` with every link resolved inside the root (a relative path), or None when it does
        not exist, loops, or runs through something that is not a directory."""
        todo = [p for p in rel.split("/") if p][::-1]  # a stack: the next component last
        done: list[str] = []
        links = 0
        while todo:
            name = todo.pop()
            if name == ".":
                continue
            if name == "..":
                if done:
                    done.pop()
                continue
            here = "/".join(done + [name])
            try:
                st = os.lstat(self.full(here))
            except (OSError, ValueError):  # absent, not a directory on the way, a NUL in a name
                return None
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_LINKS:
                    self._problem(f"{rel}: more than {MAX_LINKS} symbolic links (a loop?): skipped")
                    return None
                try:
                    target = os.readlink(self.full(here))
                except OSError:
                    return None
                if self.links is not None:
                    self.links[here] = target
                if target.startswith("/"):
                    done = []
                todo.extend(p for p in reversed(target.split("/")) if p)
            else:
                done.append(name)
        return "/".join(done)

    def read_bytes(self, rel: str, limit: int = TEXT_LIMIT) -> bytes | None:
        """At most ``limit`` bytes of a regular file, or None (absent, unreadable, not a file)."""
        real = self.resolve(rel)
        if real is None:
            return None
        try:
            fd = os.open(self.full(real), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                self._problem(f"{real}: not a regular file: skipped")
                return None
            chunks, size = [], 0
            while size < limit:  # sysfs may return less than asked per read
                chunk = os.read(fd, limit - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
        except OSError:
            return None
        finally:
            os.close(fd)
        if self.files is not None:
            self.files[real] = data
        return data

    def read_text(self, rel: str, limit: int = TEXT_LIMIT) -> str | None:
        data = self.read_bytes(rel, limit)
        return None if data is None else data.decode("ascii", errors="replace").strip()

    def listdir(self, rel: str) -> list[str] | None:
        """Up to MAX_ENTRIES names in a directory, sorted; None when it is absent or unreadable."""
        real = self.resolve(rel)
        if real is None:
            return None
        names: list[str] = []
        try:
            with os.scandir(self.full(real)) as it:
                for entry in it:
                    if len(names) >= MAX_ENTRIES:
                        self._problem(f"{real}: more than {MAX_ENTRIES} entries: the rest skipped")
                        break
                    names.append(entry.name)
        except OSError:
            return None
        names.sort()
        if self.listings is not None:
            self.listings[real] = names
        return names
