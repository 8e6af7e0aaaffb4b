"""Processes of one launch: the user's server and benchmark command, each in its own process group.

Every process carries the launch's ``COMMDIAG_LAUNCH_ID`` marker (measure/launcher.py), recorded in
run.json before it starts, so whatever a killed commdiag leaves behind is found and ended by the
next ``--resume`` (measure/runlock.reap_orphans).  On Linux each direct child also gets SIGTERM
when commdiag dies (PR_SET_PDEATHSIG), so a kill -9 of commdiag does not leave a server serving.

Stopping is SIGINT, then SIGTERM, then SIGKILL to the whole group, each with a deadline; then every
process still carrying the marker (one that left the group) is killed.  A server that needed
SIGKILL outlived its stop: the caller fails that launch.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..measure import launcher

POLL_S = 0.02  # readiness and exit polling; its cost lands in commdiag's overhead per launch
KILL_WAIT_S = 5.0


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def start(argv, env: dict[str, str], stdout: Path, stderr: Path | None = None) -> subprocess.Popen:
    """Start ``argv`` in its own session (process group), output to files, stdin from /dev/null."""
    out = open(stdout, "wb")
    err = open(stderr, "wb") if stderr is not None else subprocess.STDOUT
    try:
        return subprocess.Popen(list(argv), env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True, close_fds=True,
                                preexec_fn=_die_with_parent if os.name == "posix" else None)
    finally:
        out.close()
        if stderr is not None:
            err.close()


@dataclass(frozen=True)
class Stopped:
    signal: str | None  # the signal that ended it (None: it had exited already)
    exit_code: int | None
    killed: bool  # needed SIGKILL


def stop_group(proc: subprocess.Popen, steps=((signal.SIGINT, 30.0), (signal.SIGTERM, 30.0))) -> Stopped:
    """Signal the group step by step until the leader exits; SIGKILL last."""
    if proc.poll() is not None:
        _kill_rest(proc)
        return Stopped(None, proc.returncode, False)
    for sig, wait in (*steps, (signal.SIGKILL, KILL_WAIT_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            _kill_rest(proc)
            return Stopped(signal.Signals(sig).name, proc.returncode, sig == signal.SIGKILL)
        except subprocess.TimeoutExpired:
            continue
    return Stopped("SIGKILL", None, True)


def _kill_rest(proc: subprocess.Popen) -> None:
    """The leader is gone; members of its group may not be."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_command(argv, env: dict[str, str], stdout: Path, stderr: Path, deadline_s: float
                ) -> tuple[int | None, bool, float]:
    """Run the benchmark command to completion or its deadline: (exit code, timed out, wall s).
    Ctrl-C (KeyboardInterrupt) ends its group and is raised again to the caller."""
    t0 = time.monotonic()
    proc = start(argv, env, stdout, stderr)
    try:
        try:
            code = proc.wait(timeout=deadline_s)
            return code, False, time.monotonic() - t0
        except subprocess.TimeoutExpired:
            stop_group(proc, ((signal.SIGTERM, KILL_WAIT_S),))
            return None, True, time.monotonic() - t0
    except BaseException:
        stop_group(proc, ((signal.SIGTERM, 2.0),))
        raise
    finally:
        if proc.poll() is None:
            stop_group(proc, ())


def wait_ready(proc: subprocess.Popen, log: Path, url: str | None, log_regex: str | None,
               deadline_s: float) -> tuple[float | None, str | None]:
    """(seconds to ready, None), or (None, why not): the server exited, or the deadline passed."""
    t0 = time.monotonic()
    rx = re.compile(log_regex) if log_regex else None
    seen = 0
    carry = b""
    while True:
        code = proc.poll()
        if code is not None:
            return None, f"server exited with code {code} before it was ready (see {log.name})"
        if rx is not None:
            try:
                with open(log, "rb") as f:
                    f.seek(seen)
                    chunk = f.read(1 << 20)
            except OSError:
                chunk = b""
            seen += len(chunk)
            text = (carry + chunk).decode("utf-8", "replace")
            if rx.search(text):
                return time.monotonic() - t0, None
            carry = (carry + chunk)[-4096:]  # a ready line split across two reads still matches
        if url is not None and _answers_200(url):
            return time.monotonic() - t0, None
        if time.monotonic() - t0 > deadline_s:
            what = " and ".join(x for x in (f"{url} did not answer 200" if url else None,
                                             f"no line matched {log_regex!r}" if log_regex else None) if x)
            return None, f"server not ready within {deadline_s:g}s ({what})"
        time.sleep(POLL_S)


# No proxy: a readiness URL is the launch's own server (http_proxy in the environment would send
# localhost through it).
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _answers_200(url: str) -> bool:
    try:
        with _OPENER.open(url, timeout=1.0) as r:  # the user's own URL
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def kill_marked(marker: str) -> int:
    """End every process still carrying the launch's marker (left its group); how many."""
    return launcher.kill_marked(marker)
