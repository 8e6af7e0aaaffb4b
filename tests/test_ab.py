"""commdiag ab with real processes: a toy HTTP server per launch (commdiag.ab.toy), real benchmark
commands, the CLI end to end; failed launches; Ctrl-C then --resume; nothing left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commdiag.ab import runner, spec as ab_spec, verdict
from commdiag.errors import SpecError
from commdiag.measure import launcher

from conftest import run_cli, one_message, words

TOY = ["{python}", "-m", "commdiag.ab.toy"]
CLIENT = [*TOY, "client", "--port", "{port}", "--requests", "4", "--output-file", "{launch_dir}/result.jsonl"]
SERVER = {"command": [*TOY, "server", "--port", "{port}"], "ready_url": "http://127.0.0.1:{port}/health",
          "ready_timeout_s": 20, "stop_timeout_s": 5}
# A command without a server: its value depends on the arm's environment (VALUE x a launch-noise factor)
VALUE_CMD = ["{python}", "-c", "import os,random,math; print('toks:', float(os.environ['VALUE']) * "
             "math.exp(random.gauss(0, float(os.environ.get('NOISE', '0.01')))))"]
TOKS = {"name": "toks", "regex": r"toks: (?P<value>[0-9.]+)", "better": "higher"}


def _spec(tmp_path: Path, **raw) -> Path:
    import yaml

    p = tmp_path / "ab.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "seed": 7, **raw}))
    return p


def _marked_alive(run: dict) -> list[int]:
    return [pid for l in run["launches"] if l.get("marker") for pid in launcher.marked_pids(l["marker"])]


def test_15_percent_with_a_server_per_launch_is_certified_better(tmp_path):
    path = _spec(tmp_path, command=CLIENT, server=SERVER, rounds=8,
                 metrics=[{"preset": "sglang.bench_serving", "field": "output_throughput"}],
                 base_env={"TOY_RATE": "1000", "TOY_NOISE": "0.01"}, configs={"seed": {"TOY_RATE": "1150"}})
    r = run_cli("ab", path, "--out", tmp_path / "run", "--json", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["format"] == "commdiag-ab-result" and out["launches"] == {"ok": 16}
    (v,) = out["verdicts"]
    assert (v["config"], v["metric"], v["verdict"]) == ("seed", "output_throughput", "better")
    assert 1.10 < v["ratio"] < 1.20 and v["interval"][0] > 1.03 and v["p"] <= 0.01
    run = runner.load(tmp_path / "run")
    assert all(l["server_stop"] == "SIGINT" for l in run["launches"])  # each server stopped on the first signal
    assert not _marked_alive(run)


# VALUE_CMD with its noise drawn from the launch's folder name (its index): with the spec's seed the
# whole run is the same every time, so a verdict the tool gives 80% of the time is not a coin flip here.
SEEDED_VALUE_CMD = ["{python}", "-c", "import os,random,math,sys; random.seed('zero-effect-' + "
                    "os.path.basename(sys.argv[1])); print('toks:', float(os.environ['VALUE']) * "
                    "math.exp(random.gauss(0, float(os.environ.get('NOISE', '0.01')))))", "{launch_dir}"]


def test_zero_effect_is_equivalent_with_the_rounds_the_tool_says(tmp_path):
    # 1% launch noise: the tool says how many rounds an equivalence at +-3% needs (for 80% of runs); run
    # that many, on fixed draws (SEEDED_VALUE_CMD) so that the test is the same every time.
    need = verdict.rounds_for(round(0.01 * 2 ** 0.5, 5), 0.0, round(__import__("math").log(1.03), 6),
                              round(-__import__("math").log(0.97), 6), 0.01 / 2)
    assert need is not None and need <= 12
    path = _spec(tmp_path, command=SEEDED_VALUE_CMD, metrics=[TOKS], rounds=max(need, 8), min_effect=0.03,
                 seed=11, base_env={"VALUE": "100", "NOISE": "0.01"}, configs={"twin": {"VALUE": "100"}})
    r = run_cli("ab", path, "--out", tmp_path / "run", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "twin: toks is EQUIVALENT to default" in r.stdout
    assert all(len(line) <= 100 for line in r.stdout.splitlines())


def _one(tmp_path, server: dict, config_env=None) -> dict:
    s = ab_spec.resolve({"name": "f", "command": CLIENT, "server": server, "rounds": 8,
                         "metrics": [{"preset": "sglang.bench_serving", "field": "output_throughput"}],
                         "configs": {"x": {"TOY_RATE": "900"}}})
    run = runner.new_run(s)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    launch = run["launches"][0]
    config = next(c for c in run["configs"] if c["name"] == launch["config"])
    runner.one_launch(s, run, run_dir, launch, {**config, "env": {**config["env"], **(config_env or {})}},
                      dict(os.environ))
    assert not launcher.marked_pids(launch["marker"]), "a process of the launch is still running"
    return launch


def test_server_never_ready_is_a_failed_launch_with_its_reason(tmp_path):
    launch = _one(tmp_path, {**SERVER, "command": [*SERVER["command"], "--mode", "never-ready"],
                             "ready_timeout_s": 0.8})
    assert launch["status"] == "failed" and "not ready within 0.8s" in launch["error"]


def test_server_crash_during_the_run_is_a_failed_launch(tmp_path):
    launch = _one(tmp_path, {**SERVER, "command": [*SERVER["command"], "--mode", "crash"]})
    assert launch["status"] == "failed"
    assert "the command exited with code" in launch["error"] and "server exited (code 3)" in launch["error"]


def test_server_that_ignores_sigint_and_sigterm_is_killed_and_the_launch_failed(tmp_path):
    launch = _one(tmp_path, {**SERVER, "command": [*SERVER["command"], "--mode", "hang-on-stop"],
                             "stop_timeout_s": 0.3})
    assert launch["status"] == "failed" and "outlived its stop" in launch["error"]
    assert launch["server_stop"] == "SIGKILL"


def test_nccl_proof_reads_the_servers_log(tmp_path):
    # The toy prints NCCL's "set by environment" lines (constructed to NCCL's INFO format) when asked.
    server = {**SERVER, "require_nccl_proof": True}
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
    ok = _one(tmp_path / "a", server, {"NCCL_PROTO": "LL", "TOY_NCCL_LOG": "1"})
    assert ok["status"] == "ok", ok.get("error")
    assert ok["nccl_proof"]["applied"]["NCCL_PROTO"]
    none = _one(tmp_path / "b", server, {"NCCL_PROTO": "LL"})
    assert none["status"] == "failed" and "no NCCL proof" in none["error"]


def test_ctrl_c_then_resume_finishes_the_run(tmp_path):
    slow = ["{python}", "-c", "import os,time; time.sleep(0.1); print('toks:', os.environ['VALUE'])"]
    path = _spec(tmp_path, command=slow, metrics=[TOKS], rounds=8,
                 base_env={"VALUE": "100"}, configs={"b": {"VALUE": "130"}})
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "commdiag.cli", "ab", str(path), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # interrupt after a few launches are done
        if (out / "run.json").exists() and sum(l["status"] == "ok" for l in runner.load(out)["launches"]) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err[-2000:]
    run = runner.load(out)
    assert run["state"] == "interrupted" and any(l["status"] == "pending" for l in run["launches"])
    assert not _marked_alive(run)
    r = run_cli("ab", "--resume", out, "--json", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout)
    assert res["launches"] == {"ok": 16} and res["verdicts"][0]["verdict"] == "better"


def test_spec_errors_name_file_field_and_what_is_allowed(tmp_path):
    with pytest.raises(SpecError, match=r"rounds: 4 rounds cannot certify anything.*at least 9"):
        ab_spec.load(_spec(tmp_path, command=VALUE_CMD, rounds=4, metrics=[TOKS, {**TOKS, "name": "t2"}],
                           configs={"b": {"VALUE": "1"}}))
    with pytest.raises(SpecError, match=r"metrics\[0\]\.field: 'nope' is not a field of sglang.bench_serving"):
        ab_spec.load(_spec(tmp_path, command=VALUE_CMD, metrics=[{"preset": "sglang.bench_serving", "field": "nope"}],
                           configs={"b": {}}))
    with pytest.raises(SpecError, match=r"--set.*unknown key"):
        ab_spec.load(_spec(tmp_path, command=VALUE_CMD, metrics=[TOKS], configs={"b": {}}), ["trials=3"])
    with pytest.raises(SpecError, match=r"server: needs ready_url"):
        ab_spec.load(_spec(tmp_path, command=VALUE_CMD, metrics=[TOKS], configs={"b": {}}, server={"command": ["x"]}))
    r = run_cli("ab", _spec(tmp_path, command=VALUE_CMD, metrics=[TOKS], configs={"b": {}}, rounds=2))
    assert r.returncode == 2 and r.stderr.startswith("commdiag: error:") and "Traceback" not in words(r.stderr)


def test_kill_9_mid_launch_then_resume_ends_what_was_left_and_finishes(tmp_path):
    # While FLAG exists, the server ignores SIGINT and SIGTERM (toy --mode hang-on-stop) and the benchmark
    # ignores SIGTERM and runs on: the kernel's SIGTERM at commdiag's death (PR_SET_PDEATHSIG) does not
    # end them, so only --resume (the launch markers in run.json) can.  Without FLAG both behave.
    flag = tmp_path / "stubborn"
    flag.write_text("")
    server = ("import os,sys; mode = 'hang-on-stop' if os.path.exists(os.environ['FLAG']) else 'ok'; "
              "os.execv(sys.executable, [sys.executable, '-m', 'commdiag.ab.toy', 'server', '--port', sys.argv[1], "
              "'--mode', mode])")
    bench = ("import os,sys,signal,time\n"
             "if os.path.exists(os.environ['FLAG']):\n"
             "    signal.signal(signal.SIGTERM, signal.SIG_IGN); print('benchmark running', flush=True); time.sleep(300)\n"
             "os.execv(sys.executable, [sys.executable, '-m', 'commdiag.ab.toy', 'client', '--port', sys.argv[1], "
             "'--requests', '4', '--output-file', sys.argv[2]])")
    path = _spec(tmp_path, command=["{python}", "-c", bench, "{port}", "{launch_dir}/result.jsonl"],
                 server={**SERVER, "command": ["{python}", "-c", server, "{port}"], "stop_timeout_s": 2},
                 metrics=[{"preset": "sglang.bench_serving", "field": "output_throughput"}], rounds=8,
                 base_env={"TOY_RATE": "1000", "FLAG": str(flag)}, configs={"seed": {"TOY_RATE": "1150"}})
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "commdiag.cli", "ab", str(path), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the first launch's server is up and its benchmark running
            if any("benchmark running" in p.read_text() for p in out.glob("launches/*/stdout.txt")):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the first launch's benchmark never started")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        time.sleep(0.3)  # the kernel's SIGTERM to the children is delivered (and ignored)
        run = runner.load(out)
        left = _marked_alive(run)
        assert len(left) >= 2, "the stubborn server and benchmark should have outlived commdiag"
        flag.unlink()
        r = run_cli("ab", "--resume", out, "--json", timeout=180)
        assert r.returncode == 0, r.stderr[-2000:]
        res = json.loads(r.stdout)
        assert res["launches"] == {"ok": 16} and res["state"] == "complete"
        assert any(w.startswith(f"ended {len(left)} process(es) left running by an earlier commdiag")
                   for w in res["warnings"]), res["warnings"]
        assert not _marked_alive(runner.load(out))
        for pid in left:  # gone, not merely unmarked
            assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _marked_alive(runner.load(out)) if (out / "run.json").exists() else []:
            os.kill(pid, signal.SIGKILL)


def test_nccl_proof_on_real_two_rank_nccl_logs():
    # NCCL 2.28.9 on 2x H200 (tests/fixtures/h200x2-nvlink/README.md): the seed settings logged by both
    # ranks prove the seed arm; a defaults run proves default and refuses to prove seed.
    fix = Path(__file__).parent / "fixtures" / "h200x2-nvlink"
    seed = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
            "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}
    found, why = runner.nccl_proof(fix / "nccl-debug-env-seed-settings.log", seed)
    assert why is None and found["processes"] == 2
    assert all(len(found["applied"][k][v]) == 2 for k, v in seed.items())
    found, why = runner.nccl_proof(fix / "nccl-debug-init-env-tuning-defaults.log", {})
    assert why is None and (found["processes"], found["nranks"]) == (2, 2)
    _, why = runner.nccl_proof(fix / "nccl-debug-init-env-tuning-defaults.log", seed)
    assert why.startswith("no NCCL proof: pid 662 logged NCCL_PROTO=(nothing), the arm sets LL")
