"""Every process commdiag starts is started, bounded and reaped here, and nowhere else.

A child of commdiag (a torchrun launch, a launch server, ab's server and benchmark command, a p2p
probe, an interpreter probe, check-env's NCCL bring-up) is a **group**: ``start`` puts it

* in a session of its own (its own process group, so one signal reaches it and what it started);
* with the launch marker ``COMMDIAG_LAUNCH_ID=<marker>`` in its environment, which every process it
  starts inherits: a process that leaves the group (torchrun starts every worker in a session of its
  own) is still found by marker in /proc, by this process or, after a kill -9, by the next
  ``--resume`` (measure/runlock.reap_orphans) when the caller recorded the marker in run.json first;
* in a folder commdiag chose (``cwd`` is required): a Python child puts its working folder first on
  its path, and the folder commdiag was started from may hold someone else's ``json.py``;
* with a parent-death signal (``parent_death``, Linux ``PR_SET_PDEATHSIG``) set *after* exec, never
  between fork and exec: ``preexec_fn`` runs Python in a forked copy of a process whose other threads
  (machine-state sampling) may hold a lock it needs (the loader's, by ``dlopen``), and the child then
  waits forever, Python documents it unsafe with threads.  Instead the child is started through
  ``_DIE_WITH_PARENT``, a few lines of this very interpreter (``-I -S``: no path, no site) that set the
  signal, check that the parent did not die meanwhile (``getppid``), and exec the real argv.  A start
  that cannot exec raises OSError as ``subprocess.Popen`` does (errno back through a pipe).  The
  signal is sent when the *thread* that started the child ends: start from the main thread or from a
  thread that outlives the child.  Not for a child started as another user (``run_as``): commdiag's
  interpreter may not be executable by that user; such a child is bounded by its deadline.

``Group.stop(ladder)`` is the one signal ladder: each ``(signal, seconds)`` step to the whole group
(optional SIGINT, then SIGTERM with a grace period), SIGKILL last, then every process still carrying
the marker is killed (``sweep``).  ``run`` is start + one deadline + stop: output to files, or
captured through pipes that are drained under the same deadline (the last ``OUTPUT_CAP`` bytes of
each stream kept; a process that keeps a pipe open past the deadline is killed, never waited for).

Also here: ``free_port`` (the one loopback port picker), ``take_back_sigint`` (Ctrl-C works even when
commdiag was started with SIGINT ignored), and ``private_folder`` (where a child's scratch files go:
as root never under a ``$TMPDIR`` another user can change).

The API, stable (measure/serverpool.py and forkserver.py start through it too):
``start(argv, env=, cwd=, marker=, stdin=, stdout=, stderr=, append=, pass_fds=, run_as=, parent_death=)``
-> ``Group`` (``pid``, ``marker``, ``started``, ``poll()``, ``wait(timeout)``, ``signal_group(sig)``,
``stop(ladder, sweep=)`` -> ``Stopped``, ``close()``); ``finish(group, deadline_s=, ...)`` and
``run(argv, ..., deadline_s=)`` -> ``Finished``; markers: ``MARKER``, ``new_marker``, ``carries_marker``,
``marked_pids``, ``kill_marked(marker, wait_s)``, ``signal_leader(pid, sig, marker)``; and
``free_port``, ``take_back_sigint``, ``scratch_root``, ``private_folder``, ``KILL_GRACE_S``, ``OUTPUT_CAP``,
``PIPE``/``DEVNULL``/``STDOUT``.
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

MARKER = "COMMDIAG_LAUNCH_ID"
KILL_GRACE_S = 5.0  # torchrun forwards SIGTERM to its workers; give them this long to exit
OUTPUT_CAP = 4 << 20  # bytes kept per captured stream (the tail); commdiag's own replies are < 100 KB
EXITED_DRAIN_S = 0.5  # after the leader exited, how long a child it left may keep the pipes open
START_ANSWER_S = 30.0  # the exec wrapper answers in ~20 ms; this only bounds a machine frozen solid

PIPE, DEVNULL, STDOUT = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT

# Runs first in every child that gets a parent-death signal, as ``python -I -S -c`` (stdlib only).
# argv: parent pid, signal (0: none), error fd, marker ('' : keep the environment as it is), argv...
_DIE_WITH_PARENT = r"""
import os, sys
parent, sig, err, marker = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
os.set_inheritable(err, False)
if sig:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, sig, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
if marker:
    os.environ["COMMDIAG_LAUNCH_ID"] = marker
try:
    os.execvp(sys.argv[5], sys.argv[5:])
except OSError as e:
    os.write(err, b"%d %s" % (e.errno or 0, os.fsencode(e.strerror or "")))
    os._exit(127)
"""


# --------------------------------------------------------------------------- markers

def new_marker() -> str:
    """A fresh launch marker (run.json validates it as 32 hex digits: runlock)."""
    return uuid.uuid4().hex


def carries_marker(pid: int, marker: str) -> bool:
    """Whether process ``pid`` belongs to the launch ``marker`` (its environment says so); False
    for a process this user cannot read (another user's is never one of ours)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{MARKER}={marker}".encode() in f.read().split(b"\0")
    except (OSError, ValueError):
        return False


def marked_pids(marker: str) -> list[int]:
    """Processes whose environment carries ``COMMDIAG_LAUNCH_ID=marker`` (Linux /proc)."""
    return [int(e.name) for e in os.scandir("/proc")
            if e.name.isdigit() and int(e.name) != os.getpid() and carries_marker(int(e.name), marker)]


def kill_marked(marker: str, wait_s: float = 0.0) -> int:
    """SIGKILL every process still carrying ``marker``; how many there were.  SIGKILL is delivered
    asynchronously: with ``wait_s``, wait up to that long until none of them runs any more (a zombie's
    environment reads empty; one stuck in the kernel is left, not waited on)."""
    pids = marked_pids(marker)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + wait_s
    alive = pids
    while alive and time.monotonic() < end:
        time.sleep(0.01)
        alive = [p for p in alive if carries_marker(p, marker)]
    return len(pids)


def signal_leader(pid: int, sig: int, marker: str | None = None) -> bool:
    """Signal the process group that ``pid`` leads, or ``pid`` alone while it leads none yet (a
    moment after its fork, before its ``setsid``): for processes commdiag did not start through
    ``start``, a launch server's forked children (measure/forkserver.py, serverpool.py).  With
    ``marker``, only while ``pid`` still carries it (never a reused pid).  True if a signal was sent."""
    if marker is not None and not carries_marker(pid, marker):
        return False
    try:
        try:
            os.killpg(pid, sig)
            return True
        except ProcessLookupError:  # not (yet) the leader of a group of its own
            pass
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


# --------------------------------------------------------------------------- small shared pieces

def free_port() -> int:
    """A loopback TCP port free a moment ago (MASTER_PORT of a forked launch, ab's ``{port}``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def take_back_sigint() -> None:
    """The default Ctrl-C handler in the main thread.  Started with SIGINT ignored (nohup, a
    background job of a script, some service managers), Ctrl-C and `kill -INT` would do nothing,
    and a sweep, an ab run or a hung p2p probe could not be interrupted and resumed."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def which(name: str, path: str | None = None) -> str | None:
    """The program a bare ``name`` starts, looked up on ``path`` (default this process's PATH) as exec
    would, or None.  As root only in absolute PATH folders that nobody else can change (``ownership``,
    the folder and everything above it, and the file itself): an empty or ``.`` entry is the working
    folder, and a folder of a user's (``sudo -E``, or a PATH without secure_path) would run her
    ``srun``, ``ssh`` or ``torchrun`` as uid 0.  A ``name`` with a slash is returned as it is."""
    if "/" in name:
        return name
    path = os.environ.get("PATH", os.defpath) if path is None else path
    as_root = os.geteuid() == 0
    for folder in path.split(os.pathsep):
        if as_root and not folder.startswith("/"):
            continue
        candidate = os.path.join(folder or ".", name)
        if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
            continue
        if as_root:
            from . import ownership

            if ownership.first_finding(candidate) is not None:
                continue
        return candidate
    return None


def _program(argv: list[str], env: dict[str, str] | None) -> list[str]:
    """``argv`` with a bare program name replaced by what ``which`` finds (as root: never her folder)."""
    if "/" in argv[0] or os.geteuid() != 0:
        return argv
    path = (os.environ if env is None else env).get("PATH", os.defpath)
    found = which(argv[0], path)
    if found is None:
        import errno

        raise FileNotFoundError(errno.ENOENT, f"as root, commdiag runs a program by name only from an absolute PATH "
                                              f"folder only root can change, and {argv[0]!r} was not found in one "
                                              "(give its absolute path)", argv[0])
    return [found, *argv[1:]]


def scratch_root() -> str:
    """Where private scratch folders go: ``tempfile.gettempdir()``, except that as root a folder
    another user can change (``sudo -E`` with her ``TMPDIR``: she could rename root's folder and put
    her own script in its place) is passed over for ``/tmp`` (root's, sticky)."""
    where = tempfile.gettempdir()
    if os.geteuid() != 0:
        return where
    from .environment import trust

    for candidate in (where, "/tmp"):
        walker = trust._Walker()
        walker.path(candidate)
        if not walker.findings and os.path.isdir(candidate):
            return candidate
    from .errors import CommdiagError

    raise CommdiagError(f"as root, commdiag keeps its scratch files only in a folder no other user can change, "
                        f"and neither {where} nor /tmp is one; set TMPDIR to a folder root owns")


@contextlib.contextmanager
def private_folder(prefix: str):
    """A fresh 0700 folder for a child's scripts and outputs (and its working folder), removed after."""
    with tempfile.TemporaryDirectory(prefix=prefix, dir=scratch_root()) as d:
        yield Path(d)


# --------------------------------------------------------------------------- one group

@dataclass(frozen=True)
class Stopped:
    """How ``Group.stop`` ended a group."""

    signal: str | None  # the ladder's signal that ended the leader (None: it had exited already)
    exit_code: int | None  # None: still there after SIGKILL (stuck in the kernel)
    killed: bool  # it needed SIGKILL
    survivors: int = 0  # processes still carrying the marker afterwards, killed (0 without sweep)


class Group:
    """One started child: the leader of its own session, carrying ``marker``."""

    def __init__(self, proc: subprocess.Popen, marker: str, started: float):
        self.proc, self.marker, self.started = proc, marker, started  # started: time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code, or None when the leader still runs after ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout=None if timeout is None else max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def stop(self, ladder=((signal.SIGTERM, KILL_GRACE_S),), *, sweep: bool = True) -> Stopped:
        """Each ``(signal, seconds)`` of ``ladder`` to the group until the leader exits, SIGKILL last
        (``KILL_GRACE_S``); then the rest of the group, and with ``sweep`` every process still
        carrying the marker (left the group), get SIGKILL.  A second Ctrl-C meanwhile skips to SIGKILL."""
        how: str | None = None
        killed = False
        try:
            if self.proc.poll() is None:
                for sig, wait in (*ladder, (signal.SIGKILL, KILL_GRACE_S)):
                    self.signal_group(sig)
                    if self.wait(wait) is not None:
                        how, killed = signal.Signals(sig).name, sig == signal.SIGKILL
                        break
                else:
                    how, killed = "SIGKILL", True
        finally:
            self.signal_group(signal.SIGKILL)  # the leader is gone; members of its group may not be
            if self.proc.poll() is None:
                self.wait(KILL_GRACE_S)
            survivors = kill_marked(self.marker, KILL_GRACE_S) if sweep else 0
        return Stopped(how, self.proc.returncode, killed, survivors)

    def close(self) -> None:
        """Close the pipes commdiag holds to it."""
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


def _open_out(target, mode: str):
    """A Path is opened (``mode``) here and closed after the start; anything else is Popen's.
    Never through a link (a launch log planted as a link to a 0600 file of root's is not truncated)."""
    if isinstance(target, (str, Path)):
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if "a" in mode else os.O_TRUNC)
        return os.fdopen(os.open(target, flags, 0o644), mode), True
    return target, False


def start(argv, *, env: dict[str, str] | None, cwd: str | Path, marker: str | None = None,
          stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL, append: bool = False, pass_fds=(),
          run_as=None, parent_death: int | None = signal.SIGKILL) -> Group:
    """Start ``argv`` as a group: own session, ``MARKER=marker`` (default a fresh one) in ``env``
    (None: this process's own environment, C-level ``putenv`` included, as ``Popen(env=None)``),
    in ``cwd``, with ``parent_death`` (a signal, or None) set after exec.

    ``stdout``/``stderr``: a path (opened for writing, ``append`` to append), an open file, PIPE,
    DEVNULL, or STDOUT for stderr.  ``run_as`` (trust.RunAs): started as that uid and gid with no
    other group, without a parent-death signal (module docstring).  Raises OSError as Popen does."""
    marker = marker or new_marker()
    if env is not None:
        env = {**env, MARKER: marker}
    drop = {"user": run_as.uid, "group": run_as.gid, "extra_groups": []} if run_as is not None else {}
    wrap = env is None or (parent_death is not None and run_as is None)
    argv = _program([os.fspath(a) for a in argv], env)
    program = argv[0]
    fds = list(pass_fds)
    answer = None
    if wrap:
        answer, w = os.pipe()
        argv = [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()),
                str(int(parent_death or 0) if run_as is None else 0), str(w), "" if env is not None else marker,
                *argv]
        fds.append(w)
    mode = "ab" if append else "wb"
    t0 = time.monotonic()
    out, close_out = _open_out(stdout, mode)
    err, close_err = _open_out(stderr, mode)
    try:
        proc = subprocess.Popen(argv, env=env, cwd=str(cwd), stdin=stdin, stdout=out, stderr=err,
                                start_new_session=True, close_fds=True, pass_fds=tuple(fds), **drop)
    except BaseException:
        if answer is not None:
            os.close(answer)
            os.close(w)
        raise
    finally:
        if close_out:
            out.close()
        if close_err:
            err.close()
    group = Group(proc, marker, t0)
    if answer is not None:
        os.close(w)
        try:
            _exec_answer(answer, group, program)
        finally:
            os.close(answer)
    return group


def _exec_answer(fd: int, group: Group, program: str) -> None:
    """EOF: the wrapper exec'd the real argv.  Bytes: its exec failed: raise that OSError."""
    ready, _, _ = select.select([fd], [], [], START_ANSWER_S)
    if not ready:
        group.stop(())
        group.close()
        raise OSError(f"{program}: the start did not reach exec within {START_ANSWER_S:g} s")
    data = os.read(fd, 4096)
    if data:
        group.wait(KILL_GRACE_S)
        group.close()
        code, _, text = data.partition(b" ")
        raise OSError(int(code), text.decode(errors="replace"), program)


# --------------------------------------------------------------------------- start to end

@dataclass(frozen=True)
class Finished:
    """What ``run`` saw: ``exit_code`` None when it timed out or was interrupted."""

    exit_code: int | None
    timed_out: bool
    wall_s: float
    killed_survivors: int  # processes that still carried the marker after the stop
    interrupted: bool = False
    stdout: bytes = b""  # the captured tail (PIPE only)
    stderr: bytes = b""
    stopped: Stopped | None = None


def run(argv, *, env: dict[str, str] | None, cwd: str | Path, deadline_s: float, marker: str | None = None,
        stdin: bytes | None = None, stdout=PIPE, stderr=PIPE, ladder=((signal.SIGTERM, KILL_GRACE_S),),
        sweep: bool = True, run_as=None, parent_death: int | None = signal.SIGKILL,
        report_interrupt: bool = False) -> Finished:
    """Start ``argv`` (``start``), then ``finish`` it: nothing of it outlives the call."""
    group = start(argv, env=env, cwd=cwd, marker=marker, stdin=PIPE if stdin is not None else DEVNULL,
                  stdout=stdout, stderr=stderr, run_as=run_as, parent_death=parent_death)
    return finish(group, deadline_s=deadline_s, stdin=stdin, ladder=ladder, sweep=sweep,
                  report_interrupt=report_interrupt)


def finish(group: Group, *, deadline_s: float, stdin: bytes | None = None, ladder=((signal.SIGTERM, KILL_GRACE_S),),
           sweep: bool = True, report_interrupt: bool = False) -> Finished:
    """Wait for ``group`` to ``deadline_s`` after its start, then stop what is left
    (``Group.stop(ladder, sweep=sweep)``).

    Its PIPE outputs are captured, drained under the same deadline (``OUTPUT_CAP``).  ``stdin``:
    bytes written to its stdin pipe (then closed).  Ctrl-C ends the group and is raised again, or
    with ``report_interrupt`` returned as ``interrupted``; a second Ctrl-C during the stop goes to
    SIGKILL at once."""
    deadline = group.started + deadline_s
    timed_out = interrupted = False
    bufs: dict = {}
    stopped = None
    try:
        try:
            try:
                if group.proc.stdout is not None or group.proc.stderr is not None or group.proc.stdin is not None:
                    timed_out = not _drain(group, stdin, deadline, bufs)
                else:
                    timed_out = group.wait(deadline - time.monotonic()) is None
            except KeyboardInterrupt:
                interrupted = True
            stopped = group.stop(ladder, sweep=sweep)
        except KeyboardInterrupt:  # a second Ctrl-C during the grace period: stop waiting, kill now
            interrupted = True
            stopped = group.stop((), sweep=sweep)
    finally:
        if stopped is None:  # anything else raised: still nothing survives
            group.stop((), sweep=sweep)
        group.close()
    if interrupted and not report_interrupt:
        raise KeyboardInterrupt
    done = not (timed_out or interrupted) and not stopped.signal
    return Finished(group.returncode if done else None, timed_out, time.monotonic() - group.started,
                    stopped.survivors, interrupted, bytes(bufs.get("stdout", b"")), bytes(bufs.get("stderr", b"")),
                    stopped)


@contextlib.contextmanager
def _exit_fd(pid: int):
    """A pidfd of ``pid`` (readable once it exits), or None where the kernel has none."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def _drain(group: Group, stdin: bytes | None, deadline: float, bufs: dict) -> bool:
    """Feed stdin, read stdout and stderr until EOF, or the deadline (False), keeping each tail.
    After the leader exits, a child it left holding the pipes gets ``EXITED_DRAIN_S`` more."""
    proc = group.proc
    if stdin is not None and proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.write(stdin)
        with contextlib.suppress(OSError):
            proc.stdin.close()
    streams = {f: name for f, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")) if f is not None}
    for name in streams.values():
        bufs[name] = bytearray()
    exited = False
    with selectors.DefaultSelector() as sel, _exit_fd(proc.pid) as exit_fd:
        for f in streams:
            sel.register(f, selectors.EVENT_READ)
        if exit_fd is not None:  # wakes the select when the leader exits (else: polled)
            sel.register(exit_fd, selectors.EVENT_READ)
        while len(sel.get_map()) > (exit_fd is not None and not exited):
            if not exited and proc.poll() is not None:
                exited, deadline = True, min(deadline, time.monotonic() + EXITED_DRAIN_S)
                if exit_fd is not None:
                    sel.unregister(exit_fd)
            left = deadline - time.monotonic()
            if left <= 0:
                return exited
            for key, _ in sel.select(min(left, 0.5)):
                if key.fileobj == exit_fd:
                    continue
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = bufs[streams[key.fileobj]]
                buf += chunk
                if len(buf) > OUTPUT_CAP:
                    del buf[:len(buf) - OUTPUT_CAP]
    return group.wait(deadline - time.monotonic()) is not None
