"""``explain RUN`` lives a run folder's life as sweep does (measure/runner.py): it works under the
folder's lock, records each launch's marker before it starts, and what a killed explain left running
is ended by the next command in the folder.  Real processes, real run folders; the nccl run is a
run.json as ``commdiag sweep`` writes it (sweep.new_run), so no GPU is needed to start explain's launch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from commdiag.errors import CommdiagError
from commdiag.formats import results
from commdiag.formats.spec import load_spec
from commdiag.measure import explain, launcher, runlock, sweep

from conftest import REPO, free_port, run_cli, words, write_spec


def nccl_run_folder(tmp_path, **spec_keys):
    """An nccl run folder as a sweep leaves it before its first launch."""
    spec = load_spec(write_spec(tmp_path / "s.yaml", backend="nccl", nproc_per_node=1, **spec_keys))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run = sweep.new_run(spec, run_dir, 1)
    results.save_run(run_dir, run)
    return run_dir


def read_run(run_dir):
    return json.loads((run_dir / "run.json").read_text())


def test_explain_refuses_a_folder_another_command_holds_and_leaves_run_json_alone(tmp_path):
    """A concurrent ``confirm`` (here: a process holding the folder's lock, as confirm does for its whole
    run) and explain both rewrote run.json: explain now waits for no one, it refuses at once, naming the
    holder, before any launch."""
    run_dir = nccl_run_folder(tmp_path)
    before = (run_dir / "run.json").read_bytes()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from commdiag.measure import runlock\n"
         f"with runlock.hold({str(run_dir)!r}):\n    print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CommdiagError) as e:
            explain.run_explain(run_dir)
        assert words(e.value) == words(f"{run_dir}: another commdiag process (pid {holder.pid}) is using this "
                                       "run folder; wait for it to finish, or stop it first")
    finally:
        holder.kill()
        holder.wait()
    assert (run_dir / "run.json").read_bytes() == before
    assert not (run_dir / "explain").exists()  # nothing launched


def wait_for(predicate, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out")


def marker_of_explain(run_dir):
    try:
        launches = read_run(run_dir).get("explain_launches") or []
    except ValueError:  # mid-replace: read again
        return None
    return next((l["marker"] for l in launches if l.get("marker")), None)


def test_a_killed_explain_leaves_its_marker_and_the_next_command_ends_its_torchrun(tmp_path):
    """kill -9 of ``commdiag explain`` mid-launch: its torchrun (here waiting for a second node that never
    comes, as a hung launch would) lives on; run.json names it by marker, and the next command in the
    folder (a confirm, which then refuses the unfinished screening) ends it."""
    run_dir = nccl_run_folder(tmp_path, nnodes=2, launch="torchrun", rdzv_endpoint=f"127.0.0.1:{free_port()}",
                              timeout_s=120, seed=7)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "commdiag.cli", "explain", str(run_dir)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        marker = wait_for(lambda: marker_of_explain(run_dir))
        wait_for(lambda: launcher.marked_pids(marker))  # its torchrun has started
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert launcher.marked_pids(marker), "torchrun outlives a kill -9 of commdiag (its own session)"
        assert read_run(run_dir)["explain_launches"][0]["status"] == "pending"
        done = run_cli("confirm", run_dir)
        assert done.returncode == 2 and "stage 1 (screening) is unfinished" in words(done.stderr), done.stderr
        assert wait_for(lambda: not launcher.marked_pids(marker), 10) is True
    finally:
        if proc.poll() is None:
            proc.kill()
        for l in (read_run(run_dir).get("explain_launches") or []):
            if l.get("marker"):
                launcher.kill_marked(l["marker"])


def test_reap_reads_explain_markers(tmp_path):
    marker = launcher.new_marker()
    assert runlock._markers({"launches": [], "explain_launches": [{"marker": marker}]}) == {marker}
    assert runlock._markers({"launches": {"not": "a list"}, "explain_launches": "nor this"}) == set()
