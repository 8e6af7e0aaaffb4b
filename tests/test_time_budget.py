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


class _FakeCuda:
    """Just enough of torch.cuda for worker's timing paths, on a virtual clock: every all-reduce advances
    it by ``call_us`` (the first ``first_extra_us`` more: a rank that waited for the others), an event
    records the clock, a graph replays what was captured.  The GPU paths of the budget run here on CPU
    (the device tool can be out of time: 2026-12-06)."""

    def __init__(self, call_us: float, first_extra_us: float = 0.0):
        self.now, self.call_us, self.extra, self.calls, self.capturing = 0.0, call_us, first_extra_us, 0, None
        fake = self

        class Stream:
            def wait_stream(self, other):
                pass

            def synchronize(self):
                pass

        class Event:
            def __init__(self, enable_timing=True):
                self.t = None

            def record(self, stream=None):
                self.t = fake.now

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return (other.t - self.t) / 1000.0

        class CUDAGraph:
            def __init__(self):
                self.ops = 0

            def replay(self):
                for _ in range(self.ops):
                    fake.call()

        class _Ctx:
            def __init__(self, graph=None):
                self.graph = graph

            def __enter__(self):
                if self.graph is not None:
                    fake.capturing = self.graph

            def __exit__(self, *exc):
                fake.capturing = None

        self.Stream, self.Event, self.CUDAGraph = Stream, Event, CUDAGraph
        self.stream = lambda s: _Ctx()
        self.graph = lambda g, stream=None: _Ctx(g)
        self.current_stream = self.default_stream = lambda: Stream()
        self.synchronize = lambda: None

    def call(self):
        if self.capturing is not None:
            self.capturing.ops += 1
            return
        self.now += self.call_us + (self.extra if self.calls == 0 else 0.0)
        self.calls += 1


class _FakeTorch:
    def __init__(self, cuda):
        self.cuda = cuda


class _FakePath:
    def __init__(self, cuda):
        self.cuda = cuda

    def op(self, buf, stream=None):
        return self.cuda.call


def test_the_gpu_timing_paths_under_a_budget_on_a_fake_cuda():
    """graph and eager (CUDA) timing, with the budget and with fixed counts: the probe graph for short
    calls, no probe for a call that fills the window, the faster of two first calls, the warmup within a
    tenth of the budget, and fixed counts exactly as before (warmup 20, iters 200, the 3-replay probe)."""
    budget = {"iters": 200, "warmup": 20, "batch": "auto", "window_us": 500, "time_per_size_ms": 25}
    fixed = {**budget, "time_per_size_ms": None}
    for plan, call_us, extra, want_batch, want_n in (
            (budget, 7.0, 0.0, 72, 50),        # short calls: probe graph, 500 us windows, 50 fit 25 ms
            (budget, 7.0, 600.0, 72, 50),      # the first call waited 600 us for the other rank: still probed
            (budget, 20_000.0, 0.0, 1, 20),    # a 117 MB all-reduce on PCIe: no probe, batch 1, the floor
            (fixed, 7.0, 0.0, 72, 200),        # fixed counts: as before
            (fixed, 20_000.0, 0.0, 1, 200)):
        cuda = _FakeCuda(call_us, extra)
        torch = _FakeTorch(cuda)
        agreed = []
        samples, batch = worker._time_graph(torch, _FakePath(cuda), None, plan, agree=lambda n: agreed.append(n) or n)
        assert batch == want_batch and len(samples) == want_n, (plan["time_per_size_ms"], call_us, extra, batch, len(samples))
        assert all(abs(s - call_us) < 1e-6 for s in samples)
        if plan is budget and call_us > 1000:  # 2 single calls + capture's warm call + 2 warmup + 2 calibration + 20
            assert cuda.calls == 2 + 1 + worker.MIN_WARMUP + 2 + 20, cuda.calls
        if plan is fixed:  # the probe graph's warm call + 10 + 3 x 10, capture's warm call, warmup, samples
            assert cuda.calls == 1 + 10 + 30 + 1 + -(-20 // batch) * batch + 200 * batch, cuda.calls
        cuda = _FakeCuda(call_us, extra)
        eager, host, batch = worker._time_eager_cuda(_FakeTorch(cuda), cuda.call, plan)
        assert len(eager) == len(host) and all(abs(s - call_us) < 1e-6 for s in eager)
        assert batch == (want_batch if plan is budget or call_us < 1000 else 1)
