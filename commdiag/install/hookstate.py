"""The file-system side of install-hook: staged roots, snapshots, the manifest, the lock, applying a plan.

What it writes:

* the files of a plan (hookplan.py), each atomically: a temporary file in the
  same directory, fsync, ``os.replace``, fsync of the directory;
* the manifest ``STATE/installs.json`` (format ``commdiag-hook-manifest``,
  version 1): one record per install with every changed path's original state,
  so ``--uninstall`` restores bytes, permission bits, owner, mtime and symlinks;
* ``STATE/lock``: held (flock) while a plan is made and applied, so two installs
  cannot interleave.

STATE is ``ROOT/var/lib/commdiag`` with ``--root``, ``/var/lib/commdiag`` for
root, else ``$XDG_STATE_HOME/commdiag`` (``~/.local/state/commdiag``).  When
the last install is removed the manifest, the lock and the directories commdiag
created for them are removed too, so an uninstall leaves the tree as it was.

``--root DIR``: paths of the target system (``/etc/...``, ``/usr/...``) are
written under DIR instead; a path already inside DIR (a venv created there) is
used as it is.  Symlinks inside DIR are followed as a chroot would (an absolute
link target is read relative to DIR).

Format history of installs.json: 1  first version.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import json
import os
import posixpath
import re
import stat
import tempfile
from dataclasses import dataclass

from ..errors import CommdiagError, brief
from .hookplan import ABSENT, DIR, DIR_MODE, FILE, OTHER, SYMLINK, FileState, Plan

MANIFEST_FORMAT = "commdiag-hook-manifest"
MANIFEST_VERSION = 1
MANIFEST_NAME = "installs.json"


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

    def resolve(self, path: str) -> str:
        """Follow symlinks of a staged path, reading absolute link targets inside the root."""
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


def state_dir(roots: Roots) -> str:
    if roots.root is not None:
        return roots.staged("/var/lib/commdiag")
    if os.geteuid() == 0:
        return "/var/lib/commdiag"
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "commdiag")


def read_state(path: str) -> FileState:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return FileState(ABSENT)
    except NotADirectoryError:
        return FileState(ABSENT)
    if stat.S_ISLNK(st.st_mode):
        return FileState(SYMLINK, link=os.readlink(path), uid=st.st_uid, gid=st.st_gid)
    if stat.S_ISDIR(st.st_mode):
        return FileState(DIR, mode=stat.S_IMODE(st.st_mode))
    if not stat.S_ISREG(st.st_mode):
        return FileState(OTHER)
    with open(path, "rb") as f:
        data = f.read()
    return FileState(FILE, data, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns)


def snapshot(paths, bytecode_dirs=()) -> dict[str, FileState]:
    """Current state of ``paths``, of all their ancestors, and of every .pyc in ``bytecode_dirs``."""
    out: dict[str, FileState] = {}
    for p in paths:
        out[p] = read_state(p)
        d = posixpath.dirname(p)
        while d and d != "/" and d not in out:
            out[d] = read_state(d)
            d = posixpath.dirname(d)
    for d in bytecode_dirs:
        cache = posixpath.join(d, "__pycache__")
        out[cache] = read_state(cache)  # whether Python had made it yet (uninstall removes one it made later)
        with contextlib.suppress(OSError):
            for name in os.listdir(cache):
                if name.endswith(".pyc"):
                    out[posixpath.join(cache, name)] = read_state(posixpath.join(cache, name))
    return out


# --- the manifest ----------------------------------------------------------------------------

def _empty_manifest() -> dict:
    return {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "installs": [], "state_dirs_created": []}


def load_manifest(sdir: str, roots: Roots | None = None) -> dict:
    """The manifest, validated: it is data read back from disk, and uninstall writes wherever it
    says.  Refused: a manifest that is not a regular file (a FIFO would hang every install), a
    symlink, one writable by others or owned by another user, and any entry whose paths are not
    where commdiag writes (see ``check_manifest``)."""
    path = os.path.join(sdir, MANIFEST_NAME)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
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
            raise CommdiagError(f"{path}: the install manifest belongs to uid {st.st_uid}, not to you or root; "
                                "commdiag will not act on it")
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
        raise CommdiagError(f"{path}: version: {brief(version)} is not a manifest version (1..{MANIFEST_VERSION})")
    if version > MANIFEST_VERSION:
        raise CommdiagError(f"{path}: version: {version} is newer than this commdiag understands "
                            f"(<= {MANIFEST_VERSION}); upgrade commdiag to change or remove these installs")
    check_manifest(m, path, sdir, roots)
    m.setdefault("state_dirs_created", [])
    return m


# What commdiag writes, by role (hook.py): a manifest entry naming anything else is refused.
OWNED_NAMES = ("commdiag_nccl_hook.py", "commdiag-nccl.pth", "commdiag-nccl.conf")
TUNER_NAMES = ("libnccl-tuner-commdiag.so", "commdiag-tuner-rules.txt")  # hooktuner.FILE_NAMES, in STATE/tuner/
BLOCK_NAMES = ("sitecustomize.py", "nccl.conf", ".nccl.conf")
_KINDS = (ABSENT, FILE, SYMLINK, DIR, OTHER)
_UNSAFE = re.compile("[\x00-\x1f\x7f]")


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
            except (ValueError, TypeError, KeyError):
                raise bad(f"{fw}.before", "is not a file state") from None
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


def _save_manifest(sdir: str, manifest: dict) -> None:
    write_atomic(os.path.join(sdir, MANIFEST_NAME),
                 FileState(FILE, (json.dumps(manifest, indent=1) + "\n").encode(), 0o644))


@contextlib.contextmanager
def locked(sdir: str):
    """Exclusive lock on STATE/lock; yields the list of state directories this call created."""
    created: list[str] = []
    path = os.path.join(sdir, "lock")
    while True:
        try:
            created += _makedirs(sdir)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            continue  # the last uninstall removed the state directory in between
        except PermissionError:
            raise CommdiagError(f"{sdir}: permission denied; commdiag keeps its install manifest there, which "
                                "needs root (run with sudo), or stage with --root DIR") from None
        except OSError as e:  # a read-only file system, no space, ...: not a matter of root
            raise CommdiagError(f"{e.filename or sdir}: {e.strerror}; commdiag keeps its install manifest in "
                                f"{sdir} and cannot write there") from None
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the last uninstall removed the lock file while we waited: take the new one
    try:
        yield created
    finally:
        os.close(fd)


# --- applying a plan ---------------------------------------------------------------------------

def _fsync_dir(d: str) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, state: FileState) -> None:
    """Put ``state`` (a file or a symlink) at ``path``: temp file in the same directory, fsync, replace."""
    d, name = posixpath.split(path)
    if state.kind == SYMLINK:
        tmp = posixpath.join(d, f".{name}.commdiag-{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        os.symlink(state.link, tmp)
        if os.geteuid() == 0 and state.uid is not None:
            os.lchown(tmp, state.uid, state.gid)
    else:
        fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{name}.commdiag-", suffix=".tmp")
        try:
            view = memoryview(state.data or b"")
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, state.mode if state.mode is not None else 0o644)
            if os.geteuid() == 0 and state.uid is not None:
                os.fchown(fd, state.uid, state.gid)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        if state.mtime_ns is not None:
            os.utime(tmp, ns=(state.mtime_ns, state.mtime_ns))
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(d)


def put(path: str, state: FileState) -> None:
    if state.kind == ABSENT:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            _fsync_dir(posixpath.dirname(path))
    else:
        write_atomic(path, state)


def _makedirs(d: str) -> list[str]:
    """Create ``d`` and missing parents with mode 0755; return the ones created, top-down."""
    missing = []
    while d and not os.path.isdir(d):
        missing.append(d)
        d = posixpath.dirname(d)
    created = []
    for m in reversed(missing):
        try:
            os.mkdir(m, DIR_MODE)
        except FileExistsError:
            continue  # another install created it in between (the state directory is made before the lock)
        os.chmod(m, DIR_MODE)  # not subject to the umask
        created.append(m)
    return created


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


def apply(plan: Plan, roots: Roots) -> list[str]:
    """Apply ``plan`` (idempotent: paths already in their final state are skipped).

    On any error the paths changed so far are put back and the error is raised;
    returns the directories created.
    """
    preflight(plan, roots)
    done: list[tuple[str, FileState]] = []
    created: list[str] = []
    current = "?"  # the path being changed, for an OSError that names none (ENOSPC on write)
    try:
        for d in plan.mkdirs:
            current = d
            created += _makedirs(d)
        for c in plan.changes:
            current = c.path
            now = read_state(c.path)
            if now.same(c.after) and (c.after.kind != FILE or now.uid == c.after.uid or c.after.uid is None):
                continue
            done.append((c.path, now))
            put(c.path, c.after)
        for d in plan.rmdirs:
            with contextlib.suppress(FileNotFoundError):
                try:
                    os.rmdir(d)
                except OSError as e:
                    if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                        raise
    except BaseException as e:
        for path, state in reversed(done):
            with contextlib.suppress(OSError):
                put(path, state)
        for d in reversed(created):
            with contextlib.suppress(OSError):
                os.rmdir(d)
        if isinstance(e, PermissionError):
            raise permission_error(roots.shown(e.filename or current), roots) from None
        if isinstance(e, OSError):
            hint = " (read-only file system)" if e.errno == errno.EROFS else ""
            raise CommdiagError(f"{roots.shown(e.filename or current)}: {e.strerror}{hint}; "
                                "nothing was changed") from None
        raise
    return created


def commit_records(sdir: str, plan: Plan, state_created: list[str]) -> None:
    """Store the plan's records in the manifest (under the lock); remove the state when empty."""
    if not plan.records and not plan.drop_keys and os.path.lexists(os.path.join(sdir, MANIFEST_NAME)):
        return  # nothing to record (a failed install): an existing manifest is left exactly as it is
    manifest = load_manifest(sdir)
    keys = {r["key"] for r in plan.records} | set(plan.drop_keys)
    manifest["installs"] = [r for r in manifest["installs"] if r["key"] not in keys] + list(plan.records)
    manifest["state_dirs_created"] = manifest.get("state_dirs_created", []) + [
        d for d in state_created if d not in manifest.get("state_dirs_created", [])]
    if manifest["installs"]:
        _save_manifest(sdir, manifest)
        return
    for name in (MANIFEST_NAME, "lock"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(sdir, name))
    for d in sorted(manifest["state_dirs_created"], key=lambda p: -p.count("/")):
        with contextlib.suppress(OSError):
            os.rmdir(d)
