"""Verdict logic on literal data (and on recorded real CPU runs): commdiag/stats.py."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from commdiag import results, stats
from commdiag.stats import FASTER, INCONCLUSIVE, SAME, SLOWER, LaunchMedian

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
SIZES = {4096: 1, 65536: 16, 1048576: 256, 4194304: 1024}
BANDS = {"decode": [1, 64], "prefill": [256, None]}


def medians(table: dict[str, dict[int, list[float]]], mode: str = "graph") -> list[LaunchMedian]:
    """{config: {size: [launch medians]}} -> LaunchMedian rows; launch ids are interleaved as a sweep does."""
    rows = []
    for config, by_size in table.items():
        for size, vals in by_size.items():
            for i, v in enumerate(vals):
                rows.append(LaunchMedian(config, 1000 * i + sorted(table).index(config), size, mode, v))
    return rows


def evaluate(table, **kw):
    kw.setdefault("configs", list(table))
    kw.setdefault("modes", ["graph"])
    kw.setdefault("tokens_by_size", SIZES)
    kw.setdefault("bands", BANDS)
    return stats.evaluate(medians(table), **kw)


def cell(v, config, size, mode="graph"):
    return next(c for c in v.cells if c.config == config and c.size_bytes == size and c.mode == mode)


def test_t_quantiles_match_tables():
    assert stats.t_quantile(0.025, 1) == pytest.approx(12.7062, abs=1e-3)
    assert stats.t_quantile(0.025, 2) == pytest.approx(4.3027, abs=1e-3)
    assert stats.t_quantile(0.025, 10) == pytest.approx(2.2281, abs=1e-3)
    assert stats.t_quantile(0.0005, 4) == pytest.approx(8.6103, abs=1e-3)
    assert stats.t_quantile(0.025, 1e6) == pytest.approx(1.95996, abs=1e-3)


def test_identical_data_is_no_difference_everywhere():
    same = {s: [10.0 * (1 + s / 1e6), 10.1 * (1 + s / 1e6), 9.95 * (1 + s / 1e6)] for s in SIZES}
    v = evaluate({"default": same, "aa": dict(same)})
    assert {c.verdict for c in v.cells} == {SAME}
    assert all(c.ratio == pytest.approx(1.0) for c in v.cells)
    assert all(c.hi < 1 + stats.EQUIVALENCE for c in v.cells)  # "same" rules out a 10% effect
    assert all(w.config is None for w in v.size_winners + v.band_winners)
    assert all(w.text == "keep NCCL defaults" for w in v.band_winners)


def test_identical_but_noisy_data_is_inconclusive_not_same():
    # 3 launches at ~3.5% launch noise: the ratio is 1.0, but the interval cannot rule out a
    # 10% effect, so "no significant difference" would overclaim (seen on 2x H200 in eager mode).
    same = {s: [10.0, 10.5, 9.8] for s in SIZES}
    v = evaluate({"default": same, "aa": dict(same)})
    for c in v.cells:
        assert c.ratio == pytest.approx(1.0)
        assert c.hi > 1 + stats.EQUIVALENCE
        assert c.verdict == INCONCLUSIVE and c.more_launches and c.more_launches > 0
        assert c.label.startswith("inconclusive: about")
    # with the launches it asks for, the same noise gives "no significant difference"
    more = v.cells[0].more_launches
    pattern = [10.0, 10.5, 9.8]
    many = {s: (pattern * (more + 3))[: 3 + more] for s in SIZES}
    v = evaluate({"default": many, "aa": dict(many)})
    assert {c.verdict for c in v.cells} == {SAME}


def simulated_run(rng: random.Random, shift: float, noise: float, launches: int = 3, configs=("default", "aa")):
    """Launch medians with multiplicative launch noise (log-normal) and a launch-level factor
    shared by all sizes of a launch, as on real machines."""
    table = {}
    for c in configs:
        table[c] = {s: [] for s in SIZES}
        for _ in range(launches):
            launch_factor = math.exp(rng.gauss(0, noise))
            for s in SIZES:
                base = 10.0 + s / 1e5
                mult = shift if c != "default" else 1.0
                table[c][s].append(base * mult * launch_factor * math.exp(rng.gauss(0, noise / 3)))
    return table


def test_aa_false_differences_stay_within_the_family_wise_rate():
    rng = random.Random(1234)
    runs_with_a_difference = 0
    for _ in range(300):
        v = evaluate(simulated_run(rng, 1.0, noise=0.07))
        runs_with_a_difference += any(c.verdict in (FASTER, SLOWER) for c in v.cells + v.band_cells)
    # 1% family-wise by construction (stats.ALPHA); allow sampling slack (binomial sd ~ 0.6%).
    assert runs_with_a_difference <= 0.03 * 300


def test_known_10_percent_shift_is_detected():
    # Power: 3 launches at 1% launch noise, or 5 launches at 1.5%, find a 10% speedup at every size.
    rng = random.Random(7)
    for noise, launches in ((0.01, 3), (0.015, 5)):
        detected = 0
        for _ in range(50):
            v = evaluate(simulated_run(rng, 0.90, noise=noise, launches=launches, configs=("default", "fast", "aa")))
            detected += all(cell(v, "fast", s).verdict == FASTER for s in SIZES)
        assert detected >= 45, (noise, launches, detected)
    # One literal case, checked in full: the ratio, its interval, the winners.
    table = {"default": {s: [10.0, 10.2, 9.9] for s in SIZES},
             "fast": {s: [9.0, 9.15, 8.95] for s in SIZES},
             "aa": {s: [10.1, 9.95, 10.15] for s in SIZES}}
    v = evaluate(table)
    c = cell(v, "fast", 4096)
    assert c.verdict == FASTER and c.ratio == pytest.approx(0.9, abs=0.01)
    assert c.lo < c.ratio < c.hi < 1.0
    assert cell(v, "aa", 4096).verdict == SAME
    assert {w.config for w in v.size_winners} == {"fast"}
    assert v.band_winner("decode", "graph").config == "fast"
    assert v.band_winner("prefill", "graph").config == "fast"


def test_known_10_percent_slowdown_is_slower_and_never_wins():
    table = {"default": {s: [10.0, 10.2, 9.9] for s in SIZES},
             "slow": {s: [11.0, 11.2, 10.95] for s in SIZES}}
    v = evaluate(table)
    assert {c.verdict for c in v.cells} == {SLOWER}
    assert all(w.config is None for w in v.size_winners + v.band_winners)


def test_bimodal_noise_produces_no_winner():
    # The eager-mode numbers measured on 2x H200: identical launches at 23.7, 39.7, 24.9, 40.1 us.
    table = {"default": {4096: [23.7, 39.7, 24.9, 40.1]},
             "lucky": {4096: [24.0, 25.1, 38.0]},  # looks ~15% faster: two of three launches landed fast
             "aa": {4096: [40.3, 24.2, 39.9]}}
    v = evaluate(table, bands={"decode": [1, 64]})
    c = cell(v, "lucky", 4096)
    assert c.time_us / c.default_us < 0.8  # comparing medians would crown it (25.1 vs 32.3 us)
    assert c.verdict == INCONCLUSIVE
    assert c.more_launches and c.more_launches > 3
    assert "more launches needed" in c.label
    assert all(w.config is None for w in v.size_winners + v.band_winners)
    assert any("noise" in w for w in v.warnings)


def test_launches_that_agree_by_luck_do_not_buy_a_narrow_interval():
    # Default landed fast three times, the copy slow three times, while the other configs show
    # that launches swing by 40%: the pooled noise must keep this from being "different".
    table = {"default": {4096: [24.0, 24.3, 24.1]}, "aa": {4096: [26.5, 26.6, 26.4]},
             "x": {4096: [24.0, 40.0, 25.0]}, "y": {4096: [39.0, 24.5, 40.5]}}
    v = evaluate(table, bands={})
    assert cell(v, "aa", 4096).verdict != SLOWER


def test_a_config_with_wrong_results_is_never_a_winner():
    table = {"default": {s: [10.0, 10.2, 9.9] for s in SIZES},
             "wrongsum": {s: [7.0, 7.1, 6.9] for s in SIZES},  # fastest of all: it skips work
             "fast": {s: [9.0, 9.15, 8.95] for s in SIZES}}
    run = {"launches": [{"index": 0, "config": "wrongsum", "trial": 0, "status": "incorrect", "wrong": 12},
                        {"index": 1, "config": "fast", "trial": 0, "status": "ok", "wrong": 0}]}
    excluded = stats.exclusions(run)
    assert set(excluded) == {"wrongsum"} and "incorrect" in excluded["wrongsum"]
    v = evaluate(table, excluded=excluded)
    assert cell(v, "wrongsum", 4096).verdict == FASTER and not cell(v, "wrongsum", 4096).eligible
    assert {w.config for w in v.size_winners} == {"fast"}
    assert v.band_winner("decode", "graph").config == "fast"


def test_failed_or_timed_out_launch_excludes_and_only_trusted_launches_count():
    run = {"launches": [
        {"index": 0, "config": "a", "status": "failed"},
        {"index": 1, "config": "b", "status": "timeout", "results_complete": True},
        {"index": 2, "config": "c", "status": "timeout", "results_complete": False},
        {"index": 3, "config": "d", "status": "ok", "wrong": 0},
        {"index": 4, "config": "e", "status": "incorrect", "wrong": 3}]}
    assert set(stats.exclusions(run)) == {"a", "b", "c", "e"}
    assert stats.usable_launches(run) == {1, 3}


def test_one_launch_per_config_is_inconclusive():
    v = evaluate({"default": {4096: [10.0]}, "fast": {4096: [5.0]}}, bands={})
    c = cell(v, "fast", 4096)
    assert c.verdict == INCONCLUSIVE and c.lo is None and c.more_launches is None
    assert "noise unknown" in c.label


def test_real_but_tiny_difference_is_below_the_minimum_effect():
    table = {"default": {4096: [10.0, 10.001, 9.999]}, "tiny": {4096: [9.85, 9.851, 9.849]}}
    v = evaluate(table, bands={})
    c = cell(v, "tiny", 4096)
    assert c.hi < 1.0  # significant ...
    assert c.verdict == SAME  # ... but 1.5% is below the 3% minimum effect


def test_bonferroni_family_counts_every_comparison():
    table = {"default": {s: [10.0, 10.1] for s in SIZES}, "a": {s: [10.0, 10.1] for s in SIZES},
             "b": {s: [10.0, 10.1] for s in SIZES}}
    v = evaluate(table)
    assert v.family_size == 2 * len(SIZES)
    assert v.band_family_size == 2 * len(BANDS)


def test_band_winner_must_not_be_slower_at_any_size_of_the_band():
    table = {"default": {4096: [10.0, 10.1, 9.9], 65536: [10.0, 10.1, 9.9]},
             "mixed": {4096: [6.0, 6.05, 5.95], 65536: [11.5, 11.6, 11.45]}}
    v = evaluate(table, bands={"decode": [1, 64]})
    assert cell(v, "mixed", 4096).verdict == FASTER and cell(v, "mixed", 65536).verdict == SLOWER
    assert v.band_winner("decode", "graph").config is None


def test_profile_plan_writes_band_winners_and_profile_env_for_the_first_band():
    table = {"default": {s: [10.0, 10.2, 9.9] for s in SIZES},
             "fast": {s: [9.0, 9.15, 8.95] for s in SIZES}}
    v = evaluate(table)
    run = {"configs": [{"name": "default", "env": {"NCCL_NVLS_ENABLE": "0"}},
                       {"name": "fast", "env": {"NCCL_NVLS_ENABLE": "0", "NCCL_PROTO": "LL"}}]}
    plan = stats.profile_plan(v, run, "reports/x", "2026-11-29T00:00:00Z")
    assert set(plan) == {"profile-decode.env", "profile-prefill.env", "profile.env"}
    settings, meta = plan["profile.env"]
    assert settings == {"NCCL_NVLS_ENABLE": "0", "NCCL_PROTO": "LL"}
    assert "band decode" in meta["source"] and meta["mode"] == "graph"


def test_profile_env_is_withheld_when_the_decode_winner_hurts_prefill():
    table = {"default": {s: [10.0, 10.2, 9.9] for s in SIZES},
             "decodeonly": {4096: [8.0, 8.1, 7.95], 65536: [8.0, 8.1, 7.95],
                            1048576: [12.0, 12.1, 11.9], 4194304: [12.0, 12.1, 11.9]}}
    v = evaluate(table)
    plan = stats.profile_plan(v, {"configs": [{"name": "decodeonly", "env": {"NCCL_PROTO": "LL"}}]}, "r", "t")
    assert set(plan) == {"profile-decode.env"}


def test_no_winner_means_no_profile():
    same = {s: [10.0, 10.2, 9.9] for s in SIZES}
    assert stats.profile_plan(evaluate({"default": same, "aa": same}), {"configs": []}, "r", "t") == {}


@pytest.mark.parametrize("run", ["cpu-aa-a", "cpu-aa-b"])
def test_recorded_real_aa_runs_never_come_out_different(run):
    v = stats.evaluate_run(results.load_run(FIXTURES / run))
    assert v.cells, "the fixture must contain comparisons"
    assert not [c for c in v.cells + v.band_cells if c.verdict in (FASTER, SLOWER)]
    assert all(w.config is None for w in v.size_winners + v.band_winners)


def test_an_interval_spanning_orders_of_magnitude_is_called_too_wide():
    from dataclasses import replace

    cell = next(c for c in stats.evaluate_run(results.load_run(FIXTURES / "cpu-aa-a")).cells if c.lo is not None)
    assert "too wide" not in replace(cell, ratio=1.0, lo=0.9, hi=1.1).ratio_text()
    assert replace(cell, ratio=1.0, lo=0.001, hi=900.0).ratio_text() == "1.000 [interval too wide to tell: more launches]"
