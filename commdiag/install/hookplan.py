"""The install plan: which file gets which bytes, and the exact undo (pure; no I/O).

``install-hook`` works in three steps (STYLE principle 9): survey the file
system (hookstate.py), make a plan here from the survey, apply it (hookstate.py).
A plan is a list of ``Change``s, each the state a path has now (``before``) and
the state it will have (``after``), plus the manifest records that let
``--uninstall`` put every path back exactly: bytes, permission bits, owner,
mtime, symlinks and the directories commdiag created.

Files have one of two roles:

* ``owned``: commdiag's own file (the .pth line, the hook module, a systemd
  drop-in or env file).  An existing file of the same name that is not
  commdiag's is never overwritten without ``--force``.
* ``block``: a marked block inside a file that may be another party's
  (``sitecustomize.py``, ``nccl.conf``).  Everything outside the markers is
  kept byte for byte; a file that did not exist is created with just the block.

Reinstalling over an earlier install of the same target keeps the earlier
install's record of the original state, so one ``--uninstall`` always returns to
what was there before commdiag first touched the file.

Every file entry records the identity ``(st_dev, st_ino)`` of the directory it was
written in (and of the directory its module is imported from).  Uninstall changes a
file only in that very directory: a directory that became a symbolic link, or another
directory, since is refused, and the entry is kept.  Bytecode is never recorded or
put back: a stale ``.pyc`` of a module commdiag changes is removed, and Python makes a
new one.
"""

from __future__ import annotations

import base64
import hashlib
import posixpath
from dataclasses import dataclass, field, replace

from . import hooktext
from ..errors import CommdiagError

ABSENT, FILE, SYMLINK, DIR, OTHER = "absent", "file", "symlink", "dir", "other"
BLOCKED = "blocked"  # a survey's answer only: the path is reached through a link or a non-directory
FILE_MODE = 0o644  # what commdiag writes: readable by the service user, writable by root only
DIR_MODE = 0o755
OWNED, BLOCK = "owned", "block"
CACHE = "cache"  # manifest version 1 only: a recorded .pyc (never put back any more)


@dataclass(frozen=True)
class FileState:
    """What is at one path: nothing, a regular file (bytes, mode, owner, mtime), a symlink, a directory."""

    kind: str
    data: bytes | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    mtime_ns: int | None = None
    link: str | None = None
    dev: int | None = None  # a directory's identity, with ino (surveys only; not in the manifest)
    ino: int | None = None

    @property
    def identity(self) -> list[int] | None:
        return [self.dev, self.ino] if self.kind == DIR and self.ino is not None else None

    @property
    def sha256(self) -> str | None:
        return hashlib.sha256(self.data).hexdigest() if self.data is not None else None

    def same(self, other: "FileState") -> bool:
        """Same content: kind, bytes, permission bits, link target (owner and mtime aside)."""
        if self.kind != other.kind:
            return False
        if self.kind == FILE:
            return self.data == other.data and self.mode == other.mode
        if self.kind == SYMLINK:
            return self.link == other.link
        return True

    @property
    def binary(self) -> bool:
        """Bytes no terminal should be shown (a compiled library): a NUL, or not UTF-8."""
        if self.data is None:
            return False
        try:
            self.data.decode("utf-8")
        except UnicodeDecodeError:
            return True
        return b"\0" in self.data

    def text(self) -> str:
        return (self.data or b"").decode("utf-8", errors="surrogateescape")

    def to_json(self) -> dict:
        d = {"kind": self.kind}
        if self.data is not None:
            d["data_b64"] = base64.b64encode(self.data).decode()
            d["sha256"] = self.sha256
        for k in ("mode", "uid", "gid", "mtime_ns", "link"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "FileState":
        data = base64.b64decode(d["data_b64"]) if "data_b64" in d else None
        return cls(d["kind"], data, d.get("mode"), d.get("uid"), d.get("gid"), d.get("mtime_ns"), d.get("link"))


def new_file(text: str | bytes, mode: int = FILE_MODE, like: FileState | None = None) -> FileState:
    """A file state to write: ``like``'s mode and owner when editing an existing file."""
    data = text.encode("utf-8", errors="surrogateescape") if isinstance(text, str) else text
    if like is not None and like.kind == FILE:
        return FileState(FILE, data, like.mode, like.uid, like.gid)
    return FileState(FILE, data, mode)


@dataclass(frozen=True)
class Desired:
    """One file an install wants: its role and text (the whole file, or the block)."""

    path: str  # where it is written (the staged path under --root)
    shown: str  # the path as the target system sees it
    role: str
    text: str | bytes  # bytes: an owned binary file (the tuner library), written as it is
    at_top: bool = False  # block role: prepend instead of append (NCCL's conf: first assignment wins)
    import_dir: str | None = None  # .py files: the sys.path entry it is imported from (bytecode lives there)
    module: str | None = None
    mode: int = FILE_MODE  # owned role: the new file's permission bits


@dataclass(frozen=True)
class Target:
    """One thing to install: the python hook, a systemd unit's drop-in, or an NCCL config file."""

    key: str  # "python:PREFIX", "systemd:UNIT", "nccl-conf:PATH": one install per key
    kind: str
    method: str
    desired: tuple[Desired, ...]
    info: dict = field(default_factory=dict)  # shown in status: target, settings, source, ...
    notes: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()


@dataclass(frozen=True)
class Change:
    path: str
    shown: str
    before: FileState
    after: FileState
    why: str
    dir_id: list[int] | None = None  # the directory (dev, ino) the change must be made in; None: new


@dataclass(frozen=True)
class Plan:
    action: str  # "install" | "uninstall"
    changes: tuple[Change, ...]
    mkdirs: tuple[str, ...]  # directories to create, top-down (install)
    rmdirs: tuple[str, ...]  # directories to remove if empty, bottom-up (uninstall)
    records: tuple[dict, ...]  # install records to store (install)
    drop_keys: tuple[str, ...]  # install records to drop (uninstall)
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()  # files left alone for safety; their entries stay in the manifest

    @property
    def empty(self) -> bool:
        return not self.changes and not self.mkdirs and not self.rmdirs


def bytecode_paths(snapshot: dict[str, FileState], import_dir: str, module: str) -> list[str]:
    """Cached bytecode of ``module`` imported from ``import_dir`` that exists now."""
    prefix = posixpath.join(import_dir, "__pycache__", module + ".")
    return sorted(p for p, s in snapshot.items() if p.startswith(prefix) and p.endswith(".pyc") and s.kind == FILE)


def _is_ours(state: FileState) -> bool:
    text = state.text()
    return state.kind == FILE and (hooktext.BEGIN in text or text == hooktext.PTH_LINE
                                   or text.startswith("# Managed by commdiag"))


def _record_files(record: dict | None) -> dict[str, dict]:
    return {f["path"]: f for f in record["files"]} if record else {}


def _unchanged_since(cur: FileState, f: dict) -> bool:
    """Is ``cur`` what commdiag left at this path (``f`` a manifest file entry)?"""
    inst = f["installed"]
    if inst["kind"] != cur.kind:
        return False
    if cur.kind == FILE:
        return inst.get("sha256") == cur.sha256 and inst.get("mode") == cur.mode
    return True


def _dir_id(snapshot: dict[str, FileState], d: str | None) -> list[int] | None:
    """The surveyed identity of directory ``d`` (None: it does not exist, or is no directory)."""
    return snapshot.get(d, FileState(ABSENT)).identity if d else None


def _same_dir(f: dict, snapshot: dict[str, FileState]) -> bool:
    """Is the directory of manifest entry ``f`` still the one it was written in?  (An entry of
    manifest version 1 has no identity: accepted here, judged by uninstall's ownership rule.)"""
    recorded = f.get("dir_id")
    return recorded is None or recorded == _dir_id(snapshot, posixpath.dirname(f["path"]))


def plan_install(targets: list[Target], snapshot: dict[str, FileState], records: dict[str, dict],
                 *, force: bool, meta: dict) -> Plan:
    """Changes that bring every target's files to their desired text, and the new records.

    ``records``: the manifest's current install records by key (an earlier install of the
    same key is replaced; its files that the new install no longer wants are restored).
    """
    changes: list[Change] = []
    new_records: list[dict] = []
    notes: list[str] = []
    warnings: list[str] = []
    commands: list[str] = []
    mkdirs: list[str] = []
    for t in targets:
        old = {p: f for p, f in _record_files(records.get(t.key)).items() if f["role"] != CACHE}
        files: list[dict] = []
        wanted = {d.path for d in t.desired}
        for d in t.desired:
            cur = snapshot.get(d.path, FileState(ABSENT))
            if cur.kind == BLOCKED:
                raise CommdiagError(f"{d.shown}: its directory is reached through a symbolic link or a "
                                    "non-directory now; commdiag will not write there")
            if cur.kind not in (ABSENT, FILE, SYMLINK) or (cur.kind == SYMLINK and d.role == BLOCK):
                what = {SYMLINK: "a symbolic link", DIR: "a directory", OTHER: "a device, FIFO or socket"}.get(
                    cur.kind, cur.kind)
                raise CommdiagError(f"{d.shown}: is {what}, not a regular file; commdiag will not write there")
            prev = old.get(d.path)
            if prev is not None and not _same_dir(prev, snapshot):
                notes.append(f"{d.shown}: its directory is not the one of the last install; installing afresh")
                prev = None
            if prev is not None and _unchanged_since(cur, prev):
                before = prev["before"]  # as recorded: what was there before commdiag first came
                base = FileState.from_json(before)
                if base.kind == FILE and base.data is None:
                    base = cur  # its saved copy is unreadable: the file as it is (the block is replaced)
            else:
                before = cur.to_json()
                base = cur
                if prev is not None and d.role == BLOCK:
                    notes.append(f"{d.shown}: changed since commdiag's last install; the changes are kept")
            if d.role == OWNED:
                if base.kind != ABSENT and not _is_ours(base):
                    if not force:
                        raise CommdiagError(
                            f"{d.shown}: exists and is not commdiag's; move it away or use --force "
                            "(it is saved and --uninstall puts it back)")
                    warnings.append(f"{d.shown}: replacing a file that is not commdiag's (--force); saved for --uninstall")
                elif base.kind != ABSENT and prev is None:
                    # commdiag's own file without a manifest entry (manifest lost): uninstall removes it.
                    before = FileState(ABSENT).to_json()
                after = new_file(d.text, d.mode)
            else:
                base_text = base.text() if base.kind == FILE else ""
                after = new_file(hooktext.add_block(base_text, d.text, at_top=d.at_top),
                                 like=base if base.kind == FILE else None)
                if cur.kind == FILE:  # keep the owner of the file being edited
                    after = replace(after, uid=cur.uid, gid=cur.gid)
            if d.path.endswith(".py"):
                check_compiles(after.data, d.shown, d.text if isinstance(d.text, str) else None)
            why = {OWNED: "commdiag's file", BLOCK: "commdiag block"}[d.role]
            parent_id = _dir_id(snapshot, posixpath.dirname(d.path))
            if not cur.same(after):
                changes.append(Change(d.path, d.shown, cur, after, why, parent_id))
            entry = {"path": d.path, "shown": d.shown, "role": d.role, "import_dir": d.import_dir,
                     "module": d.module, "before": before, "installed": _installed(after),
                     "dir_id": parent_id}
            if d.import_dir:
                entry["import_dir_id"] = _dir_id(snapshot, d.import_dir)
                # no __pycache__ before commdiag's first install: Python made it for commdiag's module,
                # so uninstall removes it again when it is empty
                cache = snapshot.get(posixpath.join(d.import_dir, "__pycache__"))
                entry["pycache_absent"] = (prev.get("pycache_absent", False) if prev is not None
                                           else cache is not None and cache.kind == ABSENT)
            files.append(entry)
            if d.import_dir and d.module and not cur.same(after):
                # Stale bytecode: the import system trusts a .pyc whose recorded source mtime and
                # size match; an edit within the same second of equal size would be missed.  It is
                # removed, never recorded: Python makes a new one from the source.
                cache_id = _dir_id(snapshot, posixpath.join(d.import_dir, "__pycache__"))
                for pyc in bytecode_paths(snapshot, d.import_dir, d.module):
                    changes.append(Change(pyc, pyc, snapshot[pyc], FileState(ABSENT), "stale bytecode", cache_id))
            for parent in _missing_parents(d.path, snapshot):
                if parent not in mkdirs:
                    mkdirs.append(parent)
        # Files the earlier install of this key had and this one does not want: put them back.
        for path, f in old.items():
            if path in wanted:
                continue
            cur = snapshot.get(path, FileState(ABSENT))
            back = FileState.from_json(f["before"])
            refusal = _refusal(f, snapshot, back)
            if refusal:
                warnings.append(f"{f['shown']}: {refusal}; left as it is")
            elif _unchanged_since(cur, f):
                if not cur.same(back):
                    changes.append(Change(path, f["shown"], cur, back, "restore (no longer installed here)",
                                          f.get("dir_id")))
            elif f["role"] == BLOCK and hooktext.has_any_block(cur.text()):
                changes.append(Change(path, f["shown"], cur, new_file(hooktext.strip_any_blocks(cur.text()), like=cur),
                                      "remove commdiag block (file changed since install)", f.get("dir_id")))
            else:
                warnings.append(f"{f['shown']}: changed since commdiag installed it; left as it is")
        old_dirs = records[t.key].get("dirs_created", []) if t.key in records else []
        record = {"key": t.key, "kind": t.kind, "method": t.method, **t.info, **meta,
                  "files": files,
                  "dirs_created": old_dirs + [p for p in mkdirs if p not in old_dirs and _under_any(p, wanted)],
                  "notes": list(t.notes), "commands": list(t.commands)}
        new_records.append(record)
        notes += t.notes
        commands += t.commands
    return Plan("install", tuple(changes), tuple(mkdirs), (), tuple(new_records), (),
                tuple(notes), tuple(warnings), tuple(commands))


def check_compiles(data: bytes, shown: str, block: str | None = None) -> None:
    """The Python file as it will be written must compile, and read under its own coding
    declaration, commdiag's ``block`` must be exactly the text commdiag made: a block that would
    turn into something else, or break the file, is refused before anything is written."""
    import io
    import tokenize

    try:
        compile(data, shown, "exec", dont_inherit=True)
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding)
    except (SyntaxError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        raise CommdiagError(f"{shown}: would not compile with commdiag's block{where}; nothing was "
                            "written (use --method pth)") from None
    if block is not None and block not in text:
        raise CommdiagError(f"{shown}: under its coding declaration ({encoding}) commdiag's block would "
                            "read differently; nothing was written (use --method pth)")


def _installed(after: FileState) -> dict:
    return {"kind": after.kind, "sha256": after.sha256, "mode": after.mode} if after.kind == FILE else {"kind": after.kind}


def _under_any(d: str, paths) -> bool:
    return any(p.startswith(d.rstrip("/") + "/") for p in paths)


def _missing_parents(path: str, snapshot: dict[str, FileState]) -> list[str]:
    """Ancestors of ``path`` that do not exist, top-down (the snapshot holds every ancestor)."""
    out = []
    d = posixpath.dirname(path)
    while d and d != "/" and snapshot.get(d, FileState(DIR)).kind == ABSENT:
        out.append(d)
        d = posixpath.dirname(d)
    return out[::-1]


def _refusal(f: dict, snapshot: dict[str, FileState], back: FileState,
             trusted_uids: frozenset[int] = frozenset({0})) -> str | None:
    """Why the file of manifest entry ``f`` must not be changed now (None: it may).

    Its directory must be the very one it was written in (the recorded ``dir_id``); an entry of
    manifest version 1 has none, and is accepted only where every directory above it belongs to
    ``trusted_uids`` and no one else can write there (then no one else could have swapped it)."""
    parent = posixpath.dirname(f["path"])
    pst = snapshot.get(parent, FileState(DIR))  # a survey holds every directory; a hand-made plan may not
    if pst.kind in (SYMLINK, BLOCKED, OTHER):
        what = {SYMLINK: "a symbolic link"}.get(pst.kind, "reached through a link, or not a directory")
        return f"not changed: its directory {parent} is {what} now (it was a directory at install)"
    if pst.kind == ABSENT:
        return None  # nothing to put back into: the caller notes a lost original
    recorded = f.get("dir_id")
    if recorded is not None and recorded != pst.identity:
        return (f"not changed: {parent} is another directory than the one commdiag installed into "
                "(moved or replaced since)")
    if recorded is None:
        d = parent
        while d in snapshot:
            st = snapshot[d]
            if st.uid not in trusted_uids or (st.mode or 0) & 0o022 and not (st.mode or 0) & 0o1000:
                return (f"not changed: recorded by an older commdiag without the identity of {parent}, "
                        f"and {d} can be changed by another user (owner uid {st.uid}, mode "
                        f"{(st.mode or 0):04o}): it may have been swapped")
            d = posixpath.dirname(d)
    if back.kind == FILE and back.data is None:
        return f"not restored: the saved copy of its original (sha256 {f['before'].get('sha256')}) is missing"
    return None


def plan_uninstall(records: list[dict], snapshot: dict[str, FileState], *, force: bool,
                   others: list[dict] = (), trusted_uids: frozenset[int] = frozenset({0})) -> Plan:
    """Changes that put every file of ``records`` back as it was before commdiag touched it.

    Files another install (``others``, which stay) also names are left to it.  A file that must
    not be changed (``_refusal``) is left, and its entry kept in the returned records."""
    changes: list[Change] = []
    warnings: list[str] = []
    notes: list[str] = []
    refused: list[str] = []
    rmdirs: list[str] = []
    kept: list[dict] = []
    shared = {f["path"] for r in others for f in r["files"]}
    for r in records:
        keep = []
        for f in r["files"]:
            path = f["path"]
            if f["role"] == CACHE:
                continue  # recorded by manifest version 1: bytecode is never put back
            if path in shared:
                notes.append(f"{f['shown']}: also installed by another install; left to it")
                continue
            cur = snapshot.get(path, FileState(ABSENT))
            back = FileState.from_json(f["before"])
            why = _refusal(f, snapshot, back, trusted_uids)
            if why:
                refused.append(f"{f['shown']}: {why}")
                keep.append(f)
                continue
            if snapshot.get(posixpath.dirname(path), FileState(DIR)).kind == ABSENT:
                if back.kind != ABSENT:
                    warnings.append(f"{f['shown']}: its directory is gone; its original is not restored")
                continue
            dir_id = _dir_id(snapshot, posixpath.dirname(path))
            if cur.same(back):
                pass
            elif _unchanged_since(cur, f) or force:
                changes.append(Change(path, f["shown"], cur, back, "restore", dir_id))
            elif f["role"] == BLOCK and cur.kind == FILE and hooktext.has_any_block(cur.text()):
                changes.append(Change(path, f["shown"], cur, new_file(hooktext.strip_any_blocks(cur.text()), like=cur),
                                      "remove commdiag block only", dir_id))
                notes.append(f"{f['shown']}: changed since install; removed only commdiag's block, kept the rest")
            else:
                warnings.append(f"{f['shown']}: changed since commdiag installed it; left as it is "
                                "(--force restores the original)")
            imp = f.get("import_dir")
            if imp and f.get("module") and f.get("import_dir_id", _dir_id(snapshot, imp)) == _dir_id(snapshot, imp):
                cache = posixpath.join(imp, "__pycache__")
                for pyc in bytecode_paths(snapshot, imp, f["module"]):  # stale once the source is back
                    changes.append(Change(pyc, pyc, snapshot[pyc], FileState(ABSENT), "stale bytecode",
                                          _dir_id(snapshot, cache)))
                if f.get("pycache_absent") and cache not in rmdirs:
                    rmdirs.append(cache)  # removed only if empty (apply ignores ENOTEMPTY)
        if keep:
            kept.append({**r, "files": keep})
        else:
            for d in reversed(r.get("dirs_created", [])):
                if d not in rmdirs:
                    rmdirs.append(d)
    rmdirs.sort(key=lambda p: -p.count("/"))
    return Plan("uninstall", tuple(changes), (), tuple(rmdirs), tuple(kept), tuple(r["key"] for r in records),
                tuple(notes), tuple(warnings), (), tuple(refused))
