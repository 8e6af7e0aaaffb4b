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
"""

from __future__ import annotations

import base64
import hashlib
import posixpath
from dataclasses import dataclass, field, replace

from . import hooktext
from ..errors import CommdiagError

ABSENT, FILE, SYMLINK, DIR, OTHER = "absent", "file", "symlink", "dir", "other"
FILE_MODE = 0o644  # what commdiag writes: readable by the service user, writable by root only
DIR_MODE = 0o755
OWNED, BLOCK, CACHE = "owned", "block", "cache"  # CACHE: stale bytecode of a module commdiag changed


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
        old = _record_files(records.get(t.key))
        files: list[dict] = []
        wanted = {d.path for d in t.desired}
        for d in t.desired:
            cur = snapshot.get(d.path, FileState(ABSENT))
            if cur.kind not in (ABSENT, FILE, SYMLINK) or (cur.kind == SYMLINK and d.role == BLOCK):
                what = {SYMLINK: "a symbolic link", DIR: "a directory", OTHER: "a device, FIFO or socket"}.get(
                    cur.kind, cur.kind)
                raise CommdiagError(f"{d.shown}: is {what}, not a regular file; commdiag will not write there")
            prev = old.get(d.path)
            if prev is not None and _unchanged_since(cur, prev):
                original = FileState.from_json(prev["before"])
                base = original
            else:
                original = cur
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
                    original = FileState(ABSENT)
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
            if not cur.same(after):
                changes.append(Change(d.path, d.shown, cur, after, why))
            entry = {"path": d.path, "shown": d.shown, "role": d.role, "import_dir": d.import_dir,
                     "module": d.module, "before": original.to_json(), "installed": _installed(after)}
            if d.import_dir:
                # no __pycache__ before commdiag's first install: Python made it for commdiag's module,
                # so uninstall removes it again when it is empty
                cache = snapshot.get(posixpath.join(d.import_dir, "__pycache__"))
                entry["pycache_absent"] = (prev.get("pycache_absent", False) if prev is not None
                                           else cache is not None and cache.kind == ABSENT)
            files.append(entry)
            if d.import_dir and d.module:
                # Stale bytecode: the import system trusts a .pyc whose recorded source mtime and
                # size match; an edit within the same second of equal size would be missed.
                # A .pyc commdiag removes is recorded, so --uninstall puts it back with the source.
                old_cache = {p: f for p, f in old.items() if f["role"] == CACHE and f.get("module") == d.module}
                for pyc in sorted(set(bytecode_paths(snapshot, d.import_dir, d.module)) | set(old_cache)):
                    now = snapshot.get(pyc, FileState(ABSENT))
                    if pyc not in old_cache and cur.same(after):
                        continue  # bytecode of the unchanged source: valid, left alone
                    original_pyc = FileState.from_json(old_cache[pyc]["before"]) if pyc in old_cache else now
                    if now.kind != ABSENT and not cur.same(after):
                        changes.append(Change(pyc, pyc, now, FileState(ABSENT), "stale bytecode"))
                    files.append({"path": pyc, "shown": pyc, "role": CACHE, "module": d.module,
                                  "before": original_pyc.to_json(), "installed": {"kind": ABSENT}})
                    wanted.add(pyc)
            for parent in _missing_parents(d.path, snapshot):
                if parent not in mkdirs:
                    mkdirs.append(parent)
        # Files the earlier install of this key had and this one does not want: put them back.
        for path, f in old.items():
            if path in wanted:
                continue
            cur = snapshot.get(path, FileState(ABSENT))
            back = FileState.from_json(f["before"])
            if f["role"] == CACHE or _unchanged_since(cur, f):
                if not cur.same(back):
                    changes.append(Change(path, f["shown"], cur, back, "restore (no longer installed here)"))
            elif f["role"] == BLOCK and hooktext.has_any_block(cur.text()):
                changes.append(Change(path, f["shown"], cur, new_file(hooktext.strip_any_blocks(cur.text()), like=cur),
                                      "remove commdiag block (file changed since install)"))
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


def plan_uninstall(records: list[dict], snapshot: dict[str, FileState], *, force: bool) -> Plan:
    """Changes that put every file of ``records`` back as it was before commdiag touched it."""
    changes: list[Change] = []
    warnings: list[str] = []
    notes: list[str] = []
    rmdirs: list[str] = []
    for r in records:
        recorded = _record_files(r)
        for f in r["files"]:
            path = f["path"]
            cur = snapshot.get(path, FileState(ABSENT))
            back = FileState.from_json(f["before"])
            if cur.same(back) and f["role"] != CACHE:
                continue
            if f["role"] == CACHE or _unchanged_since(cur, f) or force:
                if not cur.same(back):
                    changes.append(Change(path, f["shown"], cur, back, "restore"))
            elif f["role"] == BLOCK and cur.kind == FILE and hooktext.has_any_block(cur.text()):
                changes.append(Change(path, f["shown"], cur, new_file(hooktext.strip_any_blocks(cur.text()), like=cur),
                                      "remove commdiag block only"))
                notes.append(f"{f['shown']}: changed since install; removed only commdiag's block, kept the rest")
            else:
                warnings.append(f"{f['shown']}: changed since commdiag installed it; left as it is "
                                "(--force restores the original)")
            if f.get("import_dir") and f.get("module") and f["role"] != CACHE:
                for pyc in bytecode_paths(snapshot, f["import_dir"], f["module"]):
                    if pyc not in recorded:  # written by a run since install: stale after the restore
                        changes.append(Change(pyc, pyc, snapshot[pyc], FileState(ABSENT), "stale bytecode"))
        for f in r["files"]:
            if f.get("pycache_absent") and f.get("import_dir") and f["role"] != CACHE:
                cache = posixpath.join(f["import_dir"], "__pycache__")
                if cache not in rmdirs:
                    rmdirs.append(cache)  # removed only if empty (apply ignores ENOTEMPTY)
        for d in reversed(r.get("dirs_created", [])):
            if d not in rmdirs:
                rmdirs.append(d)
    rmdirs.sort(key=lambda p: -p.count("/"))
    return Plan("uninstall", tuple(changes), (), tuple(rmdirs), (), tuple(r["key"] for r in records),
                tuple(notes), tuple(warnings), ())
