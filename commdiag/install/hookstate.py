"""The file-system side of install-hook: staged roots, surveys, the manifest, the lock, applying a plan.

What it writes:

* the files of a plan (hookplan.py), each atomically and only through directory
  descriptors reached without following a link (safedir.py): a new temporary file in
  the same directory, fsync, rename, fsync of the directory.  A change is made only
  in the directory the plan surveyed (its ``(st_dev, st_ino)``), uninstall's only in
  the one the install wrote in;
* the manifest ``STATE/installs.json`` (format ``commdiag-hook-manifest``, version 2,
  mode 0644): one record per install with every changed path's original state
  (permission bits, owner, mtime, symlink target, and for a file its sha256), and the
  identity of each file's directory;
* ``STATE/saved/SHA256`` (directory 0700, files 0600): the bytes of each file an
  install replaced or edited, for the exact undo; readable by the installing user
  only (a replaced ``/root/.nccl.conf`` may hold a token), while the manifest stays
  readable for ``--status``;
* ``STATE/lock``: held (flock) while a plan is made and applied, so two installs
  cannot interleave; opened without following a link (a link there is refused).

STATE is ``ROOT/var/lib/commdiag`` with ``--root``, ``/var/lib/commdiag`` for
root, else ``$XDG_STATE_HOME/commdiag`` (``~/.local/state/commdiag``).  When
the last install is removed the manifest, the saved copies, the lock and the
directories commdiag created for them are removed too, so an uninstall leaves the
tree as it was.

``--root DIR``: paths of the target system (``/etc/...``, ``/usr/...``) are
written under DIR instead; a path already inside DIR (a venv created there) is
used as it is.  Symlinks inside DIR are followed as a chroot would (an absolute
link target is read relative to DIR).

Format history of installs.json: 1  first version (original bytes inline, base64; bytecode
recorded); 2  the directories' identities (``dir_id``, ``import_dir_id``), original bytes in
STATE/saved/, no bytecode.  Version 1 manifests are read and uninstalled (see hookplan._refusal).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import posixpath
import re
import stat
from dataclasses import dataclass

from ..errors import CommdiagError, brief
from .. import safedir
from .hookplan import ABSENT, BLOCKED, DIR, DIR_MODE, FILE, OTHER, SYMLINK, FileState, Plan

MANIFEST_FORMAT = "commdiag-hook-manifest"
MANIFEST_VERSION = 2
MANIFEST_NAME = "installs.json"
SAVED_DIR = "saved"  # in STATE: the original bytes of replaced files, by sha256
MANIFEST_MODE = 0o644  # no file content in it: --status works for every user
SAVED_MODE, SAVED_DIR_MODE = 0o600, 0o700


@dataclass(frozen=True)
class Roots:
    """Maps paths of the target system to where they are written (``--root``)."""

    root: str | None = None

    def staged(self, path: str) -> str:
        path = posixpath.normpath(path)
        if self.root is None:
            return path
        root = posixpath.normpath(os.path.abspath(self.root))
        if path == root or path.startswith(root + "/"):
            return path
        return posixpath.join(root, path.lstrip("/"))

    def shown(self, staged: str) -> str:
        """The target system's name for a staged path."""
        if self.root is None:
            return staged
        root = posixpath.normpath(os.path.abspath(self.root))
        if staged.startswith(root + "/"):
            return "/" + staged[len(root) + 1:]
        return staged

    def is_rerooted(self, path: str) -> bool:
        """True when ``path`` (a target-system path) is written somewhere else than itself."""
        return self.staged(path) != posixpath.normpath(path)

    @property
    def base(self) -> str:
        """Where every walk starts: ``/``, or the root (opened as it is named)."""
        return "/" if self.root is None else posixpath.normpath(os.path.abspath(self.root))

    def resolve(self, path: str) -> str:
        """Follow symlinks of a staged path's last component, reading absolute link targets inside the root."""
        path = self.staged(path)
        for _ in range(40):  # the kernel's own limit on nested links
            if not os.path.islink(path):
                return path
            target = os.readlink(path)
            if posixpath.isabs(target):
                path = self.staged(target)
            else:
                path = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        raise CommdiagError(f"{path}: too many levels of symbolic links")

    def real_dir(self, path: str) -> str:
        """A staged directory with every link resolved."""
        try:
            return safedir.real_path(self.staged(path), self.base)
        except OSError as e:
            raise CommdiagError(f"{self.shown(path)}: {e.strerror}") from None

    def real(self, path: str) -> str:
        """A staged path with the links of its directories resolved (its last component kept as
        it is): what is walked, link-free, when the plan is applied."""
        path = self.staged(path)
        try:
            return posixpath.join(safedir.real_path(posixpath.dirname(path), self.base), posixpath.basename(path))
        except OSError as e:
            raise CommdiagError(f"{self.shown(path)}: {e.strerror}") from None


def state_dir(roots: Roots) -> str:
    if roots.root is not None:
        d = roots.staged("/var/lib/commdiag")
    elif os.geteuid() == 0:
        d = "/var/lib/commdiag"
    else:
        base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
        d = posixpath.normpath(os.path.join(os.path.abspath(base), "commdiag"))
    try:
        real = safedir.real_path(d, roots.base)
    except OSError as e:
        raise CommdiagError(f"{d}: {e.strerror}") from None
    if os.geteuid() == 0:
        _check_state_owner(real, roots)
    return real


def _check_state_owner(real: str, roots: Roots) -> None:
    """As root, the state folder (and its ``tuner/`` and ``saved/``) must be one only root can change
    (``ownership``: owner, group and other write bits, POSIX ACLs, every folder above): the tuner
    library installed there is loaded by every NCCL process, and the saved originals are what an undo
    writes back into /etc; a user who can write there (an ACL grant, her group's g+w) would replace them."""
    from .. import ownership

    for d in (real, posixpath.join(real, "tuner"), posixpath.join(real, "saved")):
        f = ownership.first_finding(d)
        if f is not None:
            raise CommdiagError(f"{roots.shown(d)}: as root, commdiag keeps its install state (the manifest, saved "
                                f"originals, the tuner library) only where no other user can change it, and "
                                f"{roots.shown(f.path)} is {f.why}; "
                                "fix its permissions first (chown root, chmod go-w, setfacl -b)")


def state_in(dfd: int, name: str) -> FileState:
    """What is at ``name`` in an opened directory (never following a link)."""
    st = safedir.lstat_in(dfd, name)
    if st is None:
        return FileState(ABSENT)
    if stat.S_ISLNK(st.st_mode):
        return FileState(SYMLINK, link=os.readlink(name, dir_fd=dfd), uid=st.st_uid, gid=st.st_gid)
    if stat.S_ISDIR(st.st_mode):
        return FileState(DIR, mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid,
                         dev=st.st_dev, ino=st.st_ino)
    if not stat.S_ISREG(st.st_mode):
        return FileState(OTHER)
    try:
        data = safedir.read_in(dfd, name)
    except safedir.NotReal:  # replaced by something else since the lstat
        return FileState(OTHER)
    return FileState(FILE, data, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns)


def read_state(path: str, roots: Roots | None = None) -> FileState:
    """What is at ``path`` (below ``roots.base``); BLOCKED when it is reached through a link."""
    d, name = posixpath.split(path)
    try:
        dfd = safedir.open_dir(d, (roots or Roots()).base)
    except safedir.NotReal:
        return FileState(BLOCKED)
    except (FileNotFoundError, NotADirectoryError):
        return FileState(ABSENT)
    try:
        return state_in(dfd, name)
    finally:
        os.close(dfd)


def _survey(path: str, base: str, out: dict[str, FileState]) -> None:
    """State of ``path`` and of every directory between ``base`` and it, walked without
    following a link: below a link or a non-directory everything is BLOCKED."""
    names = safedir.components(path, base)
    try:
        fd = os.open(base, safedir._PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:  # --root DIR that does not exist yet
        for i in range(len(names)):
            out.setdefault(posixpath.join(base, *names[:i + 1]), FileState(ABSENT))
        return
    here, blocked = posixpath.normpath(base), None
    try:
        for name in names:
            here = posixpath.join(here, name)
            if blocked is not None:
                out.setdefault(here, FileState(blocked))
                continue
            st = state_in(fd, name) if here == path or here not in out else out[here]
            out[here] = st
            if st.kind == DIR and here != path:
                try:
                    nfd = os.open(name, safedir._WALK, dir_fd=fd)
                except OSError:
                    blocked = BLOCKED
                    continue
                os.close(fd)
                fd = nfd
            elif here != path:
                blocked = ABSENT if st.kind == ABSENT else BLOCKED
    finally:
        os.close(fd)


def snapshot(paths, bytecode_dirs=(), roots: Roots | None = None) -> dict[str, FileState]:
    """Current state of ``paths``, of all their directories (with their identities), and of
    every .pyc in the ``__pycache__`` of ``bytecode_dirs``."""
    base = (roots or Roots()).base
    out: dict[str, FileState] = {}
    for p in paths:
        _survey(p, base, out)
    for d in bytecode_dirs:
        cache = posixpath.join(d, "__pycache__")
        _survey(cache, base, out)  # whether Python had made it yet (uninstall removes one it made later)
        if out[cache].kind != DIR:
            continue
        with contextlib.suppress(OSError):
            fd = safedir.open_dir(cache, base)
            try:
                for name in os.listdir(fd):
                    if name.endswith(".pyc"):
                        out[posixpath.join(cache, name)] = state_in(fd, name)
            finally:
                os.close(fd)
    return out


# --- the manifest ----------------------------------------------------------------------------

def _empty_manifest() -> dict:
    return {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "installs": [], "state_dirs_created": []}


def _open_state(sdir: str, roots: Roots | None) -> int | None:
    """The state directory's descriptor (None: it does not exist), reached without a link."""
    try:
        return safedir.open_dir(sdir, (roots or Roots()).base)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except safedir.NotReal as e:
        raise CommdiagError(f"{e.path}: is {e.what}; commdiag keeps its install manifest in {sdir} and "
                            "reaches it only through real directories") from None
    except OSError as e:
        raise CommdiagError(f"{sdir}: cannot read the install manifest's directory: {e.strerror}") from None


def load_manifest(sdir: str, roots: Roots | None = None) -> dict:
    """The manifest, validated: it is data read back from disk, and uninstall writes wherever it
    says.  Refused: a manifest that is not a regular file (a FIFO would hang every install), a
    symlink, one writable by others or owned by another user, and any entry whose paths are not
    where commdiag writes (see ``check_manifest``).  The saved originals (STATE/saved/) are
    attached where this user can read them (``before.data_b64``, in memory only)."""
    path = os.path.join(sdir, MANIFEST_NAME)
    sfd = _open_state(sdir, roots)
    if sfd is None:
        return _empty_manifest()
    try:
        try:
            fd = os.open(MANIFEST_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=sfd)
        except FileNotFoundError:
            return _empty_manifest()
        except OSError as e:
            why = "is a symbolic link" if e.errno == errno.ELOOP else e.strerror
            raise CommdiagError(f"{path}: cannot read the install manifest: {why}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CommdiagError(f"{path}: the install manifest is not a regular file; commdiag will not read "
                                    "it (remove it if you did not put it there)")
            if st.st_mode & stat.S_IWOTH:
                raise CommdiagError(f"{path}: the install manifest is writable by every user; anyone could have "
                                    "changed what --uninstall restores (check it, then chmod o-w)")
            if st.st_uid not in (os.geteuid(), 0):
                raise CommdiagError(f"{path}: the install manifest belongs to uid {st.st_uid}, not to you or "
                                    "root; commdiag will not act on it")
            with os.fdopen(fd, "rb") as f:
                fd = None
                raw = f.read()
        finally:
            if fd is not None:
                os.close(fd)
        try:
            m = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as e:
            raise CommdiagError(f"{path}: cannot read the install manifest: not JSON ({str(e)[:120]})") from None
        if not isinstance(m, dict) or m.get("format") != MANIFEST_FORMAT:
            found = m.get("format") if isinstance(m, dict) else type(m).__name__
            raise CommdiagError(f"{path}: format: {brief(found)} is not {MANIFEST_FORMAT!r}")
        version = m.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise CommdiagError(f"{path}: version: {brief(version)} is not a manifest version "
                                f"(1..{MANIFEST_VERSION})")
        if version > MANIFEST_VERSION:
            raise CommdiagError(f"{path}: version: {version} is newer than this commdiag understands "
                                f"(<= {MANIFEST_VERSION}); upgrade commdiag to change or remove these installs")
        check_manifest(m, path, sdir, roots)
        m.setdefault("state_dirs_created", [])
        _attach_saved(m, sfd)
        return m
    finally:
        os.close(sfd)


def _befores(m: dict):
    for r in m["installs"]:
        for f in r["files"]:
            yield f["before"]


def _attach_saved(m: dict, sfd: int) -> None:
    """Put each saved original's bytes into its ``before`` (checked against its sha256)."""
    wanted = [b for b in _befores(m) if b["kind"] == FILE and "data_b64" not in b]
    if not wanted:
        return
    try:
        dfd = os.open(SAVED_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=sfd)
    except OSError:
        return  # none, or not readable by this user (--status of root's installs): nothing restorable
    try:
        for b in wanted:
            try:
                data = safedir.read_in(dfd, b["sha256"])
            except OSError:
                continue
            if hashlib.sha256(data).hexdigest() == b["sha256"]:
                b["data_b64"] = base64.b64encode(data).decode()
    finally:
        os.close(dfd)


# What commdiag writes, by role (hook.py): a manifest entry naming anything else is refused.
OWNED_NAMES = ("commdiag_nccl_hook.py", "commdiag-nccl.pth", "commdiag-nccl.conf")
TUNER_NAMES = ("libnccl-tuner-commdiag.so", "commdiag-tuner-rules.txt")  # hooktuner.FILE_NAMES, in STATE/tuner/
BLOCK_NAMES = ("sitecustomize.py", "nccl.conf", ".nccl.conf")
_KINDS = (ABSENT, FILE, SYMLINK, DIR, OTHER)
_UNSAFE = re.compile("[\x00-\x1f\x7f]")
_SHA256 = re.compile("[0-9a-f]{64}")


def _bad_path(p) -> str | None:
    if not isinstance(p, str) or not p.startswith("/") or _UNSAFE.search(p):
        return "is not an absolute path"
    if posixpath.normpath(p) != p or "/../" in p + "/":
        return "is not a normalized path"
    return None


def _inside(p: str, d: str) -> bool:
    return p == d or p.startswith(d.rstrip("/") + "/")


def check_manifest(m: dict, path: str, sdir: str, roots: Roots | None = None) -> None:
    """Every path a manifest names is one commdiag could have written: an absolute, normalized
    path; under ``--root`` inside it; an owned file by commdiag's own names (the hook module,
    the .pth, a drop-in in UNIT.d/, /etc/commdiag/UNIT.env, the tuner library and rules in
    ``commdiag/tuner/``), a block in a sitecustomize.py or
    nccl.conf, bytecode in the recorded import directory's __pycache__; created directories
    only above the record's own files (or the state directory)."""
    def bad(where: str, why: str) -> CommdiagError:
        return CommdiagError(f"{path}: {where}: {why}; the manifest was changed by something other than "
                             "commdiag, which will not act on it (restore it from a backup, or move it away)")

    root = posixpath.normpath(os.path.abspath(roots.root)) if roots is not None and roots.root else None
    installs = m.get("installs")
    if not isinstance(installs, list):
        raise bad("installs", "is not a list")
    for i, r in enumerate(installs):
        where = f"installs[{i}]"
        if not isinstance(r, dict) or not isinstance(r.get("key"), str) or not isinstance(r.get("kind"), str):
            raise bad(where, "is not an install record (key, kind, files)")
        files = r.get("files")
        if not isinstance(files, list):
            raise bad(f"{where}.files", "is not a list")
        paths = []
        for j, f in enumerate(files):
            fw = f"{where}.files[{j}]"
            if not isinstance(f, dict):
                raise bad(fw, "is not a file entry")
            p = f.get("path")
            why = _bad_path(p)
            if why:
                raise bad(f"{fw}.path", f"{brief(p)} {why}")
            if root is not None and not _inside(p, root):
                raise bad(f"{fw}.path", f"{p} is outside --root {root}")
            if not isinstance(f.get("shown"), str):
                raise bad(f"{fw}.shown", "is not a path")
            role, name, parent = f.get("role"), posixpath.basename(p), posixpath.dirname(p)
            imp = f.get("import_dir")
            if imp is not None and (_bad_path(imp) or (root is not None and not _inside(imp, root))
                                    or (imp != parent and name != "sitecustomize.py" and role != "cache")):
                raise bad(f"{fw}.import_dir", f"{brief(imp)} is not the directory the file is imported from")
            if role == "owned":
                ok = (name in OWNED_NAMES and (name != "commdiag-nccl.conf" or parent.endswith(".d"))) or (
                    name.endswith(".env") and posixpath.basename(parent) == "commdiag") or (
                    name in TUNER_NAMES and parent.endswith("/commdiag/tuner"))
            elif role == "block":
                ok = name in BLOCK_NAMES
            elif role == "cache":  # bytecode of a module this record wrote, in its import directory
                mod = f.get("module")
                dirs = {g.get("import_dir") for g in files
                        if isinstance(g, dict) and g.get("module") == mod and g.get("role") != "cache"}
                ok = (isinstance(mod, str) and name.startswith(mod + ".") and name.endswith(".pyc")
                      and any(isinstance(d, str) and parent == posixpath.join(d, "__pycache__") for d in dirs))
            else:
                raise bad(f"{fw}.role", f"{brief(role)} is not owned, block or cache")
            if not ok:
                raise bad(f"{fw}.path", f"{p} is not a file commdiag writes in the {role} role")
            for state_key in ("before", "installed"):
                st = f.get(state_key)
                if not isinstance(st, dict) or st.get("kind") not in _KINDS:
                    raise bad(f"{fw}.{state_key}", "is not a file state")
            before = f["before"]
            try:
                FileState.from_json(before)
                if "data_b64" in before:
                    base64.b64decode(before["data_b64"], validate=True)
                elif before["kind"] == FILE and not _SHA256.fullmatch(str(before.get("sha256"))):
                    raise ValueError("no content and no sha256")
            except (ValueError, TypeError, KeyError):
                raise bad(f"{fw}.before", "is not a file state") from None
            for k in ("dir_id", "import_dir_id"):
                v = f.get(k)
                if v is not None and not (isinstance(v, list) and len(v) == 2 and all(
                        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)):
                    raise bad(f"{fw}.{k}", f"{brief(v)} is not a directory identity [st_dev, st_ino]")
            if before["kind"] == SYMLINK and not isinstance(before.get("link"), str):
                raise bad(f"{fw}.before.link", "is not a link target")
            for k in ("mode", "uid", "gid", "mtime_ns"):
                v = before.get(k)
                if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                    raise bad(f"{fw}.before.{k}", f"{brief(v)} is not a non-negative integer")
            paths.append(p)
        dirs = r.get("dirs_created", [])
        if not isinstance(dirs, list):
            raise bad(f"{where}.dirs_created", "is not a list")
        for d in dirs:
            if _bad_path(d) or not any(q.startswith(d + "/") for q in paths) or d == "/":
                raise bad(f"{where}.dirs_created", f"{brief(d)} is not a directory above this install's files")
    sdirs = m.get("state_dirs_created", [])
    if not isinstance(sdirs, list):
        raise bad("state_dirs_created", "is not a list")
    state = posixpath.normpath(os.path.abspath(sdir))
    for d in sdirs:
        if _bad_path(d) or d == "/" or not _inside(state, d):
            raise bad("state_dirs_created", f"{brief(d)} is not the state directory or above it")
        if root is not None and not _inside(d, root):
            raise bad("state_dirs_created", f"{d} is outside --root {root}")


def _save_manifest(sdir: str, manifest: dict, roots: Roots | None = None) -> None:
    """The manifest without file content (0644) and each original's bytes in STATE/saved/ (0600,
    in a 0700 directory), written first; saved copies no record names any more are removed."""
    sfd = safedir.open_dir(sdir, (roots or Roots()).base)
    try:
        blobs: dict[str, bytes] = {}
        public = json.loads(json.dumps(manifest))
        for b in _befores(public):
            if "data_b64" in b:
                data = base64.b64decode(b.pop("data_b64"))
                b["sha256"] = hashlib.sha256(data).hexdigest()
                blobs[b["sha256"]] = data
        referenced = {b["sha256"] for b in _befores(public) if b["kind"] == FILE}
        dfd = _saved_dir(sfd, sdir, create=bool(referenced))
        try:
            if dfd is not None:  # first the copies, then the manifest that names them
                for sha, data in blobs.items():
                    safedir.write_in(dfd, sha, data, SAVED_MODE)
            public["format"], public["version"] = MANIFEST_FORMAT, MANIFEST_VERSION
            safedir.write_in(sfd, MANIFEST_NAME, (json.dumps(public, indent=1) + "\n").encode(), MANIFEST_MODE)
            if dfd is not None:
                for name in os.listdir(dfd):
                    if _SHA256.fullmatch(name) and name not in referenced:
                        safedir.unlink_in(dfd, name)
        finally:
            if dfd is not None:
                os.close(dfd)
    finally:
        os.close(sfd)


def _saved_dir(sfd: int, sdir: str, *, create: bool) -> int | None:
    """STATE/saved/, made 0700 and owned by this user (None: absent and not wanted)."""
    if create:
        safedir.mkdir_in(sfd, SAVED_DIR, SAVED_DIR_MODE)
    try:
        dfd = os.open(SAVED_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=sfd)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CommdiagError(f"{sdir}/{SAVED_DIR}: {'is a symbolic link' if e.errno == errno.ELOOP else e.strerror}; "
                            "commdiag keeps the originals of replaced files there") from None
    st = os.fstat(dfd)
    if st.st_uid != os.geteuid():
        os.close(dfd)
        raise CommdiagError(f"{sdir}/{SAVED_DIR}: belongs to uid {st.st_uid}; commdiag will not keep the "
                            "originals of replaced files there")
    os.fchmod(dfd, SAVED_DIR_MODE)
    return dfd


def _state_error(sdir: str, e: OSError) -> CommdiagError:
    if isinstance(e, safedir.NotReal):
        return CommdiagError(f"{e.path}: is {e.what}; commdiag keeps its install manifest in {sdir} and "
                             "reaches it only through real directories")
    if isinstance(e, PermissionError):
        return CommdiagError(f"{sdir}: permission denied; commdiag keeps its install manifest there, which "
                             "needs root (run with sudo), or stage with --root DIR")
    return CommdiagError(f"{e.filename or sdir}: {e.strerror}; commdiag keeps its install manifest in "
                         f"{sdir} and cannot write there")


@contextlib.contextmanager
def locked(sdir: str, roots: Roots | None = None):
    """Exclusive lock on STATE/lock; yields the list of state directories this call created.

    The lock is opened in the state directory's descriptor without following a link: a link
    or anything but a regular file there is refused (root would otherwise create or open
    whatever file it points to)."""
    base = (roots or Roots()).base
    created: list[str] = []
    while True:
        sfd = None
        try:
            created += safedir.make_dirs(sdir, base, DIR_MODE)
            sfd = safedir.open_dir(sdir, base)
            fd = os.open("lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644,
                         dir_fd=sfd)
        except FileNotFoundError:
            if sfd is not None:
                os.close(sfd)
            continue  # the last uninstall removed the state directory in between
        except OSError as e:
            if sfd is not None:
                os.close(sfd)
            if e.errno == errno.ELOOP and not isinstance(e, safedir.NotReal):
                raise CommdiagError(f"{sdir}/lock: is a symbolic link; commdiag opens its lock only as a "
                                    "regular file (remove the link)") from None
            raise _state_error(sdir, e) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            os.close(sfd)
            raise CommdiagError(f"{sdir}/lock: is not a regular file; commdiag will not lock on it (remove it)")
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.path.samestat(os.fstat(fd), os.stat("lock", dir_fd=sfd, follow_symlinks=False))
        except FileNotFoundError:
            same = False
        os.close(sfd)
        if same:
            break
        os.close(fd)  # the last uninstall removed the lock file while we waited: take the new one
    try:
        yield created
    finally:
        os.close(fd)


# --- applying a plan ---------------------------------------------------------------------------

def put_in(dfd: int, name: str, state: FileState) -> None:
    """Make ``name`` in the opened directory ``state`` (a file, a symlink, or absent)."""
    if state.kind == ABSENT:
        safedir.unlink_in(dfd, name)
    elif state.kind == SYMLINK:
        safedir.symlink_in(dfd, name, state.link, uid=state.uid, gid=state.gid)
    else:
        safedir.write_in(dfd, name, state.data or b"", state.mode if state.mode is not None else 0o644,
                         uid=state.uid, gid=state.gid, mtime_ns=state.mtime_ns)


def preflight(plan: Plan, roots: Roots) -> None:
    """Refuse before anything is written: world-writable directories, missing write permission."""
    for c in plan.changes:
        d = posixpath.dirname(c.path)
        while d and not os.path.isdir(d):
            d = posixpath.dirname(d)
        try:
            st = os.stat(d)
        except OSError:
            continue
        exists = d == posixpath.dirname(c.path)
        if exists and st.st_mode & stat.S_IWOTH and c.after.kind != ABSENT:
            raise CommdiagError(f"{roots.shown(d)}: directory is world-writable; commdiag will not put a file "
                                "there that every Python start executes (fix its permissions first)")
        if c.after.kind != ABSENT:
            # a world-writable ancestor without the sticky bit lets anyone rename the whole subtree away
            # and put their own in its place (site-packages under a 0777 /opt/venvs, say)
            a = posixpath.dirname(d)
            while a and a != posixpath.dirname(a):
                try:
                    ast = os.stat(a)
                except OSError:
                    break
                if ast.st_mode & stat.S_IWOTH and not ast.st_mode & stat.S_ISVTX:
                    raise CommdiagError(f"{roots.shown(a)}: directory is world-writable (above {roots.shown(d)}); "
                                        "anyone could swap the files commdiag installs below it (fix its "
                                        "permissions first, e.g. chmod o-w or +t)")
                a = posixpath.dirname(a)
        if not os.access(d, os.W_OK):
            raise permission_error(roots.shown(c.path), roots)


def permission_error(shown: str, roots: Roots) -> CommdiagError:
    return CommdiagError(f"{shown}: permission denied; writing there needs root (run with sudo), "
                         "or stage the files with --root DIR")


class Swapped(OSError):
    """The directory a change is for is not the one the plan surveyed (or the install wrote in)."""


def _rmdir(path: str, base: str) -> None:
    """Remove directory ``path`` if it is empty, reached without a link; otherwise leave it."""
    parent, name = posixpath.split(path)
    try:
        fd = safedir.open_dir(parent, base)
    except OSError:
        return
    try:
        os.rmdir(name, dir_fd=fd)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.ENOTDIR):
            raise
    finally:
        os.close(fd)


def apply(plan: Plan, roots: Roots) -> tuple[list[str], dict[str, list[int]]]:
    """Apply ``plan`` (idempotent: paths already in their final state are skipped).

    Every change goes through its directory's descriptor, reached without following a link, and
    only when that directory is the one the plan expects (``Change.dir_id``).  On any error the
    paths changed so far are put back and the error is raised; returns the directories created
    and the identity of every directory written in."""
    preflight(plan, roots)
    done: list[tuple[int, str, FileState]] = []
    created: list[str] = []
    dirs = safedir.Dirs(roots.base)
    current = "?"  # the path being changed, for an OSError that names none (ENOSPC on write)
    try:
        try:
            for d in plan.mkdirs:
                current = d
                created += safedir.make_dirs(d, roots.base, DIR_MODE)
            for c in plan.changes:
                current = c.path
                parent, name = posixpath.split(c.path)
                dfd = dirs.fd(parent)
                if c.dir_id is not None and list(safedir.identity(dfd)) != list(c.dir_id):
                    raise Swapped(errno.ESTALE, "is another directory than the one surveyed", parent)
                now = state_in(dfd, name)
                if now.same(c.after) and (c.after.kind != FILE or now.uid == c.after.uid or c.after.uid is None):
                    continue
                done.append((dfd, name, now))
                put_in(dfd, name, c.after)
            for d in plan.rmdirs:
                current = d
                _rmdir(d, roots.base)
        except BaseException as e:
            for dfd, name, state in reversed(done):
                with contextlib.suppress(OSError):
                    put_in(dfd, name, state)
            for d in reversed(created):
                with contextlib.suppress(OSError):
                    _rmdir(d, roots.base)
            if isinstance(e, safedir.NotReal):
                raise CommdiagError(f"{roots.shown(e.path)}: is {e.what} (it was not when the plan was made); "
                                    "commdiag writes only through real directories; nothing was changed") from None
            if isinstance(e, Swapped):
                raise CommdiagError(f"{roots.shown(e.filename)}: {e.strerror} (moved or replaced meanwhile); "
                                    "nothing was changed") from None
            if isinstance(e, PermissionError):
                raise permission_error(roots.shown(e.filename or current), roots) from None
            if isinstance(e, OSError):
                hint = " (read-only file system)" if e.errno == errno.EROFS else ""
                raise CommdiagError(f"{roots.shown(e.filename or current)}: {e.strerror}{hint}; "
                                    "nothing was changed") from None
            raise
        ids = {path: list(safedir.identity(fd)) for path, fd in dirs.fds.items()}
    finally:
        dirs.close()
    return created, ids


def commit_records(sdir: str, plan: Plan, state_created: list[str], roots: Roots | None = None) -> None:
    """Store the plan's records in the manifest (under the lock); remove the state when empty."""
    roots = roots or Roots()
    if not plan.records and not plan.drop_keys and os.path.lexists(os.path.join(sdir, MANIFEST_NAME)):
        return  # nothing to record (a failed install): an existing manifest is left exactly as it is
    manifest = load_manifest(sdir, roots)
    keys = {r["key"] for r in plan.records} | set(plan.drop_keys)
    manifest["installs"] = [r for r in manifest["installs"] if r["key"] not in keys] + list(plan.records)
    manifest["state_dirs_created"] = manifest.get("state_dirs_created", []) + [
        d for d in state_created if d not in manifest.get("state_dirs_created", [])]
    if manifest["installs"]:
        _save_manifest(sdir, manifest, roots)
        return
    sfd = _open_state(sdir, roots)
    if sfd is not None:
        try:
            dfd = _saved_dir(sfd, sdir, create=False)
            if dfd is not None:
                for name in os.listdir(dfd):
                    if _SHA256.fullmatch(name):
                        safedir.unlink_in(dfd, name)
                os.close(dfd)
                with contextlib.suppress(OSError):
                    os.rmdir(SAVED_DIR, dir_fd=sfd)
            for name in (MANIFEST_NAME, "lock"):
                safedir.unlink_in(sfd, name)
        finally:
            os.close(sfd)
    for d in sorted(manifest["state_dirs_created"], key=lambda p: -p.count("/")):
        with contextlib.suppress(OSError):
            _rmdir(d, roots.base)
