"""commdiag p2p's deadlines with real probe processes: a pair that hangs is killed and reported hung,
the other pairs still run, Ctrl-C ends everything, and no process survives.  The probes run the
test-only fake GPUs (COMMDIAG_TEST_FAULT=p2p-fake:N, probe.py): the hardware is faked, the
processes, pipes, deadlines and kills are real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from commdiag.errors import CommdiagError
from commdiag.p2p import supervise
from commdiag.p2p.result import FAILED, HUNG, OK

from conftest import REPO, run_cli, words


def tagged_env(fault: str) -> tuple[dict, str]:
    """os.environ with the fault switch and a tag of our own, inherited by every process started."""
    tag = uuid.uuid4().hex
    return {**os.environ, "COMMDIAG_TEST_FAULT": fault, "COMMDIAG_TEST_TAG": tag}, tag


def survivors(tag: str) -> list[int]:
    needle = f"COMMDIAG_TEST_TAG={tag}".encode()
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def test_a_hung_pair_is_killed_reported_hung_and_the_other_pairs_still_run():
    env, tag = tagged_env("p2p-fake:3,p2p-hang:0-2")
    seen = []
    t0 = time.monotonic()
    res = supervise.supervise({}, job_timeout_s=2.0, env=env, on_job=lambda o: seen.append((o.id, o.status)))
    took = time.monotonic() - t0
    assert res.outcomes["0-2"].status == HUNG
    assert res.outcomes["0-2"].phase is None  # it hung before its first phase
    assert {k: o.status for k, o in res.outcomes.items() if k != "0-2"} == {
        "gpu0": OK, "gpu1": OK, "gpu2": OK, "0-1": OK, "1-2": OK, "final": OK}
    assert [i for i, _ in seen] == ["gpu0", "gpu1", "gpu2", "0-1", "0-2", "1-2", "final"]  # in order, once each
    assert res.probes == 2 and res.killed >= 1 and res.stuck == []
    assert 2.0 <= res.outcomes["0-2"].wall_s < 4.0 and took < 20
    assert survivors(tag) == []


def test_a_crash_fails_that_job_only_with_the_probes_words():
    env, tag = tagged_env("p2p-fake:2,p2p-crash:gpu1")
    res = supervise.supervise({}, job_timeout_s=10.0, env=env)
    out = res.outcomes["gpu1"]
    assert out.status == FAILED
    assert "exit status 3" in out.error and "crashing in job gpu1 on purpose" in out.error
    assert [res.outcomes[j].status for j in ("gpu0", "0-1", "final")] == [OK, OK, OK]
    assert survivors(tag) == []


def test_a_probe_that_never_says_hello_is_killed_and_is_one_error():
    env, tag = tagged_env("p2p-fake:2,p2p-hang-start")
    with pytest.raises(CommdiagError, match="did not start within 1.5 s"):
        supervise.supervise({}, job_timeout_s=5.0, start_timeout_s=1.5, env=env)
    assert survivors(tag) == []


def test_ctrl_c_during_a_hang_ends_commdiag_and_leaves_no_process():
    env, tag = tagged_env("p2p-fake:3,p2p-hang:0-1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    # started with SIGINT ignored, as a background job of a script is (that is how it hung in a suite
    # started with `&`): commdiag p2p takes Ctrl-C back, as sweep and ab do
    proc = subprocess.Popen([sys.executable, "-m", "commdiag.cli", "p2p", "--pair-timeout", "120"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        lines = []
        deadline = time.monotonic() + 60
        while not any(l.startswith("p2p: gpu2: ok") for l in lines) and time.monotonic() < deadline:
            lines.append(proc.stderr.readline())
        assert any(l.startswith("p2p: gpu2: ok") for l in lines), lines
        time.sleep(0.5)  # the probe is now in job 0-1, hanging
        assert len(survivors(tag)) == 2  # commdiag and its probe
        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground process
        rc = proc.wait(timeout=30)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc == 130 and "commdiag: interrupted" in err and "Traceback" not in err
    assert survivors(tag) == []


def test_cli_json_html_and_reload_with_fake_gpus(tmp_path):
    env = {"COMMDIAG_TEST_FAULT": "p2p-fake:2"}
    html = tmp_path / "p2p.html"
    proc = run_cli("p2p", "--json", "--html", html, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["format"] == "commdiag-p2p" and data["version"] == 1
    assert [p["status"] for p in data["pairs"]] == ["ok"] and data["pairs"][0]["p2p_ab"]["n"] == 3
    assert html.read_text().count("<script id=\"figs\"") == 1
    saved = tmp_path / "p2p.json"
    saved.write_text(proc.stdout)
    again = run_cli("p2p", "--from", saved, env={"COMMDIAG_TEST_FAULT": ""}, timeout=60)
    assert again.returncode == 0 and "P2P one way, GB/s" in again.stdout
    assert max(len(l) for l in again.stdout.splitlines()) <= 100


def test_without_a_gpu_the_cli_is_one_clear_error_exit_2():
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this machine has the CUDA driver: the no-GPU path cannot be shown here")
    except OSError:
        pass
    proc = run_cli("p2p", env={"COMMDIAG_TEST_FAULT": ""}, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("commdiag: error: commdiag p2p: no CUDA GPU to measure.")
    assert "Traceback" not in proc.stderr
    assert max(len(l) for l in proc.stderr.splitlines()) <= 100


def test_the_probe_says_why_torch_sees_no_gpu():
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    from commdiag.p2p.probe import CudaBackend

    hello = CudaBackend({}).hello()
    assert hello["count"] == 0 and ("without CUDA" in hello["reason"] or "no CUDA GPU" in hello["reason"])


def test_the_probe_never_imports_a_commdiag_from_the_current_folder(tmp_path, monkeypatch):
    """As root in a folder another user can write, a planted commdiag/ must not run in the probe."""
    planted = tmp_path / "commdiag"
    planted.mkdir()
    marker = tmp_path / "ran"
    (planted / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('planted code ran')\n")
    monkeypatch.chdir(tmp_path)
    env, tag = tagged_env("p2p-fake:2")
    env["PYTHONPATH"] = ""  # nothing but the probe's own path fix points at the real commdiag
    res = supervise.supervise({}, job_timeout_s=10.0, env=env)
    assert not marker.exists()
    assert {o.status for o in res.outcomes.values()} == {OK}
    assert survivors(tag) == []


def test_an_error_in_a_job_is_reported_with_its_place_and_the_rest_runs_in_a_new_probe():
    env, tag = tagged_env("p2p-fake:2,p2p-raise:0-1")
    res = supervise.supervise({}, job_timeout_s=10.0, env=env)
    out = res.outcomes["0-1"]
    assert out.status == FAILED and out.phase is None
    assert out.error.startswith("RuntimeError: commdiag test fault: an error in job 0-1 (at probe.py:")
    assert res.outcomes["final"].status == OK and res.probes == 2
    assert survivors(tag) == []


def test_bad_inputs_are_one_error_before_any_measurement(tmp_path):
    fifo = tmp_path / "page.html"
    os.mkfifo(fifo)
    r = run_cli("p2p", "--html", fifo, env={"COMMDIAG_TEST_FAULT": "p2p-fake:2"}, timeout=60)
    assert r.returncode == 2 and "FIFO" in r.stderr and "p2p:" not in r.stderr  # refused before any job ran
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps({"format": "commdiag-run", "version": 3}))
    r = run_cli("p2p", "--from", run_json, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "format: 'commdiag-run' is not a commdiag p2p result" in words(r.stderr)  # wrapped at 100 columns
