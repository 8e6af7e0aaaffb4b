"""One process per run folder and no orphaned launch, with real processes.

A child commdiag process holds the run folder's lock; a second one is refused with the holder's
pid; the lock dies with its holder (kill -9).  Orphans are real processes carrying a launch's
COMMDIAG_LAUNCH_ID, one of which ignores SIGTERM; no child survives a test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from commdiag.measure import launcher, runlock
from commdiag.errors import CommdiagError

from conftest import REPO

HOLDER = """
import sys, time
from commdiag.measure import runlock
with runlock.hold(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def _env(**extra):
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


@pytest.fixture
def children():
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def _holder(run_dir, children) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True, env=_env())
    children.append(p)
    assert p.stdout.readline().strip() == "held"
    return p


def test_second_process_is_refused_with_the_holders_pid(tmp_path, children):
    p = _holder(tmp_path, children)
    with pytest.raises(CommdiagError) as e:
        with runlock.hold(tmp_path):
            pass
    assert str(e.value) == (f"{tmp_path}: another commdiag process (pid {p.pid}) is using this run folder; "
                            "wait for it to finish, or stop it first")


def test_the_lock_dies_with_its_holder_and_leaves_nothing(tmp_path, children):
    p = _holder(tmp_path, children)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    with runlock.hold(tmp_path) as path:  # the stale file with a dead pid does not block
        assert path.read_text() == f"{os.getpid()}\n"
    assert list(tmp_path.iterdir()) == []


def test_the_lock_is_not_reentrant(tmp_path):
    with runlock.hold(tmp_path):
        with pytest.raises(CommdiagError, match=f"pid {os.getpid()}"):
            with runlock.hold(tmp_path):
                pass
    with runlock.hold(tmp_path):
        pass


def test_a_symlinked_lock_file_is_refused(tmp_path):
    (tmp_path / "elsewhere").write_text("x")
    (tmp_path / ".lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CommdiagError, match="symbolic link"):
        with runlock.hold(tmp_path):
            pass
    assert (tmp_path / "elsewhere").read_text() == "x"


def test_a_read_only_place_is_one_error(tmp_path):
    with pytest.raises(CommdiagError, match="cannot lock"):
        with runlock.hold(tmp_path / "missing"):
            pass


ORPHAN = """
import signal, sys, time
if sys.argv[1] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(120)
"""


def _orphan(children, marker: str, kind: str = "plain") -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", ORPHAN, kind], stdout=subprocess.PIPE, text=True,
                         env=_env(**{launcher.MARKER: marker}), start_new_session=True)
    children.append(p)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_reap_orphans_ends_marked_processes_only(children):
    mine, other = launcher.new_marker(), launcher.new_marker()
    run = {"launches": [{"index": 0, "status": "ok", "marker": mine},
                        {"index": 1, "status": "pending"},
                        {"index": 2, "status": "ok", "marker": "not-a-marker; rm -rf /"}]}
    plain, stubborn = _orphan(children, mine), _orphan(children, mine, "stubborn")
    bystander = _orphan(children, other)
    t0 = time.monotonic()
    killed = runlock.reap_orphans(run, grace_s=1.0)
    assert sorted(killed) == sorted([plain.pid, stubborn.pid])
    assert time.monotonic() - t0 < 5
    assert plain.wait(timeout=5) == -signal.SIGTERM
    assert stubborn.wait(timeout=5) == -signal.SIGKILL
    assert bystander.poll() is None
    assert runlock.reap_orphans(run, grace_s=1.0) == []


def test_launch_worker_uses_the_recorded_marker(tmp_path, monkeypatch):
    seen = {}

    def fake_run(argv, env, log_path, deadline_s):
        seen["marker"] = env[launcher.MARKER]
        return launcher.LaunchOutcome(0, False, 0.0, 0)

    monkeypatch.setattr(launcher, "run", fake_run)
    outcome, marker = launcher.launch_worker(tmp_path, {}, base_env={}, config_env={}, extra_env={}, nproc=2,
                                             nnodes=1, rdzv_endpoint=None, rdzv_id="x", deadline_s=1,
                                             marker="ab" * 16)
    assert marker == seen["marker"] == "ab" * 16
