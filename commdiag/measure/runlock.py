"""One commdiag process per run folder, and no launch outliving the process that started it.

``hold(run_dir)``: an exclusive, non-blocking ``flock`` on ``RUN_DIR/.lock`` for as long as
a sweep (or ``--resume``) works in the folder.  A second sweep in the same folder fails at
once, naming the holder's pid, instead of both running the same launches and deleting each
other's launch folders.  The kernel drops the lock when its holder dies (kill -9 included),
so a stale lock file never blocks; the file holds the holder's pid (for the message) and is
removed on release.

``reap_orphans(run)``: every launch's processes carry ``COMMDIAG_LAUNCH_ID=<marker>`` in
their environment (launcher.py), and run.json records each launch's ``marker``.  After a
kill -9 of commdiag, the in-flight torchrun and its workers live on (re-parented to init)
past their deadline; before ``--resume`` reruns that launch over their folder, this finds
them by marker in /proc and ends them: SIGTERM, a grace period, SIGKILL, each with a
deadline.  Only processes of this user are signalled (any, as root).

As root, ``hold`` first refuses a run folder another user can change (``check_folder``).

Writes: ``RUN_DIR/.lock`` (while held).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import signal
import time
from pathlib import Path

from ..errors import CommdiagError
from ..procs import MARKER

LOCK_NAME = ".lock"
REAP_GRACE_S = 5.0  # like launcher.KILL_GRACE_S: torchrun forwards SIGTERM to its workers
_MARKER_RE = re.compile(r"[0-9a-f]{32}")  # procs.new_marker(): uuid4().hex


@contextlib.contextmanager
def hold(run_dir: str | Path):
    """Hold RUN_DIR's lock for the ``with`` block, or raise CommdiagError naming the holder (or, as
    root, the part of the folder's path another user can change: ``check_folder``)."""
    run_dir = Path(run_dir)
    check_folder(run_dir)
    path = run_dir / LOCK_NAME
    for _ in range(10):  # the holder may remove the file between our open and our flock: retry
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            what = "is a symbolic link" if e.errno == errno.ELOOP else e.strerror
            raise CommdiagError(f"{path}: cannot lock the run folder: {what}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise CommdiagError(f"{run_dir}: another commdiag process (pid {pid or '?'}) is using this run "
                                "folder; wait for it to finish, or stop it first") from None
        except OSError as e:
            os.close(fd)
            raise CommdiagError(f"{path}: cannot lock the run folder: {e.strerror}") from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    else:
        raise CommdiagError(f"{path}: the lock file keeps changing; is another commdiag starting here?")
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # still locked: a newcomer either fails on us or makes a fresh file
        os.close(fd)


def check_folder(run_dir: Path, inside: tuple[str, ...] = ("launches",)) -> None:
    """As root, refuse a run folder another user can change: every launch is written below it
    (``launches/NNNN/``, a leftover one removed first), so a ``launches`` link planted by the folder's
    owner, or the folder swapped for a link by whoever can write its parent, would have root remove
    and write wherever it points.  Every component of RUN_DIR and RUN_DIR/launches, links followed hop
    by hop, must be root's and not writable by a group or by everyone (a sticky /tmp is fine)."""
    if os.geteuid() != 0:
        return  # a user's run folder is theirs to point anywhere they can write themselves
    from .. import ownership

    f = ownership.first_finding(str(run_dir), *(str(Path(run_dir) / name) for name in inside))
    if f is not None:
        raise CommdiagError(f"{run_dir}: as root, commdiag writes a run's launches only into a folder no other "
                            f"user can change, and {f.path} is {f.why}; give a run folder root owns (or run "
                            "commdiag as that user)")


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _markers(run: dict) -> set[str]:
    """The launch markers recorded in run.json, a measuring command's and explain's (data read from
    disk: only well-formed ones)."""
    out = set()
    for launch in [l for key in ("launches", "explain_launches") if isinstance(run.get(key), list)
                   for l in run[key]]:
        m = launch.get("marker") if isinstance(launch, dict) else None
        if isinstance(m, str) and _MARKER_RE.fullmatch(m):
            out.add(m)
    extra = run.get("explain_markers")  # what explain recorded before it ran on measure/runner.py: still read
    for m in extra if isinstance(extra, list) else []:
        if isinstance(m, str) and _MARKER_RE.fullmatch(m):
            out.add(m)
    return out


def _marker_of(pid: int) -> str | None:
    """The COMMDIAG_LAUNCH_ID in a live process's environment (None: none, gone, a zombie)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return None
    prefix = f"{MARKER}=".encode()
    for item in env.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode("ascii", "replace")
    return None


def _mine(pid: int) -> bool:
    if os.geteuid() == 0:
        return True
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.geteuid()
    except OSError:
        return False


def marked_processes(markers: set[str]) -> list[int]:
    """Live processes (other than this one) whose environment carries one of ``markers``."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            if _marker_of(int(entry.name)) in markers and _mine(int(entry.name)):
                pids.append(int(entry.name))
    return sorted(pids)


def _signal_and_wait(pids: list[int], markers: set[str], sig: int, deadline_s: float) -> list[int]:
    """Send ``sig`` to ``pids``; wait until they are gone or the deadline; return those still alive."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    end = time.monotonic() + deadline_s
    alive = list(pids)
    while alive and time.monotonic() < end:
        time.sleep(0.05)
        alive = [p for p in alive if _marker_of(p) in markers]  # a zombie's environ reads empty
    return alive


def reap_orphans(run: dict, grace_s: float = REAP_GRACE_S) -> list[int]:
    """End every process still carrying a marker of ``run``'s launches; return the pids ended.

    SIGTERM, up to ``grace_s`` for them to exit, then SIGKILL and up to ``grace_s`` again
    (a process in uninterruptible sleep can outlast that; it is then left, not waited on)."""
    markers = _markers(run)
    if not markers:
        return []
    found = marked_processes(markers)
    if not found:
        return []
    alive = _signal_and_wait(found, markers, signal.SIGTERM, grace_s)
    if alive:
        alive = _signal_and_wait(alive, markers, signal.SIGKILL, grace_s)
    return [p for p in found if p not in alive]
