"""ab's verdicts: A/A twins are never certified (simulation on the shipped launch order, with
position-in-round effects, drift, heavy tails and a spread difference), presets on recorded
outputs, the four outcomes on constructed rounds."""

from __future__ import annotations

import math
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from commdiag.ab import presets, verdict
from commdiag.analyse import paired, stats
from commdiag.formats.spec import launch_order

FIX = Path(__file__).parent / "fixtures" / "ab"
RUNS = 2000
ROUNDS = 9


def _orders(runs: int, rounds: int, seed: int) -> np.ndarray:
    """Position (0/1) of the A/A twin inside each round, from the shipped launch_order."""
    spec = SimpleNamespace(trials=rounds, configs=(SimpleNamespace(name="default"), SimpleNamespace(name="aa")))
    rng = random.Random(seed)
    out = np.empty((runs, rounds), dtype=int)
    for i in range(runs):
        order = launch_order(spec, rng.randrange(2 ** 31))
        out[i] = [l.trial * 0 + (n % 2) for n, l in enumerate(order) if l.config == "aa"]
    return out


def _model(name: str, rng, pos_aa: np.ndarray):
    """ln values (default, twin) per run x round under a noise model (no true effect)."""
    runs, rounds = pos_aa.shape
    pos_def = 1 - pos_aa
    base = rng.normal(0, 0.01, (runs, rounds, 2))
    if name == "t2":
        base = 0.01 * rng.standard_t(2, (runs, rounds, 2))
    if name == "drift10":
        base += np.linspace(0, 0.10, rounds)[None, :, None]
    pos = np.stack([pos_def, pos_aa], axis=-1)
    if name == "first+10":
        base += 0.10 * (pos == 0)
    if name == "alternate10":
        base += 0.10 * np.where((pos + np.arange(rounds)[None, :, None] * 2) % 2 == 0, 1, -1)
    if name == "linear5":
        base -= 0.05 * pos
    if name == "spread10x":
        base[..., 1] = rng.normal(0, 0.10, (runs, rounds))
    return base[..., 0], base[..., 1]


@pytest.mark.parametrize("model", ["normal", "t2", "drift10", "first+10", "alternate10", "linear5", "spread10x"])
def test_aa_twins_are_never_certified(model):
    rng = np.random.default_rng(abs(hash(model)) % 2 ** 32)
    pos = _orders(RUNS, ROUNDS, 1)
    dflt, aa = _model(model, rng, pos)
    d = aa - dflt
    p = paired.signed_rank_p(d, stats.TWO_SIDED)
    # better/worse needs p <= alpha/M at least (M = 1 here): the family-wise rate is bounded by this
    rate = float(np.mean(p <= stats.ALPHA))
    assert rate <= stats.ALPHA + 3 * math.sqrt(stats.ALPHA * (1 - stats.ALPHA) / RUNS), (model, rate)
    # and the verdict function itself, on a sample of the runs (same data): never better/worse beyond that
    sample = [verdict.judge([*({"config": "default", "round": r, "status": "ok", "values": {"m": math.exp(dflt[i, r])}}
                                for r in range(ROUNDS)),
                             *({"config": "aa", "round": r, "status": "ok", "values": {"m": math.exp(aa[i, r])}}
                               for r in range(ROUNDS))], ["aa"], [("m", "higher")], 0.03)[0].verdict
              for i in range(60)]
    assert sum(v in ("better", "worse") for v in sample) <= 3  # P(>= 4 of 60 | 1%) < 0.3%


def test_equivalence_is_not_certified_for_a_real_5_percent_effect():
    n, runs = 12, RUNS
    rng = np.random.default_rng(5)
    d = rng.normal(math.log(1.05), 0.02, (runs, n))
    c = paired.critical_count(n, stats.ALPHA / 2)
    i, j = np.triu_indices(n)
    w = np.sort((d[:, i] + d[:, j]) / 2, axis=1)
    lo, hi = w[:, c], w[:, -1 - c]
    assert np.mean((lo >= math.log(0.97)) & (hi <= math.log(1.03))) <= 0.01


def _launches(pairs_):
    out = []
    for r, (a, b) in enumerate(pairs_):
        out += [{"config": "default", "round": r, "status": "ok", "values": {"m": b}},
                {"config": "seed", "round": r, "status": "ok", "values": {"m": a}}]
    return out


def test_four_outcomes():
    rng = random.Random(3)
    noisy = lambda x, sd: x * math.exp(rng.gauss(0, sd))  # noqa: E731
    better = verdict.judge(_launches([(noisy(115, .01), noisy(100, .01)) for _ in range(10)]), ["seed"],
                           [("m", "higher")], 0.03)[0]
    assert better.verdict == "better" and 1.1 < better.ratio < 1.2
    worse = verdict.judge(_launches([(noisy(115, .01), noisy(100, .01)) for _ in range(10)]), ["seed"],
                          [("m", "lower")], 0.03)[0]
    assert worse.verdict == "worse"
    same = verdict.judge(_launches([(noisy(100, .005), noisy(100, .005)) for _ in range(10)]), ["seed"],
                         [("m", "higher")], 0.03)[0]
    assert same.verdict == "equivalent" and same.rounds_needed
    unclear = verdict.judge(_launches([(noisy(102, .05), noisy(100, .05)) for _ in range(10)]), ["seed"],
                            [("m", "higher")], 0.03)[0]
    assert unclear.verdict == "inconclusive" and unclear.rounds_needed and unclear.rounds_needed > 10
    few = verdict.judge(_launches([(110, 100)] * 5), ["seed"], [("m", "higher")], 0.03)[0]
    assert few.verdict == "inconclusive" and few.rounds_needed == 8 and "at least 8" in few.note


def test_a_drifting_baseline_is_named():
    seq = [(r, 88.8 * (1 - 0.012 * r)) for r in range(9)]
    note = verdict.drift(seq, 0.03)
    assert note.startswith("drifted from 87.73 to 81.34") and "-7.3%" in note
    assert verdict.drift([(r, 88.8) for r in range(9)], 0.03) is None


@pytest.mark.parametrize("fname, preset, field, value", [
    ("sglang-bench-serving.jsonl", "sglang.bench_serving", "output_throughput", 1287.64),
    ("sglang-bench-serving.jsonl", "sglang.bench_serving", "median_itl_ms", 11.93),
    ("sglang-bench-one-batch.jsonl", "sglang.bench_one_batch", "median_decode_throughput", 3350.41),
    ("sglang-bench-offline-throughput.jsonl", "sglang.bench_offline_throughput", "output_throughput", 2547.4),
    ("vllm-bench-serve.json", "vllm.bench_serve", "output_throughput", 1198.3616),
    ("vllm-bench-serve.json", "vllm.bench_serve", "p99_itl_ms", 23.9172),
    ("vllm-bench-serve.json", "vllm.bench_serve", "max_output_tokens_per_s", 1472.0),
    ("vllm-bench-serve-detailed.json", "vllm.bench_serve", "median_e2el_ms", 2510.7314),
    ("vllm-bench-serve-detailed.json", "vllm.bench_serve", "request_goodput", 1.1351668),
    ("vllm-bench-serve-detailed.json", "vllm.bench_serve", "median_tpot_ms", 12.4122),
    ("vllm-bench-serve-appended.json", "vllm.bench_serve", "output_throughput", 1175.0811),  # the last run
])
def test_presets_parse_each_benchmarks_format(fname, preset, field, value):
    f = presets.preset_field(preset, field)
    got, why = presets.from_file(str(FIX / fname), field, f.aliases, hint=f.hint)
    assert why is None and got == pytest.approx(value)


def test_vllm_fields_it_writes_only_when_asked_say_how():
    # vllm bench serve's defaults: no e2el percentiles, request_goodput null (tests/fixtures/ab/README.md)
    for field, needs in (("median_e2el_ms", "--percentile-metrics ttft,tpot,itl,e2el"), ("request_goodput", "--goodput")):
        f = presets.preset_field("vllm.bench_serve", field)
        got, why = presets.from_file(str(FIX / "vllm-bench-serve.json"), field, f.aliases, hint=f.hint)
        assert got is None and needs in why, why
    assert "request_goodput is null" in presets.from_file(str(FIX / "vllm-bench-serve.json"), "request_goodput")[1]


def test_the_fixtures_have_the_exact_shape_of_the_source_they_follow():
    """Key order as each tool builds its dict (README.md names the file and commit)."""
    import json

    vllm = json.loads((FIX / "vllm-bench-serve.json").read_text())
    assert list(vllm)[:11] == ["date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
                               "request_rate", "burstiness", "max_concurrency", "duration"]
    assert [k for k in vllm if k.endswith("_ms")] == [f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl")
                                                       for s in ("mean", "median", "std", "p99")]
    assert not (FIX / "vllm-bench-serve.json").read_text().endswith("\n")  # json.dump, no newline
    sglang = json.loads((FIX / "sglang-bench-serving.jsonl").read_text().splitlines()[-1])
    assert list(sglang)[:9] == ["backend", "dataset_name", "request_rate", "max_concurrency", "sharegpt_output_len",
                                "random_input_len", "random_output_len", "random_range_ratio", "duration"]
    assert list(sglang)[-2:] == ["concurrency", "accept_length"]


def test_presets_are_defensive(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"output_throughput": 10}\n{"output_throughput": 12}\n{"output_thr')  # cut by a crash
    assert presets.from_file(str(p), "output_throughput") == (12.0, None)
    p.write_text('{"output_throughput": "nan"}\n')
    assert "not a number > 0" in presets.from_file(str(p), "output_throughput")[1]
    p.write_text('{"other": 1}\n')
    assert "no field output_throughput" in presets.from_file(str(p), "output_throughput")[1]
    assert presets.from_file(str(tmp_path / "none"), "x")[1].endswith("not written")
    assert presets.from_stdout("Output token throughput (tok/s):   88.80\n...\nOutput token throughput (tok/s): 82.1",
                               r"Output token throughput \(tok/s\):\s+(?P<value>[0-9.]+)") == (82.1, None)
