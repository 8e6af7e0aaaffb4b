"""``install-hook --tuner RUN_DIR|RULES``: commdiag's tuner plugin and a rules file, installed in a
stable place, named by NCCL_TUNER_PLUGIN and NCCL_TUNER_CONFIG_FILE.

Owns: reading and checking the rules (a rules file, format 1, read once and parsed exactly as
the plugin reads it; or the rules of a run folder's certified winners, from
``tuner/fromrun.py``), compiling the plugin into a temporary folder (``tuner/build.py``)
before anything is changed, and the install target whose two owned files are

* ``STATE/tuner/libnccl-tuner-commdiag.so`` (mode 0755), and
* ``STATE/tuner/commdiag-tuner-rules.txt`` (mode 0644, the rules byte for byte, so that
  the plugin's ``rule line L`` is line L of the file the user wrote),

where STATE is the install-hook state directory (hookstate.py): ``/var/lib/commdiag`` for
root and under ``--root``, ``~/.local/state/commdiag`` otherwise.  The two variables then go
through the hook / drop-in / nccl.conf targets like any other setting.  Writing, undo and
the manifest are hookplan's and hookstate's: these are files of one more install record
(kind ``tuner``, key ``tuner:DIR``), removed with the last install that names them.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

from .. import readfile
from ..errors import CommdiagError, brief
from ..tuner.build import LIBRARY_NAME
from .hookplan import OWNED, Desired, Target

RULES_NAME = "commdiag-tuner-rules.txt"
FILE_NAMES = (LIBRARY_NAME, RULES_NAME)
DIR_NAME = "tuner"
VARIABLES = ("NCCL_TUNER_PLUGIN", "NCCL_TUNER_CONFIG_FILE")
LIBRARY_MODE = 0o755  # what build.py gives it; dlopen needs only read, but a shared library is 0755 by custom
# The two paths are written unquoted into nccl.conf (NCCL's reader has no quoting) and must mean the
# same in every other target: absolute, and only characters no reader treats specially.
_SAFE_PATH = re.compile(r"/[A-Za-z0-9._+/-]+")


@dataclass(frozen=True)
class TunerFiles:
    """What ``--tuner`` installs: the compiled library and the rules, and where (target-system paths)."""

    directory: str
    library: str
    rules: str
    library_bytes: bytes
    rules_bytes: bytes
    n_rules: int
    source: str  # the rules file or run folder given
    compiler: str

    def env(self) -> dict[str, str]:
        return {"NCCL_TUNER_PLUGIN": self.library, "NCCL_TUNER_CONFIG_FILE": self.rules}


def tuner_dir(state_dir_shown: str) -> str:
    """Where the two files go: ``tuner/`` in the state directory, as the target system sees it."""
    return posixpath.join(posixpath.normpath(os.path.abspath(state_dir_shown)), DIR_NAME)


def check_path(path: str, what: str) -> None:
    """Refuse a path that any target (env file, drop-in, nccl.conf, Python) could read differently."""
    from ..tuner import build

    if not _SAFE_PATH.fullmatch(path) or "/../" in path + "/" or "/./" in path + "/":
        bad = next((c for c in path if not re.fullmatch(r"[A-Za-z0-9._+/-]", c)), None)
        why = f"contains {bad!r}" if bad is not None else "is not a normalized absolute path"
        raise CommdiagError(
            f"{what} {brief(path)}: {why}; NCCL_TUNER_PLUGIN and NCCL_TUNER_CONFIG_FILE are written unquoted "
            "(nccl.conf has no quoting), so only letters, digits and ._+-/ are allowed (install as root, "
            "stage with --root DIR, or set XDG_STATE_HOME to such a path)")
    build.check_plugin_path(path, "the state directory's path is too long; set XDG_STATE_HOME to a shorter one")


def read_rules(path: str | Path) -> tuple[bytes, int, str]:
    """The rules to install: (bytes, number of rules, source), checked as the plugin reads them.

    A folder is a run folder: its certified per-size winners become rules (tuner/fromrun.py)."""
    from ..tuner import rules

    p = Path(path)
    if p.is_dir():
        try:
            from ..tuner import fromrun
        except ImportError:
            raise CommdiagError(f"--tuner {p}: is a folder (a run folder); rules from a run folder need "
                                "commdiag tuner rules, which this commdiag does not have yet: give a rules "
                                "file (docs/tuner.md)") from None
        text = fromrun.rules_text(p)
        label = f"{p} (rules from the run's certified winners)"
        try:
            data = text.encode("ascii")
        except UnicodeEncodeError:
            raise CommdiagError(f"{label}: not ASCII; the plugin would refuse it") from None
        return data, len(rules.parse_bytes(data, label)), str(p)
    # Read once (the one reader: a regular file, never a FIFO's wait; as root, nobody else's), then
    # parse those bytes: what is checked is exactly what is copied.
    try:
        data = readfile.read_bytes(p, rules.MAX_FILE_BYTES + 1, what="rules file")
    except OSError as e:
        raise rules.RulesError(str(p), 0, rules.read_error(e)) from None
    return data, len(rules.parse_bytes(data, str(p))), str(p.resolve())


def compile_library(cc: str | None = None) -> tuple[bytes, str]:
    """The plugin compiled here, into a temporary folder (nothing installed is touched): bytes,
    compiler (``cc``: ``--cc``; otherwise build.find_compiler's choice, a fixed one as root)."""
    from ..tuner import build

    data, compiler, _ = build.compile_bytes(cc=cc)
    return data, " ".join(compiler)


def prepare(path: str | Path, state_dir_shown: str, cc: str | None = None) -> TunerFiles:
    """Everything ``--tuner PATH`` installs, made and checked before any change: the rules are read
    and parsed, the paths checked, the library compiled (no compiler: one error, nothing changed)."""
    data, n, source = read_rules(path)
    directory = tuner_dir(state_dir_shown)
    library, rules_path = posixpath.join(directory, LIBRARY_NAME), posixpath.join(directory, RULES_NAME)
    check_path(library, "tuner library path")
    check_path(rules_path, "tuner rules path")
    lib_bytes, compiler = compile_library(cc)
    return TunerFiles(directory, library, rules_path, lib_bytes, data, n, source, compiler)


def tuner_target(tf: TunerFiles, roots) -> Target:
    """The install target of the two files (``roots``: hookstate.Roots, for --root staging)."""
    desired = (Desired(roots.staged(tf.library), tf.library, OWNED, tf.library_bytes, mode=LIBRARY_MODE),
               Desired(roots.staged(tf.rules), tf.rules, OWNED, tf.rules_bytes))
    sha = hashlib.sha256(tf.library_bytes).hexdigest()
    info = {"target": tf.directory, "settings": tf.env(), "source": tf.source, "hook_file": tf.rules,
            "rules": tf.n_rules, "library_sha256": sha, "rules_sha256": hashlib.sha256(tf.rules_bytes).hexdigest(),
            "compiler": tf.compiler}
    notes = (f"tuner: {tf.library} compiled here by {tf.compiler} ({len(tf.library_bytes)} bytes, "
             f"sha256 {sha[:16]}...) and {tf.rules}: {tf.n_rules} rule{'s' if tf.n_rules != 1 else ''} copied byte for byte from "
             f"{tf.source}; NCCL_TUNER_PLUGIN and NCCL_TUNER_CONFIG_FILE name them",)
    return Target(f"tuner:{tf.directory}", "tuner", "files", desired, info, notes)


def warnings_for(tf: TunerFiles) -> tuple[str, ...]:
    if tf.n_rules == 0:
        return (f"--tuner {tf.source}: holds no rules; the plugin will leave every collective to NCCL",)
    return ()


def check_installed_rules(record: dict) -> tuple[bool, str]:
    """Status: do the installed rules still parse as the plugin reads them?  (ok, detail)"""
    from ..tuner import rules

    path = next((f["path"] for f in record.get("files", []) if posixpath.basename(f["path"]) == RULES_NAME), None)
    if path is None:
        return False, "no rules file in this install record"
    try:
        n = len(rules.load(path))
    except CommdiagError as e:
        return False, f"the plugin would refuse them: {e}"
    return True, f"{n} rule{'s' if n != 1 else ''}, parsed as the plugin reads them"


def unused_records(installs: list[dict]) -> list[dict]:
    """The tuner records of ``installs`` (the manifest as it will be) that no other install names."""
    used = {v for r in installs if r.get("kind") != "tuner" for v in (r.get("settings") or {}).values()}
    return [r for r in installs if r.get("kind") == "tuner" and not set((r.get("settings") or {}).values()) & used]
