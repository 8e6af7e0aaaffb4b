"""A plan with a time (#31): commdiag sweep SPEC --dry-run, the start banner's estimate from recorded
components, and the ETA from this run's launches without the launch servers' one-time start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from commdiag.formats.spec import load_spec
from commdiag.measure import eta, stages, sweep

ROOT = Path(__file__).resolve().parents[1]
SPEC = ("name: plan\nbackend: gloo\nnproc_per_node: 2\nsizes: {hidden: 64, tokens: [1, 16, 256, 1024]}\n"
        "trials: 3\nconfigs: {a: {NCCL_PROTO: LL}, b: {NCCL_PROTO: Simple}}\n")


def _cli(*args, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMDIAG_")}
    return subprocess.run([sys.executable, "-m", "commdiag.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_dry_run_prints_the_plan_and_its_time_and_launches_nothing(tmp_path):
    spec = tmp_path / "plan.yaml"
    spec.write_text(SPEC)
    p = _cli("sweep", str(spec), "--dry-run", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    out = " ".join(p.stdout.split())  # lines wrap within 100 columns
    assert "nothing is launched" in out and "3 configs x 3 trials = 9 launches" in out
    assert "stage 2 (confirmation): at most" in out and "expected: about" in out
    assert "start-up 1.54 s a launch (gloo, forkserver" in out
    assert not (tmp_path / "reports").exists()  # no run folder
    j = json.loads(_cli("sweep", str(spec), "--dry-run", "--json", cwd=tmp_path).stdout)
    assert j["format"] == "commdiag-sweep-plan" and j["launches"] >= 9 and j["expected_s"] > 0
    fixed = " ".join(_cli("sweep", str(spec), "--dry-run", "--set", "time_per_size_ms=null", cwd=tmp_path).stdout.split())
    assert "fixed counts (time_per_size_ms: null)" in fixed and "(assumed: eta.CALL_MODEL)" in fixed


def test_pcie8_plan_on_a_machine_without_gpus():
    """The plan needs no GPU: pcie8's components give its estimate anywhere."""
    plan = sweep.dry_run(load_spec(ROOT / "sweeps" / "pcie8.yaml"))
    assert plan.launches == 81 + stages.stage2_at_most(load_spec(ROOT / "sweeps" / "pcie8.yaml"))
    assert plan.est_s and any("stage 2 (confirmation): at most 14 rounds" in l for l in plan.lines)


def _launch(i, overhead, measure, **kw):
    return {"index": i, "config": "default", "trial": i, "stage": 1, "status": "ok", "overhead_s": overhead,
            "measure_s": measure, **kw}


def test_the_eta_leaves_out_the_launch_that_started_the_servers():
    run = {"spec": {"backend": "gloo"}, "launch": {"method": "forkserver"},
           "launches": [_launch(0, 12.0, 1.0, starts_servers=True)]}
    first = eta.measured(run)
    assert first.startup_s == eta.STARTUP_S[("gloo", "forkserver")]  # not 12 s: that was the servers' start
    run["launches"] += [_launch(1, 0.4, 1.2), _launch(2, 0.6, 0.8)]
    cost = eta.measured(run)
    assert cost.startup_s == 0.5 and cost.measure_s == 1.0 and "leaving out" in cost.note
    pending = [{"status": "pending", "stage": 1}] * 4
    assert eta.remaining_s(None, run, cost, pending) == 4 * 1.5


def test_the_start_banner_estimates_before_the_first_launch(tmp_path):
    spec_file = tmp_path / "plan.yaml"
    spec_file.write_text(SPEC)
    spec = load_spec(spec_file)
    run = sweep.new_run(spec, tmp_path, 2)
    plan = stages.start_banner(spec, run, tmp_path)
    assert plan.est_s and plan.est_s > 0
    text = " ".join(" ".join(plan.lines).split())
    assert "expected: about" in text and "(gloo, forkserver; benchmarks/README.md)" in text
    assert "at most" in text and "racing may drop clear losers" in text


def test_pcie8_time_is_the_same_in_the_spec_the_readme_and_help():
    """#31: sweeps/pcie8.yaml's comment, the README and --help state the same estimate."""
    from commdiag import cli

    number = eta.PCIE8_ESTIMATE
    assert number in (ROOT / "sweeps" / "pcie8.yaml").read_text()
    assert number in (ROOT / "README.md").read_text()
    assert number in cli.main.help


def test_the_call_count_model_counts_the_calls_the_worker_makes(tmp_path):
    """eta.size_s counts the calls worker.py makes per size (here gloo's host path: the check, the warmup,
    the samples).  Fed an all-reduce of a known, steady time it must count exactly the calls the worker's
    own timing loop makes, at a call on the 20-sample floor (2 ms) and one at ``iters`` (50 us)."""
    import time as _time

    from commdiag.measure import worker

    from conftest import write_spec

    spec = load_spec(write_spec(tmp_path / "s.yaml", warmup=20, iters=200, time_per_size_ms=25))
    plan = {"warmup": spec.warmup, "iters": spec.iters, "time_per_size_ms": spec.time_per_size_ms}
    for call_s in (2e-3, 50e-6):
        calls = []

        def op():
            calls.append(1)
            end = _time.perf_counter() + call_s
            while _time.perf_counter() < end:
                pass

        samples = worker._time_eager_host(op, plan)
        made = 1 + len(calls)  # + the correctness check's call
        assert len(samples) == (worker.MIN_TIMED if call_s > 1e-3 else spec.iters)
        assert round(eta.size_s(spec, call_s * 1e6) / call_s) == made, (call_s, made, len(samples))

