"""``commdiag detect --capture-sysfs DIR``: copy what the PCIe audit reads, for a bug report.

The audit runs once on the live tree with tracing on (``SysfsTree(trace=True)``); every link,
file and directory listing it read is then recreated under a new folder ``DIR``, so
``commdiag detect --sysfs-root DIR`` on another machine sees what this machine's audit saw, and
nothing else: no other attribute, no other file.  Two things are reduced on the way:

* ``proc/cmdline`` keeps only the IOMMU/ACS options the audit uses (a command line can carry
  anything else);
* the serial number in a config space's Device Serial Number capability is zeroed.

How it writes (it may run as root): ``DIR`` must not exist; it is created, opened without
following links, checked to be an empty directory owned by this user, and everything below it is
created relative to open directory descriptors, with ``O_EXCL|O_NOFOLLOW``: nothing can be
redirected to a path elsewhere.  Nothing outside ``DIR`` is written.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from ..errors import CommdiagError
from . import pciconfig, pcie
from .sysfs import SysfsTree

EXT_CAP_DSN = 0x0003


@dataclass(frozen=True)
class Capture:
    path: str
    files: int
    links: int
    dirs: int
    audit: pcie.PcieAudit


def scrub_config(data: bytes) -> bytes:
    """Config space with the Device Serial Number zeroed (the rest as read)."""
    out = bytearray(data)
    for cap in pciconfig.ext_capabilities(data):
        if cap.id == EXT_CAP_DSN and cap.offset + 12 <= len(out):
            struct.pack_into("<Q", out, cap.offset + 4, 0)
    return bytes(out)


def _content(rel: str, data: bytes) -> bytes:
    if rel == "proc/cmdline":
        return (" ".join(pcie.kernel_options(data.decode("ascii", errors="replace"))) + "\n").encode()
    if rel.endswith("/config"):
        return scrub_config(data)
    return data


class _Writer:
    """Creates paths below one directory descriptor, never following a link."""

    def __init__(self, dest: str):
        from .. import atomic

        dest = os.path.abspath(dest)
        name = os.path.basename(dest)
        if name in ("", ".", ".."):
            raise CommdiagError(f"--capture-sysfs {dest}: give a new folder name")
        # the folder above DEST through the one writer: reached without following a link (as root, only
        # links nobody else can change), so DEST is made where it was named, not where a link points
        with atomic.folder_fd(os.path.dirname(dest)) as parent:
            try:
                os.mkdir(name, 0o755, dir_fd=parent)
            except FileExistsError:
                raise CommdiagError(f"--capture-sysfs {dest}: already exists; give a new folder name") from None
            except OSError as e:
                raise CommdiagError(f"--capture-sysfs {dest}: cannot create it: {e.strerror}") from None
            self.fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        st = os.fstat(self.fd)
        if st.st_uid != os.geteuid() or os.listdir(self.fd):
            os.close(self.fd)
            raise CommdiagError(f"--capture-sysfs {dest}: changed under us (not the empty folder just made)")
        self.counts = {"files": 0, "links": 0, "dirs": 0}

    def _parent(self, rel: str) -> tuple[int, str]:
        """An open descriptor of ``rel``'s parent (made as needed) and the last name; the caller closes it."""
        parts = rel.split("/")
        fd = os.dup(self.fd)
        for name in parts[:-1]:
            try:
                os.mkdir(name, 0o755, dir_fd=fd)
                self.counts["dirs"] += 1
            except FileExistsError:
                pass
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd, parts[-1]

    def dir(self, rel: str) -> None:
        fd, name = self._parent(rel)
        try:
            os.mkdir(name, 0o755, dir_fd=fd)
            self.counts["dirs"] += 1
        except FileExistsError:  # made as a parent already, or a link the audit followed
            pass
        finally:
            os.close(fd)

    def link(self, rel: str, target: str) -> None:
        fd, name = self._parent(rel)
        try:
            os.symlink(target, name, dir_fd=fd)
            self.counts["links"] += 1
        finally:
            os.close(fd)

    def file(self, rel: str, data: bytes) -> None:
        fd, name = self._parent(rel)
        try:
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                          dir_fd=fd)
            try:
                os.write(out, data)
            finally:
                os.close(out)
            self.counts["files"] += 1
        finally:
            os.close(fd)


def capture(dest: str, root: str = "/", *, nvml_bus_ids=()) -> Capture:
    """Audit ``root`` and copy what the audit read into the new folder ``dest``."""
    tree = SysfsTree(root, trace=True)
    result = pcie.audit(root, nvml_bus_ids=nvml_bus_ids, tree=tree)
    w = _Writer(dest)
    try:
        # parents before children: links and files are created at link-free paths, so a sorted
        # walk never needs a path below a link it made
        for rel, target in sorted(tree.links.items()):
            w.link(rel, target)
        for rel, data in sorted(tree.files.items()):
            w.file(rel, _content(rel, data))
        for rel, names in sorted(tree.listings.items()):
            if rel:
                w.dir(rel)
            for n in names:
                child = f"{rel}/{n}" if rel else n
                if child not in tree.links and child not in tree.files:
                    w.dir(child)
    except OSError as e:
        raise CommdiagError(f"--capture-sysfs {dest}: writing {e.filename or ''} failed: {e.strerror}") from None
    finally:
        os.close(w.fd)
    return Capture(dest, w.counts["files"], w.counts["links"], w.counts["dirs"], result)
