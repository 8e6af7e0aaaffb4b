"""Whose code root would run by starting an interpreter, and whom to start it as instead.

Starting ``--python PATH`` runs every ``.pth`` import line and ``sitecustomize`` of that
interpreter's tree, and its standard library, with the starter's rights.  Run as root by
install-hook, detect or doctor, that is root running code of whoever can change the tree.  So,
as root only, commdiag looks at who can change it before starting anything:

* before any start (``interpreter_findings``): every directory from ``/`` to the interpreter as
  named and as resolved (each link on the way, and its target), the interpreter file, its
  installation's ``lib`` directories, and a venv's ``pyvenv.cfg`` and ``home``;
* after the probe, which runs nothing of the tree (``hooks_findings``): its prefix, every
  existing directory on its ``sys.path`` and site-packages, and each ``.pth``,
  ``sitecustomize`` and ``usercustomize`` a start reads.

A path owned by a user other than root, or writable by a group, by everyone (a directory
without the sticky bit) or through a POSIX ACL, is a ``Finding`` (``commdiag/ownership.py``, the
one walker).  With findings ``decide`` refuses: one error naming
the path, its owner and ``--allow-user-owned``.  With that option (detect and doctor, which
only read, use it always) the interpreter is started as that owner instead, its uid and gid and
no other group (``RunAs``; ``nobody`` with the group for a root-owned, group-writable tree),
for the probe and for every later start (install's verification, ``--status``).  What such an
interpreter replies is then the owner's word: ``check_prefix`` holds its prefix against where
the interpreter lives, and install-hook writes only inside that prefix.
"""

from __future__ import annotations

import os
import posixpath
import pwd
import shutil
from dataclasses import dataclass

from .. import ownership, readfile
from ..errors import CommdiagError
from ..ownership import Finding

OPTION = "--allow-user-owned"
NOBODY = 65534  # the kernel's overflow uid/gid, "nobody"/"nogroup" on Debian, RHEL and Ubuntu


@dataclass(frozen=True)
class RunAs:
    """Whom an untrusted interpreter is started as (root only)."""

    uid: int
    gid: int
    because: str  # the finding, for messages (procs.start drops to uid and gid, and no other group)


_Walker = ownership.Walker  # the one walker (commdiag/ownership.py)


def _venv_cfg(exe: str) -> str | None:
    cfg = posixpath.join(posixpath.dirname(posixpath.dirname(exe)), "pyvenv.cfg")
    return cfg if os.path.isfile(cfg) else None


def _home(cfg: str) -> str | None:
    try:  # the one reader (a FIFO planted as pyvenv.cfg never hangs root); its owner is this module's finding
        text = readfile.read_bytes(cfg, 1 << 20, check_owner=False).decode("utf-8", "replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() == "home":
            return value.strip()
    return None


def absolute(exe: str) -> str:
    """The interpreter as an absolute path (a bare name is looked up on PATH, as exec would)."""
    if "/" not in exe:
        found = shutil.which(exe)
        if found:
            exe = found
    return posixpath.normpath(os.path.abspath(exe))


def interpreter_findings(exe: str) -> list[Finding]:
    """Findings on what a start of ``exe`` reads before the probe can say anything."""
    w = _Walker()
    w.path(exe)
    real = os.path.realpath(exe)
    install = posixpath.dirname(posixpath.dirname(real))  # bin/.. : where its lib/pythonX.Y lives
    for lib in ("lib", "lib64"):
        d = posixpath.join(install, lib)
        w.path(d)
        try:
            names = sorted(os.listdir(d))
        except OSError:
            names = []
        for name in names:
            if name.startswith("python"):
                w.path(posixpath.join(d, name))
    cfg = _venv_cfg(exe)
    if cfg:
        w.path(cfg)
        home = _home(cfg)
        if home and home.startswith("/"):
            w.path(home)
    return w.findings


def hooks_findings(hooks) -> list[Finding]:
    """Findings on what a normal start of a probed interpreter reads and runs."""
    w = _Walker()
    for p in (hooks.prefix, *hooks.site_packages, *hooks.sys_path, *hooks.pth_files,
              *(x for x in (hooks.sitecustomize, hooks.usercustomize) if x)):
        if p and p.startswith("/"):
            w.path(p)
    return w.findings


def decide(findings: list[Finding], exe: str, allow: bool) -> RunAs | None:
    """Whom to start ``exe`` as (None: as this process, root or not); refuses without ``allow``."""
    if not findings or os.geteuid() != 0:
        return None
    owners = sorted({f.uid for f in findings if f.uid != 0})
    first = next((f for f in findings if f.uid != 0), findings[0])
    if len(owners) > 1:
        raise CommdiagError(f"{exe}: its tree belongs to several users (uids {', '.join(map(str, owners))}; "
                            f"{first.path} is {first.why}): commdiag will not start it as root, nor as "
                            "one of them; run commdiag as the user who owns it")
    if not allow:
        who = f"uid {owners[0]}" if owners else f"uid {NOBODY} (nobody)"
        raise CommdiagError(f"{first.path}: {first.why}; as root, starting {exe} would run code from it "
                            f"(.pth, sitecustomize) with root's rights. Run commdiag as that user, or give "
                            f"{OPTION} to start it as {who} and accept installing into it")
    if owners:
        uid = owners[0]
        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = first.gid
    else:
        # the group that can write, never root's own (a g+w gid 0 path, an ACL grant: nobody's group)
        group = first.why.startswith("writable by group") and "ACL" not in first.why and first.gid != 0
        uid, gid = NOBODY, first.gid if group else NOBODY
    return RunAs(uid, gid, f"{first.path} is {first.why}")


def _venv_candidates(exe: str) -> list[str]:
    """Venv directories a start of ``exe`` may take as its prefix: at each hop of its links."""
    out, hop = [], exe
    for _ in range(40):
        cfg = _venv_cfg(hop)
        if cfg:
            out.append(os.path.realpath(posixpath.dirname(cfg)))
        if not os.path.islink(hop):
            break
        hop = posixpath.normpath(posixpath.join(posixpath.dirname(hop), os.readlink(hop)))
    return out


def inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def check_prefix(hooks, exe: str) -> None:
    """An untrusted interpreter's prefix must be where it lives: its venv's directory, or a
    directory above the interpreter file (what CPython's own start computes)."""
    venvs = _venv_candidates(exe)
    real = os.path.realpath(exe)
    ok = (os.path.realpath(hooks.prefix) in venvs) if venvs else inside(posixpath.dirname(real), hooks.prefix)
    if not ok:
        raise CommdiagError(f"{exe}: its probe says its prefix is {hooks.prefix}, which is not where the "
                            "interpreter lives; commdiag will not write where an interpreter it started "
                            f"as another user says ({OPTION})")
