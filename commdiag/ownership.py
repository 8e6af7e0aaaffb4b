"""Who besides root could change a path: the one walker every root-side check uses.

A file is only as safe as every folder above it: whoever can write a folder can rename what is in it
and put a link or another file in its place.  ``Walker.path`` looks at every component of a path from
``/`` down, each link followed hop by hop (the link's own folder, then its target's), and records a
``Finding`` for each component that a user other than root could change:

* owned by a user other than root;
* writable by everyone, or by a group, unless it is a folder with the sticky bit (``/tmp``: only a
  file's owner may rename it there).  A group-writable path is a finding even when the group is root's
  (gid 0): that is also how a POSIX ACL grant looks in the mode bits (``setfacl -m u:deploy:rwx``
  shows as ``g+w``, the group bits being the ACL's mask);
* a POSIX ACL (the ``system.posix_acl_access`` attribute, and for a folder ``system.posix_acl_default``,
  which new files inherit) that grants write to a named user or group other than root, through a mask
  that lets it pass.

Used by ``environment/trust.py`` (whose interpreter root would start), ``readfile`` (what root reads),
``atomic`` (where root writes through links) and the install checks of file-valued settings.
Reads only metadata (lstat, getxattr); opens nothing.
"""

from __future__ import annotations

import grp
import os
import posixpath
import pwd
import stat
import struct
from dataclasses import dataclass

ACL_ACCESS = "system.posix_acl_access"
ACL_DEFAULT = "system.posix_acl_default"
# linux/posix_acl_xattr.h: a 4-byte version (2), then entries of (u16 tag, u16 perm, u32 id)
_ACL_VERSION = 2
_ACL_USER, _ACL_GROUP, _ACL_MASK = 0x02, 0x08, 0x10
_ACL_WRITE = 0x02


@dataclass(frozen=True)
class Finding:
    path: str
    uid: int  # the owner; root (0) when only the mode or an ACL is the finding
    gid: int
    why: str  # "owned by uid 1000 (alice)", "writable by group 27 (sudo)", "world-writable (mode 0777)"


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "no such user"


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return "no such group"


def acl_writers(raw: bytes) -> list[tuple[str, int]]:
    """The named users and groups (("user", uid) / ("group", gid)) an ACL's bytes let write, root's
    own entries left out.  An entry is only effective through the mask (when there is one)."""
    if len(raw) < 4 or struct.unpack_from("<I", raw)[0] != _ACL_VERSION:
        return [("unreadable ACL", -1)]  # a format we cannot read: assume the worst
    entries = [struct.unpack_from("<HHI", raw, off) for off in range(4, len(raw) - 7, 8)]
    mask = next((perm for tag, perm, _ in entries if tag == _ACL_MASK), 0o7)
    out = []
    for tag, perm, ident in entries:
        if tag in (_ACL_USER, _ACL_GROUP) and perm & mask & _ACL_WRITE and ident != 0:
            out.append(("user" if tag == _ACL_USER else "group", ident))
    return out


def _acl_finding(path: str, st: os.stat_result, fd: int | None = None) -> Finding | None:
    names = (ACL_ACCESS, ACL_DEFAULT) if stat.S_ISDIR(st.st_mode) else (ACL_ACCESS,)
    for name in names:
        try:
            raw = os.getxattr(fd, name) if fd is not None else os.getxattr(path, name, follow_symlinks=False)
        except OSError:
            continue  # no ACL (ENODATA), or a file system without them
        for kind, ident in acl_writers(raw):
            who = (f"user {ident} ({user_name(ident)})" if kind == "user" else
                   f"group {ident} ({group_name(ident)})" if kind == "group" else "an ACL commdiag cannot read")
            which = "default ACL" if name == ACL_DEFAULT else "ACL"
            return Finding(path, ident if kind == "user" else 0, st.st_gid, f"writable by {who} (POSIX {which})")
    return None


def inspect(path: str, st: os.stat_result, fd: int | None = None) -> Finding | None:
    """The finding on one component (its lstat given), or None when only root can change it.  ``fd``:
    an open descriptor of it (``st`` its fstat), whose ACL is read instead of the path's: a file judged
    by what was opened, not by what the name holds by now (``readfile``)."""
    if st.st_uid != 0:
        return Finding(path, st.st_uid, st.st_gid, f"owned by uid {st.st_uid} ({user_name(st.st_uid)})")
    if stat.S_ISLNK(st.st_mode):
        return None  # a link's own mode means nothing; who can replace it is its folder's question
    sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if st.st_mode & stat.S_IWOTH and not sticky:
        return Finding(path, 0, st.st_gid, f"world-writable (mode {stat.S_IMODE(st.st_mode):04o})")
    acl = None if sticky else _acl_finding(path, st, fd)  # before the group bits: with an ACL they are its mask
    if acl is not None:
        return acl
    if st.st_mode & stat.S_IWGRP and not sticky:
        return Finding(path, 0, st.st_gid, f"writable by group {st.st_gid} ({group_name(st.st_gid)})"
                       + (" or by a POSIX ACL entry (mode bits g+w)" if st.st_gid == 0 else ""))
    return None


class Walker:
    """lstat of every component of the paths asked about, each once, links followed hop by hop."""

    def __init__(self):
        self.seen: set[str] = set()
        self.findings: list[Finding] = []
        self.links: list[str] = []  # the links met on the way (their own paths)

    def path(self, path: str, depth: int = 0) -> str:
        """Walk ``path`` as the kernel resolves it: ``..`` is taken after the links before it (``/tmp/L/..``
        is the parent of L's target, not ``/tmp``), so the walk reaches the very file an open would.
        Returns that resolution (the components that do not exist kept as named): the one path the
        findings are about, which a writer uses as it is rather than resolving the links again later
        (a link planted between the walk and a second resolution would be followed unseen)."""
        if not path.startswith("/"):
            path = posixpath.join(os.getcwd(), path)
        parts = [p for p in path.split("/") if p not in ("", ".")]
        done: list[str] = []  # the components so far, none of them a link (each link was followed)
        self._visit("/")
        for i, name in enumerate(parts):
            if name == "..":
                if done:
                    done.pop()
                continue
            done.append(name)
            here = "/" + "/".join(done)
            st = self._visit(here)
            if st is None:  # what does not exist runs nothing (and cannot be written through)
                return posixpath.normpath("/".join([here, *parts[i + 1:]]))
            if stat.S_ISLNK(st.st_mode):
                if depth < 40:
                    target = posixpath.join(posixpath.dirname(here), os.readlink(here))
                    return self.path("/".join([target, *parts[i + 1:]]), depth + 1)
                return posixpath.normpath("/".join([here, *parts[i + 1:]]))  # too many: opening it fails
        return "/" + "/".join(done)

    def _visit(self, here: str) -> os.stat_result | None:
        """lstat of ``here`` (None: absent); its finding and link recorded the first time it is met."""
        try:
            st = os.lstat(here)
        except OSError:
            return None
        if here not in self.seen:
            self.seen.add(here)
            f = inspect(here, st)
            if f is not None:
                self.findings.append(f)
            if stat.S_ISLNK(st.st_mode):
                self.links.append(here)
        return st


def findings(*paths: str) -> list[Finding]:
    """Every finding on ``paths`` (and the folders above them, links followed)."""
    w = Walker()
    for p in paths:
        w.path(str(p))
    return w.findings


def first_finding(*paths: str) -> Finding | None:
    found = findings(*paths)
    return found[0] if found else None
