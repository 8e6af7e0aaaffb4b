"""Time-budgeted sizes (spec ``time_per_size_ms``): each size is timed for about the same wall time,
calibrated in the launch from its warmup, with at least 20 and at most ``iters`` samples, the same count
on every rank (measure/worker.py ``timed_count``)."""

from __future__ import annotations

import json

from commdiag.formats.spec import load_spec
from commdiag.measure import worker

from conftest import run_cli, write_spec


def test_timed_count_fits_the_budget_within_its_bounds():
    plan = {"iters": 200, "time_per_size_ms": 50}
    assert worker.timed_count(plan, 10.0) == 200  # 7-us calls: the full count fits in 2 ms
    assert worker.timed_count(plan, 1000.0) == 50  # 1 ms samples: 50 of them in 50 ms
    assert worker.timed_count(plan, 100_000.0) == worker.MIN_TIMED  # 100 ms samples: never below 20
    assert worker.timed_count({"iters": 10, "time_per_size_ms": 50}, 100_000.0) == 10  # iters caps the floor too
    assert worker.timed_count({"iters": 200, "time_per_size_ms": None}, 1e9) == 200  # null: fixed counts
    assert worker.timed_count(plan, 1000.0, agree=lambda n: n + 7) == 57  # the ranks' agreement decides


def test_warmup_fits_a_tenth_of_the_budget_within_its_bounds():
    plan = {"warmup": 20, "time_per_size_ms": 25}
    assert worker.warmup_count(plan, 7.0) == 20  # 7-us calls: the whole warmup is 0.14 ms
    assert worker.warmup_count(plan, 500.0) == 5  # 2.5 ms of 25 ms
    assert worker.warmup_count(plan, 20_000.0) == worker.MIN_WARMUP  # a 117 MB all-reduce on PCIe: 2, not 20 x 20 ms
    assert worker.warmup_count({"warmup": 20, "time_per_size_ms": None}, 20_000.0) == 20  # fixed counts: exactly
    assert worker.warmup_count({"warmup": 1, "time_per_size_ms": 25}, 20_000.0) == 1  # never more than asked
    assert worker.warmup_count(plan, 500.0, agree=lambda n: n + 3) == 8  # the ranks' agreement decides


def test_spec_key_defaults_validates_and_stays_off_for_step(tmp_path):
    assert load_spec(write_spec(tmp_path / "a.yaml")).time_per_size_ms == 25.0
    assert load_spec(write_spec(tmp_path / "b.yaml", time_per_size_ms=None)).time_per_size_ms is None
    proc = run_cli("sweep", write_spec(tmp_path / "c.yaml", time_per_size_ms=-1), "--no-confirm")
    assert proc.returncode == 2 and "time_per_size_ms" in proc.stderr and "Traceback" not in proc.stderr


def test_a_real_sweep_times_a_slow_size_fewer_times_and_every_rank_the_same(tmp_path):
    out = tmp_path / "run"
    spec = write_spec(tmp_path / "s.yaml", sizes={"bytes": [4096, 16 << 20]}, warmup=3, iters=100,
                      time_per_size_ms=200)
    proc = run_cli("sweep", spec, "--out", out, "--no-confirm")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "launches" / "0000" / "result.json").read_text())
    counts = [{size: len(v) for size, v in rank["samples"]["torch"]["eager"].items()} for rank in result["ranks"]]
    assert counts[0] == counts[1]  # the ranks agreed (else the launch would have hung)
    small, large = counts[0][str(4096)], counts[0][str(16 << 20)]
    assert large < small and large >= worker.MIN_TIMED and small <= 100, counts
    run = json.loads((out / "run.json").read_text())
    assert "as many as fit 200 ms per size" in run["method"]["eager"]
