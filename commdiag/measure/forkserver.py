"""One rank's launch server: imports torch and the worker once, then forks a fresh child per launch.

Started by serverpool.py as ``python -P -m commdiag.measure.forkserver`` (one per local rank, in
its own session, its environment the launch's less what a child may take after the fork, with the
pool's marker).  Its stdin and stdout are the control channel, one JSON document per line:

    commdiag -> server   {"launch": INDEX, "env": {...}, "plan": PATH, "log": PATH}
    server -> commdiag   {"ready": PID, "proof": PROOF}      once, after the imports (afterfork.Proof)
                         {"started": PID}                    the child of that launch is forked
                         {"refused": REASON}                 not clean any more, or the launch
                                                             changes a variable read before the
                                                             fork: nothing forked
                         {"exit": CODE or -SIGNAL, "pid": PID} the child ended (waitpid)

What the server may do before a fork: import torch, torch.distributed and commdiag.measure.worker
(and what they import).  Nothing that initialises CUDA, NCCL or NVML, and no thread: a child forked
from such a process reads every variable fresh when it initialises CUDA and NCCL itself, exactly
as a fresh process does (NCCL caches its variables per process, at first use; CUDA reads
CUDA_VISIBLE_DEVICES at cuInit).  Before every fork it checks that it still is so (``dirty``) and
refuses otherwise: the sweep then stops using servers for the rest of the run (fail closed).

Exact for every variable (afterfork.py): the server spies on its own ``os.environ`` reads from its
first line on, and a launch whose environment differs from the server's start environment in any
variable that is not proven unread before the fork (``Proof.safe``) is refused, not forked.
serverpool.py starts servers keyed so that this never happens; the refusal is the check that
makes a wrong key a refusal instead of a silently wrong child.

EOF on stdin (commdiag exited, kill -9 included) ends the server: it kills every child it started,
with its process group, and exits.

Test-only switch, honoured only when set: ``COMMDIAG_TEST_SERVER_DIRTY`` (in the server's own
environment) makes ``dirty`` report CUDA as initialised, to test the refusal and the fallback.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
import traceback

from .. import procs
from . import afterfork

TEST_DIRTY = "COMMDIAG_TEST_SERVER_DIRTY"
DROP_PREFIXES = ("TORCHELASTIC_",)  # torchrun's own agent variables: no agent here


def dirty() -> str | None:
    """Why forking now would not give a fresh process (None: it would)."""
    if os.environ.get(TEST_DIRTY):
        return f"torch.cuda is initialized in the launch server (test switch {TEST_DIRTY})"
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and cuda.is_initialized():
        return "torch.cuda is initialized in the launch server"
    if threading.active_count() != 1:
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.current_thread())
        return f"the launch server runs {threading.active_count()} threads ({names})"
    return None


def _reply(out, **msg) -> None:
    out.write((json.dumps(msg) + "\n").encode())
    out.flush()


class _State:
    """What the server knows of itself: its start environment, its spy, its torch build."""

    def __init__(self, start_env: dict[str, str], spy: afterfork.EnvironSpy | None, torch_version: str):
        self.start_env, self.spy, self.torch_version = start_env, spy, torch_version

    def proof(self) -> afterfork.Proof:
        return afterfork.Proof.of_server(self.spy or afterfork.EnvironSpy(), self.torch_version)


_STATE: _State | None = None


def child(env: dict, plan: str, log: str, close: list[int]) -> None:
    """In the forked child: a session of its own, output to the launch log, the launch's environment,
    then the worker; never returns.  ``close``: the server's descriptors (the control channel's
    write end, other children's pidfds): a child holding them would hide the server's death."""
    code = 1
    try:
        if _STATE is not None and _STATE.spy is not None:
            _STATE.spy.uninstall()  # the child's os.environ is the plain one again
        for fd in close:
            os.close(fd)
        os.setsid()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        # os.environ.clear/update go through unsetenv/putenv: libc's getenv (NCCL's) sees the same
        os.environ.clear()
        os.environ.update({k: v for k, v in env.items() if not k.startswith(DROP_PREFIXES)})
        from . import worker

        code = worker.main(["--plan", plan]) or 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def serve(inp, out) -> int:
    """The command loop: fork per launch command, report exits, end at EOF."""
    children: dict[int, int | None] = {}  # pid -> pidfd (None: polled)
    buf = b""
    _reply(out, ready=os.getpid(), proof=_STATE.proof().to_json() if _STATE else None)
    try:
        while True:
            fds = [inp] + [fd for fd in children.values() if fd is not None]
            timeout = 0.05 if any(fd is None for fd in children.values()) else None
            readable, _, _ = select.select(fds, [], [], timeout)
            for pid in list(children):
                got, status = os.waitpid(pid, os.WNOHANG)
                if got:
                    fd = children.pop(pid)
                    if fd is not None:
                        os.close(fd)
                    _reply(out, exit=_exit_code(status), pid=pid)
            if inp not in readable:
                continue
            data = os.read(inp, 1 << 20)
            if not data:
                return 0
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.strip():
                    _command(json.loads(line), children, out, inp)
    finally:
        for pid in children:  # forked here and not reaped: the pid is still this child's
            procs.signal_leader(pid, signal.SIGKILL)


def _command(cmd: dict, children: dict, out, inp: int) -> None:
    why = dirty() or _changes_read_variables(cmd["env"])
    if why:
        _reply(out, refused=why)
        return
    out.flush()
    pid = os.fork()
    if pid == 0:
        child(cmd["env"], cmd["plan"], cmd["log"], [out.fileno(), *(fd for fd in children.values() if fd is not None)])
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    children[pid] = fd
    _reply(out, started=pid)


def _changes_read_variables(env: dict) -> str | None:
    """Why ``env`` cannot be given to a child of this server: it changes a variable that is not
    proven unread before the fork (None: it changes none)."""
    if _STATE is None:
        return None
    proof = _STATE.proof()
    bad = proof.differing_unsafe(_STATE.start_env, env, ignore=DROP_PREFIXES)
    if not bad:
        return None
    shown = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
    return (f"the launch changes {shown}, not proven unread before the fork (torch {proof.torch}): "
            "a child would keep the server's value")


def main() -> int:
    global _STATE
    start_env = dict(os.environ)  # before the spy: this walk is the server's own, not an import's
    spy = afterfork.EnvironSpy().install()
    # Imported here, once, for every child: what a fresh worker would import itself (3 s on H200).
    import torch
    import torch.distributed  # noqa: F401

    from . import worker  # noqa: F401

    _STATE = _State(start_env, spy, str(torch.__version__))

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its own session; commdiag ends it by EOF or signal
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    # Nothing the server imports may write onto the control channel: stray output goes to stderr.
    os.dup2(2, 1)
    return serve(0, out)


if __name__ == "__main__":
    sys.exit(main())
