"""Probe processes under deadlines: every job (a GPU's host copies, a pair) has its own.

A probe (probe.py) runs the jobs one after another and says on a pipe which job it starts,
which phase it is in, and what it measured.  The supervisor never touches CUDA or NVML, so a
hang cannot reach it:

* a job that does not finish within ``job_timeout_s`` of its start is **hung**: the probe's
  process group (its own session) gets SIGKILL, and a fresh probe continues with the jobs left;
* a probe that dies mid-job (a crash, a CUDA error it reported) fails that job only, likewise;
* a probe that does not say hello within ``start_timeout_s`` (CUDA initialisation hung) is
  killed; the first one is an error, a later one leaves the remaining jobs ``not-run``;
* Ctrl-C (KeyboardInterrupt) kills the probe, then propagates; the probe also dies with
  commdiag however commdiag dies (PR_SET_PDEATHSIG, procs.start), and every process carrying the
  run's COMMDIAG_LAUNCH_ID is killed at the end (procs.kill_marked), so none survives.

Probes run one at a time: copies of two pairs at once would share links and the root complex.
"""

from __future__ import annotations

import json
import os
import select
import signal
import tempfile
import time
from dataclasses import dataclass, field

from .. import PACKAGE_PARENT, procs
from ..childpython import child_env, isolated_argv
from ..errors import CommdiagError
from ..procs import kill_marked, marked_pids, new_marker, take_back_sigint
from .probe import jobs_for
from .result import FAILED, HUNG, NOT_RUN, OK

START_TIMEOUT_S = 120.0  # import torch, create CUDA contexts, read NVML; slow in VMs, never minutes
TAIL_BYTES = 4000  # of a dead probe's stderr, into the job's error


@dataclass
class JobOutcome:
    id: str
    status: str
    record: dict | None = None
    phase: str | None = None
    error: str | None = None
    wall_s: float | None = None


@dataclass
class Supervised:
    hello: dict | None = None
    outcomes: dict[str, JobOutcome] = field(default_factory=dict)
    probes: int = 0  # probe processes started
    killed: int = 0  # processes killed after their deadline or at the end
    stuck: list[int] = field(default_factory=list)  # pids SIGKILL could not end (in the driver, D state)


# ``python -m`` would put the current folder first on sys.path: a ``commdiag/`` there (as root, in a
# folder another user can write) would run instead.  So the probe starts isolated (-I: no folder on
# the path, no PYTHON* variables, no user site; childpython.py), puts this very commdiag's parent
# folder first on sys.path before any import, and runs in "/".
PROBE_CODE = ("import sys; sys.path.insert(0, sys.argv[1]); from commdiag.p2p.probe import main; "
              "sys.exit(main(sys.argv[2:]))")


def probe_argv(fd: int, plan: dict) -> list[str]:
    return isolated_argv(PROBE_CODE, [PACKAGE_PARENT, "--fd", str(fd), "--plan", json.dumps(plan)])


class _Probe:
    """One probe process, its event pipe and its stderr file."""

    def __init__(self, plan: dict, env: dict, marker: str):
        r, w = os.pipe()
        self.stderr = tempfile.TemporaryFile(dir=procs.scratch_root())
        env = dict(env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH", "")) if p)
        try:
            self.proc = procs.start(probe_argv(w, plan), env=env, cwd="/", marker=marker, pass_fds=(w,),
                                    stdout=self.stderr, stderr=self.stderr, parent_death=signal.SIGKILL)
        finally:
            os.close(w)
        self.fd = r
        self.buf = b""
        self.eof = False

    def events(self, timeout: float) -> list[dict]:
        """Events that arrive within ``timeout`` seconds (empty list: none yet)."""
        if self.eof:
            return []
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        if not ready:
            return []
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            self.eof = True
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # not ours: never trust a line we cannot parse
        return out

    def kill(self) -> None:
        """SIGKILL to its group; one stuck in the driver (D state) dies when the driver lets go: no
        waiting for it, and what carries the marker is swept at the end of the run (supervise)."""
        self.proc.stop((), sweep=False)

    def tail(self) -> str:
        self.stderr.seek(0, os.SEEK_END)
        size = self.stderr.tell()
        self.stderr.seek(max(0, size - TAIL_BYTES))
        return self.stderr.read().decode("utf-8", "replace").strip()

    def close(self) -> None:
        os.close(self.fd)
        self.stderr.close()


def supervise(settings: dict, job_timeout_s: float, start_timeout_s: float = START_TIMEOUT_S,
              env: dict | None = None, on_job=None) -> Supervised:
    """Run every job of every visible GPU under its deadline; ``on_job(JobOutcome)`` as each ends."""
    take_back_sigint()  # a hung probe must end on Ctrl-C
    env = child_env(None if env is None else dict(env))
    marker = new_marker()
    res = Supervised()
    jobs: list[str] | None = None
    done_before = 0
    try:
        while jobs is None or any(j not in res.outcomes for j in jobs):
            skip = [] if jobs is None else [j for j in jobs if j in res.outcomes]
            if jobs is not None and res.probes and len(skip) == done_before:
                # the last probe ended without a job's outcome: another would do the same
                for j in jobs:
                    if j not in res.outcomes:
                        _finish(res, JobOutcome(j, NOT_RUN, error="the probe ended without running it"), on_job)
                break
            done_before = len(skip)
            probe = _Probe({"settings": settings, "skip": skip}, env, marker)
            res.probes += 1
            try:
                jobs = _watch(probe, res, jobs, job_timeout_s, start_timeout_s, on_job)
            finally:
                if probe.proc.poll() is None:
                    probe.kill()
                    res.killed += 1
                probe.close()
            if jobs is None or (res.hello is not None and res.hello.get("count", 0) == 0):
                return res
    finally:
        res.killed += kill_marked(marker)  # whatever left the group: also on Ctrl-C
        if res.killed:
            time.sleep(0.2)  # SIGKILL is asynchronous; a process still there after this is stuck
            res.stuck = marked_pids(marker)
    return res


def _watch(probe: _Probe, res: Supervised, jobs, job_timeout_s, start_timeout_s, on_job):
    """Follow one probe until it ends or is killed; returns the job list (known after the hello)."""
    started = time.monotonic()
    greeted = False
    current: JobOutcome | None = None
    job_t0 = started
    while True:
        deadline = (job_t0 + job_timeout_s) if greeted else (started + start_timeout_s)
        left = deadline - time.monotonic()
        if left <= 0:
            probe.kill()
            res.killed += 1
            if not greeted:
                return _no_hello(probe, res, jobs, start_timeout_s, on_job, hung=True)
            if current is not None:
                current.status, current.wall_s = HUNG, round(time.monotonic() - job_t0, 3)
                _finish(res, current, on_job)
            return jobs
        for ev in probe.events(min(left, 0.5)):
            kind = ev.get("event")
            if kind == "hello" and not greeted:
                greeted, job_t0 = True, time.monotonic()
                if res.hello is None:
                    res.hello = ev
                if jobs is None:
                    jobs = jobs_for(int(ev.get("count") or 0))
            elif kind == "job":
                current, job_t0 = JobOutcome(str(ev.get("id")), FAILED), time.monotonic()
            elif kind == "phase" and current is not None:
                current.phase = ev.get("phase")
            elif kind == "result" and current is not None:
                current.status, current.record = OK, ev.get("record") or {}
                current.wall_s = ev.get("wall_s")
                _finish(res, current, on_job)
                current, job_t0 = None, time.monotonic()
            elif kind == "error" and current is not None:
                current.error, current.phase = ev.get("error"), ev.get("phase") or current.phase
        if probe.eof:
            rc = probe.proc.wait()
            if not greeted:
                return _no_hello(probe, res, jobs, start_timeout_s, on_job, hung=False, rc=rc)
            if current is not None:  # died mid-job
                current.status = FAILED
                current.wall_s = round(time.monotonic() - job_t0, 3)
                if not current.error:
                    current.error = f"the probe exited with {_rc_text(rc)}: {_last_line(probe.tail())}"
                _finish(res, current, on_job)
            return jobs


def _no_hello(probe, res, jobs, start_timeout_s, on_job, hung: bool, rc: int | None = None):
    why = (f"did not start within {start_timeout_s:g} s (CUDA initialisation or NVML hung?)" if hung
           else f"exited with {_rc_text(rc)} before reporting its GPUs: {_last_line(probe.tail())}")
    if jobs is None:  # the first probe: nothing measured, nothing to report but this
        raise CommdiagError(f"commdiag p2p: the probe process {why}; run  python -c 'import torch; "
                            "print(torch.cuda.device_count())'  with this Python to see why")
    for j in jobs:  # a later probe: what is left cannot run
        if j not in res.outcomes:
            _finish(res, JobOutcome(j, NOT_RUN, error=f"a new probe {why}"), on_job)
    return jobs


def _finish(res: Supervised, outcome: JobOutcome, on_job) -> None:
    res.outcomes[outcome.id] = outcome
    if on_job is not None:
        on_job(outcome)


def _rc_text(rc: int | None) -> str:
    if rc is None:
        return "no exit status"
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit status {rc}"


def _last_line(text: str) -> str:
    lines = [l for l in text.splitlines() if l.strip()]
    return lines[-1][-300:] if lines else "no output"
