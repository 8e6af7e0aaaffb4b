"""procs.py, the one process supervisor, through the commands that start processes.

Real processes throughout: a stand-in torchrun agent (a ``torch.distributed.run`` module on
PYTHONPATH) that starts its worker in a session of its own, as torchrun does, and hangs; ab's real
server start beside a thread holding a lock; a parent killed with SIGKILL; as root, a throwaway
user (``useradd``) who owns a venv's site-packages or the caller's TMPDIR.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from commdiag import procs
from commdiag.errors import CommdiagError

from conftest import REPO

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (useradd, chown)")


def _dead(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet (it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture
def fake_torchrun(tmp_path, monkeypatch):
    """``python -m torch.distributed.run`` is this stand-in: it starts a worker (``sleep 8``) in a
    session of its own holding the agent's stdout, records where it ran, and hangs."""
    pkg = tmp_path / "fake" / "torch" / "distributed"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    record = tmp_path / "agent.json"
    (pkg / "run.py").write_text(textwrap.dedent(f"""\
        import json, os, subprocess, sys, time
        worker = subprocess.Popen(["sleep", "8"], start_new_session=True)
        with open({str(record)!r} + ".tmp", "w") as f:
            json.dump({{"argv": sys.argv, "worker": worker.pid, "cwd": os.getcwd()}}, f)
        os.rename({str(record)!r} + ".tmp", {str(record)!r})
        time.sleep(60)
        """))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    return record


def _worker_ended(record: Path) -> dict:
    assert record.exists(), "the stand-in agent did not start its worker within the deadline"
    seen = json.loads(record.read_text())
    assert _dead(seen["worker"]), "the worker in its own session survived the deadline"
    return seen


def test_check_env_nccl_past_its_deadline_returns_and_ends_the_workers(fake_torchrun, monkeypatch):
    # issue 28 item 2: the agent's group was killed, its worker (own session) lived on holding the
    # pipe, and communicate() waited for it: the 1.5 s deadline returned after 8 s
    from commdiag.environment import envcheck

    monkeypatch.setattr(envcheck, "NCCL_TIMEOUT_S", 1.5)
    t0 = time.monotonic()
    with pytest.raises(CommdiagError, match="did not come up within 2s"):
        envcheck.check_nccl({}, nproc=1)
    took = time.monotonic() - t0
    assert took < 1.5 + 3.0, f"returned after {took:.1f} s"
    _worker_ended(fake_torchrun)


def test_propagation_torchrun_past_its_deadline_returns_and_ends_the_workers(fake_torchrun, tmp_path, monkeypatch):
    from commdiag.environment import propagation

    monkeypatch.setattr(propagation, "TORCHRUN_TIMEOUT_S", 1.5)
    (tmp_path / "work").mkdir()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        propagation._torchrun_paths(["X"], tmp_path / "work", "late")
    took = time.monotonic() - t0
    assert took < 1.5 + 3.0, f"returned after {took:.1f} s"
    _worker_ended(fake_torchrun)


# ab's server start while another thread holds a lock: a child that ran Python between fork and exec
# (preexec_fn, which makes CPython run the at-fork hooks in the child) waits forever on the lock's copy.
_THREADED_START = """
import os, sys, threading, time
from pathlib import Path
from commdiag.ab import server
CWD = {"cwd": Path(sys.argv[3])} if "cwd" in server.start.__code__.co_varnames else {}  # (main had none)
held, up = threading.Lock(), threading.Event()
def sampler():  # like the machine-state thread: busy, holding a lock of its own
    with held:
        up.set()
        time.sleep(30)
threading.Thread(target=sampler, daemon=True).start()
up.wait()
os.register_at_fork(after_in_child=held.acquire)  # what a library's at-fork hook may do
t = time.monotonic()
p = server.start(["sleep", "30"], {**os.environ, "COMMDIAG_LAUNCH_ID": sys.argv[1]}, Path(sys.argv[2]), **CWD)
print(round(time.monotonic() - t, 3), p.pid, flush=True)
"""


def test_ab_server_start_beside_a_busy_thread_cannot_deadlock(tmp_path):
    marker = procs.new_marker()
    try:
        cp = subprocess.run([sys.executable, "-c", _THREADED_START, marker, str(tmp_path / "server.log"),
                             str(tmp_path)], capture_output=True, text=True, timeout=10,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    except subprocess.TimeoutExpired:
        pytest.fail("server.start never returned: its child hung between fork and exec")
    finally:
        procs.kill_marked(marker)
    assert cp.returncode == 0, cp.stderr[-2000:]


_PARENT = """
import os, sys, time
from pathlib import Path
from commdiag.ab import server
CWD = {"cwd": Path(sys.argv[3])} if "cwd" in server.start.__code__.co_varnames else {}  # (main had none)
p = server.start(["sleep", "60"], {**os.environ, "COMMDIAG_LAUNCH_ID": sys.argv[1]}, Path(sys.argv[2]), **CWD)
print(p.pid, flush=True)
time.sleep(60)
"""


def test_ab_server_dies_with_commdiag_killed_by_sigkill(tmp_path):
    marker = procs.new_marker()
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, marker, str(tmp_path / "server.log"), str(tmp_path)],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        pid = int(parent.stdout.readline())
        assert procs.carries_marker(pid, marker) and not _dead(pid)
        parent.kill()
        parent.wait(timeout=10)
        end = time.monotonic() + 10
        while not _dead(pid) and time.monotonic() < end:
            time.sleep(0.05)
        assert _dead(pid), "the server outlived commdiag's kill -9"
    finally:
        parent.kill()
        procs.kill_marked(marker)


def test_run_bounds_time_output_and_whatever_left_the_group(tmp_path):
    # the ladder's SIGTERM reaches the group; a process that left it (setsid) is found by the marker
    t0 = time.monotonic()
    end = procs.run(["sh", "-c", "setsid sleep 30 & echo started; exec sleep 30"], env=dict(os.environ),
                    cwd=tmp_path, deadline_s=1.0)
    assert end.timed_out and end.exit_code is None and end.stdout == b"started\n"
    assert end.stopped.signal == "SIGTERM" and end.killed_survivors == 1
    assert time.monotonic() - t0 < 1.0 + 2.0
    with pytest.raises(FileNotFoundError):  # a start that cannot exec raises as Popen does
        procs.start([str(tmp_path / "nothing-here")], env={}, cwd=tmp_path)


# --------------------------------------------------------------------------- as root

DEBIAN_PY = "/usr/bin/python3.11"


@pytest.fixture
def throwaway_user():
    name = "cdp" + uuid.uuid4().hex[:8]
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True, timeout=60)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], timeout=60)


@AS_ROOT
@pytest.mark.skipif(not os.path.exists(DEBIAN_PY), reason="needs Debian's python3.11 (runnable by any user)")
def test_doctor_probes_the_nccl_libraries_as_the_owner_trust_picked(throwaway_user):
    # issue 30 item 6: root's venv, its site-packages hers; the hook probe ran as her, and the NCCL
    # library probe (``PY -I``: .pth files still run) as root
    from commdiag.environment import doctor

    d = Path(tempfile.mkdtemp(prefix="commdiag-procs-", dir="/tmp"))  # 0700 pytest folders: she could not reach it
    try:
        d.chmod(0o755)
        log = d / "uids"
        log.touch()
        log.chmod(0o666)
        subprocess.run([DEBIAN_PY, "-m", "venv", "--without-pip", str(d / "v")], check=True, timeout=120)
        (sp,) = (d / "v").glob("lib/python3.*/site-packages")
        (sp / "uid-log.pth").write_text(f"import os; open({str(log)!r}, 'a').write('%d\\n' % os.getuid())\n")
        for p in (sp, sp / "uid-log.pth"):
            os.chown(p, throwaway_user.pw_uid, throwaway_user.pw_gid)
        report = doctor.doctor([str(d / "v" / "bin" / "python")], with_torch=False, sysfs_root=None)
        assert report.libs, "no interpreter's libraries were probed"
        seen = set(log.read_text().split())
        assert seen == {str(throwaway_user.pw_uid)}, f"started as uids {seen}"
    finally:
        shutil.rmtree(d)


@pytest.fixture
def their_tmpdir(tmp_path, throwaway_user, monkeypatch):
    """TMPDIR (sudo -E) is a world-writable folder of another user's: she could swap root's folder."""
    theirs = Path(tempfile.mkdtemp(prefix="commdiag-theirs-", dir="/tmp"))
    try:
        os.chown(theirs, throwaway_user.pw_uid, throwaway_user.pw_gid)
        theirs.chmod(0o777)
        monkeypatch.setenv("TMPDIR", str(theirs))
        monkeypatch.setattr(tempfile, "tempdir", None)
        assert tempfile.gettempdir() == str(theirs)
        yield theirs
        assert not list(theirs.iterdir()), "root wrote into her TMPDIR"
    finally:
        shutil.rmtree(theirs)


@AS_ROOT
def test_as_root_propagation_keeps_its_folders_out_of_a_tmpdir_another_user_can_change(their_tmpdir, monkeypatch):
    # issue 30 item 11: propagation's private folder (its scripts, the children's working folder) and
    # multiprocessing's forkserver socket folder; the fixture asserts her TMPDIR stays empty
    import multiprocessing

    from commdiag.environment import propagation

    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["forkserver"])  # the one with a folder
    r = propagation.check_propagation({}, torchrun=False)
    assert [p.path for p in r.paths if p.error] == ["multiprocessing fork", "multiprocessing spawn"]


@AS_ROOT
def test_as_root_private_folders_never_go_under_a_tmpdir_another_user_can_change(their_tmpdir, fake_torchrun,
                                                                                 tmp_path, monkeypatch):
    # issue 30 item 11: check-env --nccl's worker, install-hook's verification script, the tuner's build
    theirs = their_tmpdir
    try:
        assert procs.scratch_root() == "/tmp"
        # check-env --nccl's worker script and working folder
        from commdiag.environment import envcheck

        monkeypatch.setattr(envcheck, "NCCL_TIMEOUT_S", 1.0)
        with pytest.raises(CommdiagError):
            envcheck.check_nccl({}, nproc=1)
        seen = json.loads(fake_torchrun.read_text())
        assert Path(seen["cwd"]).parent == Path("/tmp") and seen["argv"][-2].startswith(seen["cwd"] + "/")
        # install-hook's verification script
        from commdiag.install import hookcheck

        where = tmp_path / "where"
        reply = hookcheck.run_fresh(sys.executable, "import sys; open(sys.argv[1], 'w').write(__file__)\n",
                                    [str(where)], env=dict(os.environ))
        assert "without a result" in reply["error"]  # not a verification: it only says where it ran
        assert Path(where.read_text()).parent.parent == Path("/tmp")
        # the tuner plugin's build folder (install-hook --tuner)
        from commdiag.install import hooktuner
        from commdiag.tuner import build

        built_in = []
        # (the compiler runs in its private output folder: build.compile_bytes)
        monkeypatch.setattr(build.procs, "run", lambda argv, **kw: built_in.append(kw["cwd"]) or 1 / 0)
        with pytest.raises(ZeroDivisionError):
            hooktuner.compile_library()
        assert Path(built_in[0]).parent == Path("/tmp")
    finally:
        assert not list(theirs.iterdir()), "root wrote into her TMPDIR"


# --------------------------------------------------------------------------- explain RUN

def _nccl_run(run_dir: Path, configs: dict) -> Path:
    """A run folder of an nccl spec (1 rank, 2 s deadline) as a sweep leaves it, nothing measured."""
    from commdiag.formats import results
    from commdiag.formats.spec import resolve
    from commdiag.measure import sweep

    spec = resolve({"name": "x", "backend": "nccl", "nproc_per_node": 1, "sizes": {"bytes": [4096]},
                    "timeout_s": 2, "configs": configs})
    run_dir.mkdir()
    results.save_run(run_dir, sweep.new_run(spec, run_dir, 1))
    return run_dir


def test_explain_takes_the_lock_and_its_launches_survive_no_kill_9(fake_torchrun, tmp_path, monkeypatch):
    # issue 28 item 3: explain wrote run.json without the run folder's lock and recorded no marker, so
    # a kill -9 left its torchrun (and the worker in its own session) for nobody to find
    from commdiag.formats import results
    from commdiag.measure import explain, runlock

    run_dir = _nccl_run(tmp_path / "run", {"proto": {"NCCL_PROTO": "LL"}})
    with runlock.hold(run_dir):
        with pytest.raises(CommdiagError, match="another commdiag process"):
            explain.run_explain(run_dir)
    assert not fake_torchrun.exists()  # refused before any start
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO), os.environ["PYTHONPATH"]))}
    first = subprocess.Popen([sys.executable, "-m", "commdiag.cli", "explain", str(run_dir)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 30
        while not fake_torchrun.exists() and time.monotonic() < end:
            time.sleep(0.05)
        assert fake_torchrun.exists(), "explain never started its launch"
        first.kill()  # kill -9 mid-launch: the agent and its worker live on
        first.wait(timeout=10)
        worker = json.loads(fake_torchrun.read_text())["worker"]
        assert not _dead(worker)
        run = results.load_run_json(run_dir)
        ended = runlock.reap_orphans(run)  # what the next explain, --resume or confirm does first
        assert worker in ended and _dead(worker)
    finally:
        first.kill()
        for m in results.load_run_json(run_dir).get("explain_markers") or []:
            procs.kill_marked(m)


@AS_ROOT
def test_as_root_explain_takes_no_loader_variable_from_run_json(fake_torchrun, tmp_path):
    # issue 30 item 5: a config's LD_PRELOAD in run.json reached the torchrun explain started as root
    from commdiag.measure import explain

    run_dir = _nccl_run(tmp_path / "run", {"evil": {"LD_PRELOAD": str(tmp_path / "evil.so")}})
    with pytest.raises(CommdiagError, match="config 'evil' sets LD_PRELOAD"):
        explain.run_explain(run_dir)
    assert not fake_torchrun.exists()  # nothing started


def test_signal_leader_reaches_only_a_process_that_still_carries_the_marker(tmp_path):
    g = procs.start(["sleep", "30"], env=dict(os.environ), cwd=tmp_path, parent_death=None)
    try:
        assert not procs.signal_leader(g.pid, signal.SIGKILL, procs.new_marker())  # another launch's pid
        assert g.wait(0.2) is None
        assert procs.signal_leader(g.pid, signal.SIGKILL, g.marker)
        assert g.wait(5) == -signal.SIGKILL
    finally:
        g.stop(())
