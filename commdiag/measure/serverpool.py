"""The launch servers of one run (``launch: forkserver``): groups of one per local rank, over pipes.

The sweep starts the pool at its first launch and keeps it for the run.  A group's servers are
started with the launch's environment less the variables a child may take after the fork
(afterfork.py); a launch that differs from every live group in anything else gets a group of its
own (``ServerPool``), so no child ever runs with a value its server read before the fork.  Per launch it sends every
rank's server the launch's environment (the user's, the config's, NCCL's debug settings, the rank
variables torchrun would set, a fresh MASTER_PORT: rank 0's child hosts the TCPStore as ``env://``
does), waits for every child's exit or the deadline, and returns a launcher.LaunchOutcome, as a
torchrun launch does.  torchrun's semantics are kept: when one rank's child exits non-zero the
others are ended; past the deadline every child's process group gets SIGTERM, a grace period,
then SIGKILL.  A server that dies or stops answering is killed and the pool starts afresh at the
next launch.

Why no torchrun here: its agent is one more ``import torch`` per launch, and it would need a socket
or file to reach the servers; pipes need no file anyone can swap, and EOF on a server's stdin tells
it that its commdiag is gone (kill -9 included): it then kills its children and exits.

Markers: a forked child's /proc/PID/environ is its server's start environment, so every process of
the pool carries the pool's ``COMMDIAG_LAUNCH_ID`` (``marker``).  The sweep records it as each
launch's marker before the launch, so runlock.reap_orphans finds servers and children after a kill
-9, and the machine-state sampler counts them as this run's.  Every pid is checked to still carry
the marker before it is signalled.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
from pathlib import Path

from .. import procs
from ..childpython import module_argv
from . import afterfork, launcher
from .forkserver import DROP_PREFIXES

START_TIMEOUT_S = 300.0  # a server's imports (torch: 3 s on H200; minutes on a loaded small box)
ANSWER_TIMEOUT_S = 30.0  # for "started"/"refused" after a launch command
LOG_NAME = "launch.log"  # every rank's child output, appended (a torchrun launch writes torchrun.log)


class ServerRefused(Exception):
    """A server found itself no longer clean (CUDA initialised, a thread): nothing was forked."""


class PoolBroken(Exception):
    """A server could not be started or did not answer as it must."""

    def __init__(self, why: str, timed_out: bool = False):
        super().__init__(why)
        self.timed_out = timed_out


def rank_env(base: dict[str, str], rank: int, nproc: int, port: int) -> dict[str, str]:
    """The variables torchrun's agent gives a single-node worker (local_elastic_agent), no agent's own."""
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
           "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": str(nproc), "WORLD_SIZE": str(nproc),
           "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port),
           "TORCH_NCCL_ASYNC_ERROR_HANDLING": base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")}
    return env


def process_defaults(env: dict[str, str], nproc: int) -> dict[str, str]:
    """What torchrun sets for the whole process before any import: OMP_NUM_THREADS=1 with more
    than one rank per node, unless ``env`` sets it (OpenMP reads it when the library loads, so a
    server needs it in its own start environment)."""
    return {} if "OMP_NUM_THREADS" in env or nproc <= 1 else {"OMP_NUM_THREADS": "1"}


class _Server:
    def __init__(self, rank: int, group: procs.Group):
        self.rank, self.group, self.proc = rank, group, group.proc
        self.buf = b""
        self.child: int | None = None
        self.exit: int | None = None
        self.proof: afterfork.Proof | None = None  # what it reported when ready

    def fileno(self) -> int:
        return self.proc.stdout.fileno()


class _Group:
    """One launch server per rank, every one started with ``start_env``.  It serves a launch whose
    environment differs from ``start_env`` only in variables its servers proved unread before the
    fork (afterfork.Proof.safe); ``key`` is what the run records of it."""

    def __init__(self, index: int, start_env: dict[str, str], key: dict[str, str]):
        self.index, self.start_env, self.key = index, start_env, key
        self.servers: list[_Server] = []

    def unsafe_changes(self, envs: list[dict[str, str]]) -> list[str]:
        """The variables of ``envs`` (one per rank) that a child of this group could not take."""
        bad: set[str] = set()
        for s, env in zip(self.servers, envs):
            if s.proof is None:
                return ["(no proof reported)"]
            bad.update(s.proof.differing_unsafe(self.start_env, env, ignore=DROP_PREFIXES))
        return sorted(bad)


class ServerPool:
    """Launch servers sharing one marker, in groups of ``nproc`` (one per rank) keyed by their start
    environment; started lazily, restarted after a failure.

    Exact for every variable: a launch runs on a group whose start environment it differs from only in
    variables the servers proved unread before the fork (afterfork.py: NCCL_*, the rendezvous
    variables, ... minus whatever the imports read); any other difference (TORCH_DISTRIBUTED_DEBUG,
    LD_PRELOAD, OMP_NUM_THREADS, ...) gets a group started with it.  A sweep that sets only NCCL_*
    variables runs on one group; at most ``MAX_GROUPS`` live at once (the least recently used is
    closed)."""

    MAX_GROUPS = 4

    def __init__(self, nproc: int, base_env: dict[str, str], stderr_path: Path | None = None):
        self.nproc, self.base_env = nproc, dict(base_env)
        self.stderr_path = stderr_path
        # the servers' working folder, one commdiag chose: the run folder (or / without one)
        self.cwd = stderr_path.parent if stderr_path else Path("/")
        self.marker = procs.new_marker()  # the one the next started servers will carry
        self.groups: list[_Group] = []  # the least recently used first
        self.servers: list[_Server] = []  # the group of the launch under way
        self.proof: afterfork.Proof | None = None  # the last one a server reported: keys new groups
        self.started: list[dict] = []  # every group started, for run.json (launch.server_groups)
        self.last_group: int | None = None  # the group index of the last launch

    # -- life cycle ------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return bool(self.groups)

    def server_pids(self) -> set[int]:
        return {s.proc.pid for g in self.groups for s in g.servers}

    def _start_group(self, start_env: dict[str, str], timeout_s: float) -> _Group:
        while len(self.groups) >= self.MAX_GROUPS:
            self._close_group(self.groups.pop(0))
        group = _Group(len(self.started), start_env, {})
        self.groups.append(group)
        self.started.append({"index": group.index})
        argv = module_argv("commdiag.measure.forkserver")
        for rank in range(self.nproc):
            # No parent-death signal: a server killed with its commdiag could not end its children;
            # EOF on its stdin (which commdiag's death gives too) makes it end them, then exit.
            try:
                started = procs.start(argv, env=start_env, cwd=self.cwd, marker=self.marker, stdin=procs.PIPE,
                                      stdout=procs.PIPE, stderr=self.stderr_path or procs.DEVNULL, append=True,
                                      parent_death=None)
            except OSError as e:
                self.close()
                raise PoolBroken(f"launch server of rank {rank} could not start: {e}")
            group.servers.append(_Server(rank, started))
        deadline = time.monotonic() + timeout_s
        for s in group.servers:
            msg = self._read(s, deadline)
            if msg is None or "ready" not in msg:
                late = time.monotonic() >= deadline
                self.close()
                raise PoolBroken(f"launch server of rank {s.rank} did not start"
                                 + (f" within {timeout_s:g} s" if late else "")
                                 + (f" (see {self.stderr_path})" if self.stderr_path else ""), timed_out=late)
            if isinstance(msg.get("proof"), dict):
                s.proof = self.proof = afterfork.Proof.from_json(msg["proof"])
        # what tells this group apart: the launch's variables beyond the user's (commdiag's own marker,
        # path and process defaults aside) that no child may change
        defaults = process_defaults(self.base_env, self.nproc)
        group.key = {k: v for k, v in start_env.items() if self.base_env.get(k) != v and defaults.get(k) != v
                     and k not in (procs.MARKER, "PYTHONPATH") and not (self.proof and self.proof.safe(k))}
        self.started[-1].update(key=group.key, proof=self.proof.to_json() if self.proof else None)
        return group

    def _group_for(self, envs: list[dict[str, str]], deadline: float) -> _Group:
        """The group that serves this launch (``envs``: each rank's environment): a live one, else one
        started for it (its start environment: rank 0's without the variables proven unread before
        the fork; the rank variables differ between ranks, and are among those)."""
        base = envs[0]
        for g in reversed(self.groups):
            if not g.unsafe_changes(envs):
                self.groups.remove(g)
                self.groups.append(g)
                return g
        bad: list[str] = []
        for _attempt in range(3):  # later ones with what the servers just started proved
            proof = self.proof
            # candidates out of the start environment unless a server proved them read: a whole-
            # environment walk at import (CUDA torch has one) then sees none of a config's NCCL_*
            start_env = {k: v for k, v in base.items()
                         if not (proof.safe(k) if proof is not None else afterfork.is_candidate(k))}
            g = self._start_group(start_env, max(0.0, min(START_TIMEOUT_S, deadline - time.monotonic())))
            bad = g.unsafe_changes(envs)
            if not bad:
                return g
            self.groups.remove(g)  # it proved more read than assumed: of no use for this launch
            self._close_group(g)
            self.started[g.index]["closed"] = f"read before the fork: {', '.join(bad[:8])}"
        raise ServerRefused(f"a launch server cannot take {', '.join(bad[:8])} after the fork, even when "
                            "started with them")

    def _close_group(self, group: _Group) -> None:
        """EOF to each server of ``group`` (it kills its children and exits), SIGKILL if it lingers."""
        for s in group.servers:
            try:
                s.proc.stdin.close()
            except OSError:
                pass
        end = time.monotonic() + procs.KILL_GRACE_S
        for s in group.servers:
            if s.group.wait(end - time.monotonic()) is None:
                s.group.stop((), sweep=False)  # SIGKILL; its children are the pool's marker sweep's
            s.group.close()

    def close(self) -> int:
        """End every server (EOF first: it kills its children), then anything left with the marker;
        returns how many such leftovers were killed."""
        for g in self.groups:
            self._close_group(g)
        killed = 0
        if self.groups:
            killed = procs.kill_marked(self.marker, procs.KILL_GRACE_S)  # children of a server that was killed
            self.marker = procs.new_marker()
        self.groups, self.servers = [], []
        return killed

    # -- one launch ------------------------------------------------------------------------------

    def launch(self, index: int, config_env: dict[str, str], extra_env: dict[str, str], plan_path: Path,
               deadline_s: float) -> launcher.LaunchOutcome:
        """Run one launch on the servers (starting them first if needed).  Raises ServerRefused
        (nothing of the launch left running) when a server is no longer clean."""
        t0 = time.monotonic()
        log = plan_path.parent / LOG_NAME
        log.touch()
        try:
            return self._launch(index, config_env, extra_env, plan_path, log, t0, deadline_s)
        except KeyboardInterrupt:
            self._end_children()
            self.close()
            return launcher.LaunchOutcome(None, False, time.monotonic() - t0, 0, interrupted=True)
        except PoolBroken as e:
            with open(log, "a") as f:
                f.write(f"commdiag: {e}\n")
            return launcher.LaunchOutcome(None, e.timed_out, time.monotonic() - t0, 0)

    def _launch(self, index, config_env, extra_env, plan_path, log, t0, deadline_s) -> launcher.LaunchOutcome:
        port = procs.free_port()
        base = launcher.launch_env(self.base_env, config_env, {**extra_env, procs.MARKER: self.marker})
        base.update(process_defaults(base, self.nproc))
        envs = [{**base, **rank_env(base, rank, self.nproc, port)} for rank in range(self.nproc)]
        # the launch's deadline covers a group's start, as a torchrun launch's covers its imports
        group = self._group_for(envs, t0 + deadline_s)
        self.servers, self.last_group = group.servers, group.index
        plan_path, log = plan_path.resolve(), log.resolve()
        for s, env in zip(self.servers, envs):
            s.child = s.exit = None
            cmd = {"launch": index, "env": env, "plan": str(plan_path), "log": str(log)}
            try:
                s.proc.stdin.write((json.dumps(cmd) + "\n").encode())
                s.proc.stdin.flush()
            except OSError:
                killed = self._broken(log, f"launch server of rank {s.rank} is gone")
                return launcher.LaunchOutcome(None, False, time.monotonic() - t0, killed)
        answer_by = time.monotonic() + ANSWER_TIMEOUT_S
        refused = []
        for s in self.servers:
            msg = self._read(s, answer_by)
            if msg is None:
                killed = self._broken(log, f"launch server of rank {s.rank} did not answer")
                return launcher.LaunchOutcome(None, False, time.monotonic() - t0, killed)
            if "refused" in msg:
                refused.append(f"rank {s.rank}: {msg['refused']}")
            elif isinstance(msg.get("started"), int):
                s.child = msg["started"]
            else:
                killed = self._broken(log, f"launch server of rank {s.rank} answered {str(msg)[:200]!r}")
                return launcher.LaunchOutcome(None, False, time.monotonic() - t0, killed)
        if refused:
            self._end_children()
            self.close()
            raise ServerRefused("; ".join(refused))
        return self._supervise(log, t0, deadline_s)

    def _supervise(self, log: Path, t0: float, deadline_s: float) -> launcher.LaunchOutcome:
        deadline = t0 + deadline_s
        timed_out = False
        failed: int | None = None
        while any(s.exit is None for s in self.servers):
            for s in self.servers:  # messages already read with an earlier one: select won't see them
                while s.exit is None and b"\n" in s.buf:
                    failed = self._on_message(s, self._read(s, 0.0), failed)
            if all(s.exit is not None for s in self.servers):
                break
            left = deadline - time.monotonic()
            if left <= 0 and not timed_out:
                timed_out = True
                self._end_children()
                deadline = time.monotonic() + 2 * procs.KILL_GRACE_S + ANSWER_TIMEOUT_S
                continue
            if left <= 0:  # past the grace period too: a server that does not report is broken
                killed = self._broken(log, "a launch server did not report its child's exit")
                return launcher.LaunchOutcome(None, timed_out, time.monotonic() - t0, killed)
            waiting = [s for s in self.servers if s.exit is None]
            ready, _, _ = select.select(waiting, [], [], min(left, 1.0))
            for s in ready:
                msg = self._read(s, time.monotonic() + ANSWER_TIMEOUT_S)
                if msg is None:
                    killed = self._broken(log, f"launch server of rank {s.rank} died")
                    return launcher.LaunchOutcome(None, timed_out, time.monotonic() - t0, killed)
                failed = self._on_message(s, msg, failed)
        killed = self._killed()
        code = None if timed_out else (failed if failed is not None else 0)
        return launcher.LaunchOutcome(code, timed_out, time.monotonic() - t0, killed)

    def _on_message(self, s: _Server, msg: dict | None, failed: int | None) -> int | None:
        if msg and "exit" in msg:
            s.exit = int(msg["exit"])
            if s.exit != 0 and failed is None:
                failed = s.exit
                # torchrun's rule: one rank failed, the launch is over for every rank
                self._end_children()
        return failed

    # -- helpers ---------------------------------------------------------------------------------

    def _read(self, s: _Server, deadline: float) -> dict | None:
        """The server's next message; None at EOF, on garbage, or past ``deadline``."""
        while b"\n" not in s.buf:
            left = deadline - time.monotonic()
            if left < 0:
                return None
            ready, _, _ = select.select([s], [], [], left)
            if not ready:
                return None
            data = os.read(s.fileno(), 65536)
            if not data:
                return None
            s.buf += data
        line, s.buf = s.buf.split(b"\n", 1)
        try:
            msg = json.loads(line)
        except ValueError:
            return None
        return msg if isinstance(msg, dict) else None

    def _end_children(self) -> None:
        """SIGTERM to every running child's process group, a grace period, SIGKILL (torchrun's way)."""
        live = [s.child for s in self.servers if s.child is not None and s.exit is None]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            live = [p for p in live if procs.signal_leader(p, sig, self.marker)]
            end = time.monotonic() + procs.KILL_GRACE_S
            while live and time.monotonic() < end:
                time.sleep(0.05)
                live = [p for p in live if procs.carries_marker(p, self.marker)]
            if not live:
                return

    def _killed(self) -> int:
        """Kill whatever carries the marker but is no server (a child that left its group)."""
        servers = self.server_pids()
        count = 0
        for pid in procs.marked_pids(self.marker):
            if pid not in servers and procs.signal_leader(pid, signal.SIGKILL, self.marker):
                count += 1
        return count

    def _broken(self, log: Path, why: str) -> int:
        """Say why in the launch's log, end its children and the servers; returns close()'s count."""
        with open(log, "a") as f:
            f.write(f"commdiag: {why}; the launch servers are restarted for the next launch\n")
        self._end_children()
        return self.close()
