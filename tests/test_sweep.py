"""The sweep engine end to end with real torchrun launches on gloo (nothing mocked)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from commdiag.measure import launcher
from commdiag.formats.results import load_run

from conftest import REPO, free_port, one_message, run_cli, write_spec


def read_run(run_dir):
    return json.loads((run_dir / "run.json").read_text())


def wait_for_a_finished_launch(out, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if any(l["status"] == "ok" for l in read_run(out)["launches"]):
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)


def survivors(run):
    return [pid for l in run["launches"] if l.get("marker") for pid in launcher.marked_pids(l["marker"])]


# The sweep's fault tests run under both launch methods (docs/launch-methods.md).
METHODS = pytest.mark.parametrize("method", ["forkserver", "torchrun"])


def launched_by(run, method):
    """Every launch that ran was started by ``method``, as run.json records."""
    assert run["launch"]["method"] == method
    assert {l["launched_by"] for l in run["launches"] if l["status"] != "pending"} == {method}


def test_smoke_sweep_writes_every_file_and_records_env(tmp_path):
    out = tmp_path / "run"
    spec = write_spec(tmp_path / "s.yaml", trials=2, base_env={"NCCL_NVLS_ENABLE": "0"},
                      configs={"ll": {"NCCL_PROTO": "LL", "NCCL_BUFFSIZE": 16777216}})
    proc = run_cli("sweep", spec, "--out", out, "--no-confirm")
    assert proc.returncode == 0, proc.stderr
    assert "busbw" in proc.stdout and "ETA" in proc.stderr
    run = read_run(out)
    assert run["format"] == "commdiag-run" and run["version"] == 7 and run["state"] == "complete"
    assert [l["status"] for l in run["launches"]] == ["ok"] * 4
    # only NCCL_* variables differ between the configs: one group of launch servers for the run
    assert [g["key"] for g in run["launch"]["server_groups"]] == [{}]
    assert {l["server_group"] for l in run["launches"]} == {0}
    # the machine's state: gloo uses no GPU, said once per run; each launch only says "not read"
    assert run["machine_state"] == {"available": False,
                                    "reason": "backend gloo: the launches use no GPU, so no GPU state is read"}
    assert [l["machine"] for l in run["launches"]] == [{"available": False}] * 4
    assert ("machine state during the launches: not recorded (backend gloo: the launches use no GPU, so no "
            "GPU state is read)") in " ".join(proc.stdout.split())  # wrapped at 100 columns
    assert max(len(line) for line in proc.stdout.splitlines() if line.startswith("machine")) <= 100
    # interleaved: each round runs both configs once
    assert sorted(l["config"] for l in run["launches"][:2]) == ["default", "ll"]
    with open(out / "samples.csv") as f:
        rows = list(csv.DictReader(f))
    # 4 launches x 2 sizes x 1 mode (eager) x 5 iterations
    assert len(rows) == 4 * 2 * 5
    assert set(rows[0]) == {"config", "trial", "launch", "size_bytes", "tokens", "mode", "via", "iteration", "time_us",
                            "enqueue_us"}
    assert {r["via"] for r in rows} == {"torch"}
    assert all(float(r["time_us"]) > 0 for r in rows)
    with open(out / "summary.csv") as f:
        summary = list(csv.DictReader(f))
    assert len(summary) == 2 * 2  # configs x sizes x modes
    assert {int(r["launches"]) for r in summary} == {2} and {r["wrong"] for r in summary} == {"0"}
    # what each worker saw matches its config, in os.environ and in libc getenv
    for launch in run["launches"]:
        expected = next(c["env"] for c in run["configs"] if c["name"] == launch["config"])
        assert len(launch["ranks"]) == 2
        for rank in launch["ranks"]:
            assert {k: v["environ"] for k, v in rank["env_seen"].items()} == expected
            assert {k: v["getenv"] for k, v in rank["env_seen"].items()} == expected
    assert run["fingerprint"]["worker"]["torch"]
    assert "graph" not in run["method"] and "wall time" in run["method"]["eager"]  # gloo: per-call wall time
    assert not survivors(run)


@METHODS
def test_hang_crash_and_wrong_launches_are_recorded_and_killed(tmp_path, method):
    out = tmp_path / "run"
    spec = write_spec(tmp_path / "s.yaml", timeout_s=25, launch=method, configs={
        "hang": {"COMMDIAG_TEST_FAULT": "hang"},
        "crash": {"COMMDIAG_TEST_FAULT": "crash"},
        "wrong": {"COMMDIAG_TEST_FAULT": "wrong"},
    })
    proc = run_cli("sweep", spec, "--out", out, "--no-confirm")
    assert proc.returncode == 3, proc.stderr  # some launches failed
    run = read_run(out)
    status = {l["config"]: l for l in run["launches"]}
    assert status["default"]["status"] == "ok"
    assert status["hang"]["status"] == "timeout" and status["hang"]["timed_out"]
    assert status["hang"]["wall_s"] < 25 + 2 * launcher.KILL_GRACE_S + 5
    assert status["crash"]["status"] == "failed" and status["crash"]["exit_code"] != 0
    assert "crashing rank 0 on purpose" in status["crash"]["stderr_tail"]
    assert status["wrong"]["status"] == "incorrect" and status["wrong"]["wrong"] > 0
    # the good launch's samples survived the bad ones
    configs_with_samples = {r["config"] for r in csv.DictReader(open(out / "samples.csv"))}
    assert {"default", "wrong"} <= configs_with_samples and "hang" not in configs_with_samples
    launched_by(run, method)
    assert not survivors(run)


@METHODS
def test_teardown_hang_is_a_timeout_with_complete_results(tmp_path, method):
    out = tmp_path / "run"
    spec = write_spec(tmp_path / "s.yaml", timeout_s=20, launch=method,
                      configs={"td": {"COMMDIAG_TEST_FAULT": "hang-teardown"}})
    proc = run_cli("sweep", spec, "--out", out, "--set", "trials=1", "--no-confirm")
    assert proc.returncode == 3
    run = read_run(out)
    td = next(l for l in run["launches"] if l["config"] == "td")
    assert td["status"] == "timeout" and td["results_complete"] and "teardown" in td["error"]
    launched_by(run, method)
    assert not survivors(run)


@METHODS
def test_interrupt_then_resume_does_not_redo_finished_launches(tmp_path, method):
    out = tmp_path / "run"
    spec = write_spec(tmp_path / "s.yaml", trials=2, launch=method, configs={"b": {"NCCL_PROTO": "Simple"}})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "commdiag.cli", "sweep", str(spec), "--out", str(out), "--no-confirm"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_a_finished_launch(out)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    run = read_run(out)
    assert run["state"] == "interrupted"
    assert not (out / "report.html").exists() and not list(out.glob("profile*.env"))  # no verdicts from part of a run
    done = {l["index"]: (out / "launches" / f"{l['index']:04d}" / "result.json").read_bytes()
            for l in run["launches"] if l["status"] == "ok"}
    assert 1 <= len(done) < 4 and "pending" in {l["status"] for l in run["launches"]}
    assert not survivors(run)

    resumed = run_cli("sweep", "--resume", out)
    assert resumed.returncode == 0, resumed.stderr
    run = read_run(out)
    assert run["state"] == "complete" and [l["status"] for l in run["launches"]] == ["ok"] * 4
    assert (out / "report.html").exists()
    for index, content in done.items():  # finished launches were not redone
        assert (out / "launches" / f"{index:04d}" / "result.json").read_bytes() == content
    assert len(load_run(out).samples) == 4 * 2 * 5
    launched_by(run, method)  # --resume uses the method recorded in run.json
    assert not survivors(run)


def test_two_torchrun_agents_rendezvous_on_localhost(tmp_path):
    port = free_port()
    # launch: torchrun with a rendezvous: a commdiag per node (without it nnodes 2 means a Slurm
    # allocation); the nodes share the seed the spec names (issue 37: never derived from the spec)
    spec = write_spec(tmp_path / "s.yaml", nproc_per_node=1, nnodes=2, rdzv_endpoint=f"127.0.0.1:{port}",
                      timeout_s=90, configs={"b": {"NCCL_PROTO": "LL"}}, launch="torchrun", seed=1234)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    agents = [subprocess.Popen([sys.executable, "-m", "commdiag.cli", "sweep", str(spec), "--out",
                                str(tmp_path / f"node{i}"), "--no-confirm"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for i in range(2)]
    outputs = [a.communicate(timeout=300) for a in agents]
    for a, (_, err) in zip(agents, outputs):
        assert a.returncode == 0, err
    runs = [read_run(tmp_path / f"node{i}") for i in range(2)]
    assert runs[0]["seed"] == runs[1]["seed"]  # both nodes drew the same order
    for run in runs:
        assert run["world_size"] == 2
        for launch in run["launches"]:
            assert launch["status"] == "ok"
            assert [r["rank"] for r in launch["ranks"]] == [0, 1]  # every node has every rank's result


def test_nccl_spec_without_gpu_suggests_cpu_smoke(tmp_path):
    proc = run_cli("sweep", REPO / "sweeps" / "nvlink2.yaml", "--out", tmp_path / "r")
    assert proc.returncode == 2
    assert "cpu-smoke.yaml" in proc.stderr and "GPU" in proc.stderr
    assert not (tmp_path / "r").exists()  # nothing started


def test_bad_spec_exits_2_before_any_launch(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", configs={"x": {"NCCL_NTHREADS": 100}})
    proc = run_cli("sweep", spec, "--out", tmp_path / "r")
    assert proc.returncode == 2
    assert "configs.x.NCCL_NTHREADS" in proc.stderr and "64, 128, 256, 512" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_resume_refuses_a_spec_set_or_out_it_would_ignore(tmp_path):
    # --resume continues the run's recorded spec; a SPEC, --set or --out beside it used to be dropped silently
    spec = write_spec(tmp_path / "s.yaml")
    folder = tmp_path / "run"
    folder.mkdir()
    for extra in ([spec], ["--set", "trials=5"], ["--out", tmp_path / "other"]):
        proc = run_cli("sweep", *extra, "--resume", folder)
        assert proc.returncode == 2, (extra, proc.stderr)
        assert "--resume" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "other").exists()


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="Linux /proc")
def test_marked_pids_finds_a_marked_child():
    marker = launcher.new_marker()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, launcher.MARKER: marker})
    try:
        assert launcher.marked_pids(marker) == [child.pid]
        assert launcher.kill_marked(marker) == 1
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        child.kill()


def test_ranks_agree_on_one_batch_count(tmp_path):
    """Each rank estimates its own call time; the batch must be the same on every rank or
    the ranks issue different numbers of collectives and hang (seen on 2x H200).  Two real gloo ranks,
    forked from one process that imported torch once (as the fork server starts them)."""
    script = tmp_path / "agree.py"
    script.write_text(
        "import os, sys, torch, torch.distributed as dist\n"
        "from commdiag.measure.worker import make_agree\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=sys.argv[2], WORLD_SIZE='2')\n"
        "pids = []\n"
        "for rank in (0, 1):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os.environ['RANK'] = str(rank)\n"
        "        dist.init_process_group('gloo')\n"
        "        agree = make_agree(torch, dist, dist.new_group(backend='gloo'))\n"
        "        open(os.path.join(sys.argv[1], f'r{rank}'), 'w').write(str(agree(rank * 10 + 5)))\n"
        "        dist.destroy_process_group()\n"
        "        os._exit(0)\n"
        "    pids.append(pid)\n"
        "sys.exit(max(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) != 0 for p in pids))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cp = subprocess.run([sys.executable, str(script), str(tmp_path), str(free_port())], env=env,
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert [(tmp_path / f"r{r}").read_text() for r in (0, 1)] == ["15", "15"]


def test_reuse_process_runs_per_communicator_settings_in_one_process(tmp_path, monkeypatch):
    # ll, simple and tree differ from default only in NCCL_PROTO/NCCL_ALGO: with reuse_process one process
    # per trial runs all four (each with its own communicators), in the round's shuffled order.  The
    # user's own NCCL_ALGO reaches every run that does not set it.  (A config that changes a per-process
    # variable makes every launch its own process: all or none, test_familywise.py.)
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    out = tmp_path / "run"
    spec = write_spec(tmp_path / "s.yaml", trials=2, reuse_process=True, configs={
        "ll": {"NCCL_PROTO": "LL"}, "simple": {"NCCL_PROTO": "Simple"}, "tree": {"NCCL_ALGO": "Tree"}})
    proc = run_cli("sweep", spec, "--out", out, "--no-confirm")
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    launches = run["launches"]
    assert [l["status"] for l in launches] == ["ok"] * 8
    processes: dict = {}
    for l in launches:
        processes.setdefault(l["process"], []).append(l)
    assert len(processes) == 2  # per trial: {default, ll, simple, tree}
    for members in processes.values():
        assert len({l["trial"] for l in members}) == 1
        names = {l["config"] for l in members}
        assert names == {"default", "ll", "simple", "tree"}
        assert {l["process_runs"] for l in members} == {len(members)}
        assert len({l["marker"] for l in members}) == 1
    for l in launches:  # each run saw its own settings, in os.environ and in libc getenv
        want = {"default": ("Ring", None), "ll": ("Ring", "LL"), "simple": ("Ring", "Simple"),
                "tree": ("Tree", None)}[l["config"]]
        for rank in l["ranks"]:
            seen = rank["env_seen"]
            for name, value in zip(("NCCL_ALGO", "NCCL_PROTO"), want):
                assert seen[name] == {"environ": value, "getenv": value}, (l["config"], name)
        assert l["overhead_s"] >= 0 and l["wall_s"] == pytest.approx(l["measure_s"] + l["overhead_s"], abs=0.002)
    shared = next(m for m in processes.values() if len(m) == 4)
    # one start and teardown for four measurements: each carries a quarter of it
    assert sum(l["overhead_s"] for l in shared) < shared[0]["process_wall_s"]
    data = load_run(out)
    assert set(data.samples["config"]) == {"default", "ll", "simple", "tree"}
    assert not survivors(run)


@METHODS
def test_reuse_process_keeps_finished_runs_when_a_later_one_crashes(tmp_path, method):
    # reuse_process composes with either method; a config that sets a per-process variable (the crash
    # switch here) makes every launch of the round its own process (all or none: a shared process among
    # some would make the first run in a process theirs), and its crash takes nothing else with it
    out = tmp_path / "run"
    spec = write_spec(tmp_path / "s.yaml", trials=1, reuse_process=True, seed=3, launch=method,
                      configs={"ll": {"NCCL_PROTO": "LL"}, "crash": {"COMMDIAG_TEST_FAULT": "crash"}})
    proc = run_cli("sweep", spec, "--out", out, "--no-confirm")
    assert proc.returncode == 3, proc.stderr
    run = read_run(out)
    status = {l["config"]: l for l in run["launches"]}
    assert len({l["process"] for l in run["launches"]}) == 3 and {l["process_runs"] for l in run["launches"]} == {1}
    assert any("every launch runs in its own process" in w for w in run["warnings"])
    assert status["default"]["status"] == status["ll"]["status"] == "ok"
    assert status["crash"]["status"] == "failed" and "crashing rank 0 on purpose" in status["crash"]["stderr_tail"]


def test_reuse_process_refuses_a_users_own_nccl_debug(tmp_path):
    # without commdiag's own NCCL log nothing could prove a reused process applied a setting:
    # refused before anything starts (the GPU check comes after it, so this runs here too)
    spec = write_spec(tmp_path / "s.yaml", backend="nccl", reuse_process=True)
    proc = run_cli("sweep", spec, "--out", tmp_path / "r", env={"NCCL_DEBUG": "INFO"})
    assert proc.returncode == 2
    assert "reuse_process" in proc.stderr and "NCCL_DEBUG" in proc.stderr
    assert not (tmp_path / "r").exists()


@METHODS
def test_second_sweep_in_a_folder_is_refused_and_resume_after_kill_9_ends_the_orphans(tmp_path, method):
    # one process per run folder; a launch left running by a killed commdiag is ended: a torchrun
    # launch's processes are found by its recorded marker and ended before --resume reruns it; launch
    # servers see EOF on their control pipe, end their children and exit by themselves.
    out = tmp_path / "run"
    # The deadline covers every launch, the healthy one too: 30 s holds for a 4-7 s launch on a machine
    # whose cores all run tests (-n equal to the core count); 12 s did not on a 16-core GPU box at -n 12.
    spec = write_spec(tmp_path / "s.yaml", timeout_s=30, seed=1, launch=method,
                      configs={"hang": {"COMMDIAG_TEST_FAULT": "hang"}})
    # torchrun: the agent and its 2 workers; forkserver: 2 servers and the launch's 2 children
    up = 4 if method == "forkserver" else 2
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = subprocess.Popen([sys.executable, "-m", "commdiag.cli", "sweep", str(spec), "--out", str(out),
                              "--no-confirm"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        marker, deadline = None, time.monotonic() + 60
        while time.monotonic() < deadline:  # wait for the hanging launch's processes to be up
            try:
                hung = [l for l in read_run(out)["launches"] if l["config"] == "hang" and l.get("marker")]
            except (OSError, ValueError):
                hung = []
            if hung and len(launcher.marked_pids(hung[0]["marker"])) >= up:
                marker = hung[0]["marker"]
                break
            time.sleep(0.2)
        assert marker, "the hanging launch never started"
        second = run_cli("sweep", "--resume", out, timeout=60)
        message = one_message(second.stderr)  # one message, wrapped at 100 columns
        assert second.returncode == 2 and "another commdiag process" in message
        assert f"pid {first.pid}" in message and "Traceback" not in second.stderr
        first.kill()  # kill -9: a torchrun and its workers live on, re-parented
        first.wait(timeout=30)
        orphans = launcher.marked_pids(marker)
        if method == "forkserver":  # the servers saw EOF: children and servers end without help
            deadline = time.monotonic() + 30
            while orphans and time.monotonic() < deadline:
                time.sleep(0.2)
                orphans = launcher.marked_pids(marker)
            assert not orphans, "launch servers outlived their commdiag"
        else:
            assert orphans, "kill -9 of commdiag left no orphans to test with"
    finally:
        if first.poll() is None:
            first.kill()
    resumed = run_cli("sweep", "--resume", out, timeout=300)
    assert resumed.returncode == 3, resumed.stderr[-2000:]  # the hanging launch times out again
    assert not [p for p in orphans if launcher.marked_pids(marker) and p in launcher.marked_pids(marker)]
    run = read_run(out)
    if method == "torchrun":
        assert any("ended" in w and "left running by an earlier commdiag" in w for w in run["warnings"])
    assert {l["config"]: l["status"] for l in run["launches"]} == {"default": "ok", "hang": "timeout"}
    launched_by(run, method)
    assert not survivors(run)


@METHODS
def test_a_sweep_started_with_sigint_ignored_can_still_be_interrupted(tmp_path, method):
    out = tmp_path / "run"
    spec = write_spec(tmp_path / "s.yaml", trials=3, timeout_s=60, launch=method)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "commdiag.cli", "sweep", str(spec), "--out", str(out),
                             "--no-confirm"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    wait_for_a_finished_launch(out)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    run = read_run(out)
    assert run["state"] == "interrupted"
    assert not survivors(run)


def test_preflight_finds_torchrun_as_source_or_bytecode_without_importing_torch(tmp_path, monkeypatch):
    from importlib.machinery import ModuleSpec

    from commdiag.errors import CommdiagError
    from commdiag.formats.spec import load_spec
    from commdiag.measure import sweep

    spec = load_spec(write_spec(tmp_path / "s.yaml"))
    pkg = tmp_path / "torch"
    (pkg / "distributed").mkdir(parents=True)
    torch_spec = ModuleSpec("torch", None, is_package=True)
    torch_spec.submodule_search_locations = [str(pkg)]
    monkeypatch.setattr(sweep.importlib.util, "find_spec", lambda name, *a: torch_spec if name == "torch" else None)
    with pytest.raises(CommdiagError, match=r"torchrun \(torch.distributed.run\) is missing"):
        sweep.preflight(spec)
    (pkg / "distributed" / "run.pyc").write_bytes(b"")  # sourceless, as slimmed images ship it
    assert sweep.preflight(spec) == 2
    (pkg / "distributed" / "run.pyc").unlink()
    (pkg / "distributed" / "run.py").write_text("")
    assert sweep.preflight(spec) == 2
