"""Processes of one launch: the user's server and benchmark command, each a procs.Group.

Every process carries the launch's ``COMMDIAG_LAUNCH_ID`` marker (procs.py), recorded in run.json
before it starts, so whatever a killed commdiag leaves behind is found and ended by the next
``--resume`` (measure/runlock.reap_orphans).  Each starts in the launch folder (``{launch_dir}``),
never in the folder commdiag was started from (the shipped specs run ``python -m``, which would
import a ``json.py`` from there), and gets SIGTERM when commdiag dies (PR_SET_PDEATHSIG, set after
exec by procs.start, not by ``preexec_fn`` beside the machine-state thread), so a kill -9 of
commdiag does not leave a server serving.

Stopping is SIGINT, then SIGTERM, then SIGKILL to the whole group, each with a deadline; then every
process still carrying the marker (one that left the group) is killed (procs.Group.stop).  A server
that needed SIGKILL outlived its stop: the caller fails that launch.
"""

from __future__ import annotations

import re
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

from .. import procs
from ..procs import Stopped  # noqa: F401  (what stop_group returns)

POLL_S = 0.02  # readiness and exit polling; its cost lands in commdiag's overhead per launch
KILL_WAIT_S = 5.0


def start(argv, env: dict[str, str], stdout: Path, stderr: Path | None = None, *, cwd: Path) -> procs.Group:
    """Start ``argv`` in its own session in ``cwd`` (the launch folder), output to files, stdin
    from /dev/null, SIGTERM when commdiag dies."""
    return procs.start(list(argv), env=env, cwd=cwd, marker=env[procs.MARKER], stdout=stdout,
                       stderr=stderr if stderr is not None else procs.STDOUT, parent_death=signal.SIGTERM)


def stop_group(proc: procs.Group, steps=((signal.SIGINT, 30.0), (signal.SIGTERM, 30.0))) -> Stopped:
    """Signal the group step by step until the leader exits; SIGKILL last; then what left the group."""
    return proc.stop(steps)


def run_command(argv, env: dict[str, str], stdout: Path, stderr: Path, deadline_s: float, *, cwd: Path
                ) -> tuple[int | None, bool, float]:
    """Run the benchmark command to completion or its deadline: (exit code, timed out, wall s).
    Ctrl-C (KeyboardInterrupt) ends its group and is raised again to the caller.  No sweep by
    marker here: the server of the launch carries the same one and is still serving."""
    end = procs.run(list(argv), env=env, cwd=cwd, marker=env[procs.MARKER], deadline_s=deadline_s,
                    stdout=stdout, stderr=stderr, ladder=((signal.SIGTERM, KILL_WAIT_S),), sweep=False,
                    parent_death=signal.SIGTERM)
    return end.exit_code, end.timed_out, end.wall_s


def wait_ready(proc: procs.Group, log: Path, url: str | None, log_regex: str | None,
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
    return procs.kill_marked(marker)
