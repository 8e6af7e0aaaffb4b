"""The verdict method on literal data and recorded real CPU runs: stats.py, screening.py, certify.py, verdict.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from commdiag.analyse import certify, screening, stats, verdict
from commdiag.formats import results
from commdiag.analyse.stats import LESS, TWO_SIDED, LaunchValue

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
SIZES = {4096: 1, 65536: 16, 1048576: 256, 4194304: 1024}
BANDS = {"decode": [1, 64], "prefill": [256, None]}


def make_run(stage1: dict[str, list[float]], stage2: dict[str, list[float]] | None = None, *,
             confirm: tuple[str, ...] = (), per_size: dict[str, dict[int, float]] | None = None,
             rounds: int | None = None, excluded: dict | None = None, stage2_scale: dict | None = None):
    """A run of literal launch times (us, one number per launch, the same at every size unless
    ``per_size`` scales a config at a size).  Stage 2 is planned by commdiag itself from stage 1;
    ``stage2`` gives each planned config's fresh launch times in round order."""
    names = list(stage1)
    run = {"version": 3, "spec": {"sizes": [{"bytes": b, "tokens": t} for b, t in SIZES.items()],
                                  "modes": ["graph"], "bands": BANDS},
           "configs": [{"name": n, "env": {"NCCL_PROTO": n} if n != "default" else {}} for n in names],
           "launches": []}
    values = []
    index = 0

    def add(config, t, stage, rnd=None):
        nonlocal index
        run["launches"].append({"index": index, "config": config, "stage": stage, "status": "ok",
                                **({"round": rnd} if rnd is not None else {})})
        for size in SIZES:
            scale = (per_size or {}).get(config, {}).get(size, 1.0)
            if stage == 2:
                scale *= (stage2_scale or {}).get(config, {}).get(size, 1.0)
            values.append(LaunchValue(config, index, size, "graph", math.log(t * scale), stage))
        index += 1

    for k in range(max(len(v) for v in stage1.values())):
        for n in names:
            if k < len(stage1[n]):
                add(n, stage1[n][k], 1)
    scr = screening.screen(values, configs=names, modes=["graph"], tokens_by_size=SIZES, bands=BANDS,
                           excluded=excluded)
    claims = certify.plan_claims(scr, confirm)
    run["confirmation"] = certify.confirmation_plan(claims, rounds, index, "t")
    if stage2 is not None:
        for r in range(max(len(v) for v in stage2.values())):
            for n in run["confirmation"]["configs"]:
                if r < len(stage2.get(n, [])):
                    add(n, stage2[n][r], 2, r)
    return run, values


def judge(run, values, excluded=None):
    return verdict.evaluate(values, run, excluded or {})


NOISY1 = [10.0, 10.1, 9.9, 10.05, 9.95, 10.02, 9.98, 10.08]


def test_per_launch_value_is_the_5_percent_trimmed_mean_of_ln_time():
    from scipy.stats import trim_mean

    # One launch mixing a fast and a slow mode (gloo on CPU): 52% fast, 48% slow.
    times = [0.6] * 52 + [5.0] * 48
    df = pd.DataFrame({"config": "default", "launch": 0, "size_bytes": 4096, "mode": "eager", "time_us": times})
    (v,) = stats.launch_values(df)
    assert v.value == pytest.approx(trim_mean(np.log(times), 0.05))
    # the median sits in one mode and jumps to the other when two samples move; the trimmed mean barely moves
    moved = df.assign(time_us=[0.6] * 49 + [5.0] * 51)
    (w,) = stats.launch_values(moved)
    assert abs(w.value - v.value) < 0.08  # 3 of 90 kept samples moved by ln(5/0.6)
    assert math.log(moved["time_us"].median()) - math.log(df["time_us"].median()) > 2


def test_exact_rank_test_and_hodges_lehmann_on_hand_checked_cases():
    assert stats.rank_test([1, 2, 3], [4, 5, 6], LESS) == pytest.approx(1 / 20)
    assert stats.rank_test([1, 2, 3], [4, 5, 6], TWO_SIDED) == pytest.approx(2 / 20)
    assert stats.rank_test([4, 5, 6], [1, 2, 3], LESS) == pytest.approx(1.0)
    assert stats.hodges_lehmann([1, 2, 3], [0, 0, 0]) == pytest.approx(2.0)
    assert stats.signflip_test([-1, -1, -1], LESS) == pytest.approx(1 / 8)
    assert stats.launches_to_reach(0.005, TWO_SIDED) == 6 and stats.launches_to_reach(0.005, LESS) == 5


def test_the_cpu_twin_that_was_crowned_is_not_certified():
    # The real case: gloo A/A on CPU, launch medians 2630/2418/3275 (default) vs 717/847/847 us
    # (twin_b): the old t interval said "0.291 faster" and named a winner.  Screening still shows the
    # estimate; stage 2's fresh launches fall into the same two states for both and certify nothing.
    stage1 = {"default": [2630.0, 2418.0, 3275.0], "twin_a": [2500.0, 800.0, 2900.0], "twin_b": [717.0, 847.0, 847.0]}
    fresh = {"default": [760.0, 2700.0, 820.0, 2950.0, 790.0, 2600.0],
             "twin_b": [2800.0, 830.0, 2500.0, 770.0, 3100.0, 805.0]}
    run, values = make_run(stage1, fresh)
    v = judge(run, values)
    est = v.screening.band_cell("twin_b", "decode", "graph")
    assert est.ratio < 0.35 and "not certified" in est.label  # an estimate, labelled as such
    assert [c.claim.config for c in v.certifications] == ["twin_b", "twin_b"]
    (c, _) = v.certifications
    assert not c.certified and c.result == certify.NOT_CERTIFIED
    assert "two states" in c.text and "keep NCCL defaults" in c.text
    assert "smallest attainable p = 0.0011" in c.text and "6 launches per arm" in c.text
    assert all(w.config is None for w in v.band_winners)
    assert verdict.profile_plan(v, run, "r", "t") == {}


def test_a_clear_10_percent_winner_is_certified_and_makes_profiles():
    stage1 = {"default": [10.0, 10.2, 9.9], "fast": [9.0, 9.15, 8.95], "aa": [10.1, 9.95, 10.15]}
    fresh = {"default": NOISY1[:6], "fast": [x * 0.9 for x in NOISY1[2:8]]}
    run, values = make_run(stage1, fresh)
    v = judge(run, values)
    assert v.status == verdict.CONFIRMED and v.family_size == 2
    assert {(c.claim.band, c.claim.alternative) for c in v.certifications} == {("decode", LESS), ("prefill", LESS)}
    for c in v.certifications:
        assert c.result == certify.FASTER and c.ratio == pytest.approx(0.9, abs=0.01)
        assert c.p == pytest.approx(1 / 924) and c.p <= c.threshold == pytest.approx(0.005)
        assert c.text.startswith("certified faster: 10.0% faster")
    assert v.band_winner("decode", "graph").config == "fast"
    plan = verdict.profile_plan(v, run, "reports/x", "2026-11-30T00:00:00Z")
    assert set(plan) == {"profile-decode.env", "profile-prefill.env", "profile.env"}
    settings, meta = plan["profile.env"]
    assert settings == {"NCCL_PROTO": "fast"} and meta["config"] == "fast" and "p = 0.0011" in meta["certified"]


def test_screening_alone_never_certifies_or_writes_a_profile():
    stage1 = {"default": [10.0, 10.2, 9.9], "fast": [5.0, 5.1, 4.9]}  # 2x faster in screening
    run, values = make_run(stage1)
    del run["confirmation"]
    run["confirm_requested"] = False
    v = judge(run, values)
    assert v.status == verdict.SCREENING_ONLY and "--no-confirm" in v.status_note
    assert not v.certifications and all(w.config is None for w in v.band_winners)
    assert verdict.profile_plan(v, run, "r", "t") == {}


def test_a_named_config_is_certified_slower_and_never_wins():
    stage1 = {"default": [10.0, 10.2, 9.9], "seed": [24.0, 24.1, 23.8]}
    fresh = {"default": NOISY1[:6], "seed": [x * 2.4 for x in NOISY1[1:7]]}
    run, values = make_run(stage1, fresh, confirm=("seed",))
    v = judge(run, values)
    assert v.family_size == 2 and {c.claim.alternative for c in v.certifications} == {TWO_SIDED}
    assert all(c.result == certify.SLOWER and c.ratio > 2.3 for c in v.certifications)
    assert "certified slower" in v.certifications[0].text
    assert all(w.config is None for w in v.band_winners)


def test_screening_candidate_and_named_config_merge_into_one_two_sided_claim():
    stage1 = {"default": [10.0, 10.2, 9.9], "seed": [9.0, 9.1, 8.9], "x": [9.5, 9.6, 9.4]}
    run, values = make_run(stage1, confirm=("seed",))
    claims = certify.claims_of(run["confirmation"])
    assert [(c.config, c.band, c.alternative, c.reason) for c in claims] == [
        ("seed", "decode", TWO_SIDED, "screening, confirm.configs"),
        ("seed", "prefill", TWO_SIDED, "screening, confirm.configs")]
    assert run["confirmation"]["configs"] == ["default", "seed"]


def test_a_certified_config_with_wrong_results_is_never_a_winner():
    stage1 = {"default": [10.0, 10.2, 9.9], "wrongsum": [7.0, 7.1, 6.9], "fast": [9.0, 9.1, 8.95]}
    excluded = stats.exclusions({"launches": [{"index": 0, "config": "wrongsum", "status": "incorrect", "wrong": 12}]})
    run, values = make_run(stage1, {"default": NOISY1[:6], "fast": [x * 0.9 for x in NOISY1[:6]]},
                           excluded=excluded)
    assert {c.config for c in certify.claims_of(run["confirmation"])} == {"fast"}  # wrongsum is not eligible
    v = judge(run, values, excluded)
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


def test_a_real_but_tiny_difference_is_not_worth_a_claim():
    stage1 = {"default": [10.0, 10.2, 9.9], "tiny": [9.6, 9.7, 9.6]}
    run, values = make_run(stage1, {"default": [10.0] * 6, "tiny": [9.85, 9.851, 9.849, 9.852, 9.848, 9.85]})
    v = judge(run, values)
    (c, _) = v.certifications
    assert c.p <= c.threshold and not c.certified and "1.5% faster is real" in c.text and "below the 3%" in c.text


def test_profile_env_is_withheld_when_the_decode_winner_is_slower_in_prefill():
    stage1 = {"default": [10.0, 10.2, 9.9], "decodeonly": [9.0, 9.1, 8.95]}
    slow_prefill = {"decodeonly": {1048576: 1.25, 4194304: 1.25}}  # fresh launches: 10% faster, but slow prefill
    run, values = make_run(stage1, {"default": NOISY1[:6], "decodeonly": [x * 0.9 for x in NOISY1[:6]]},
                           stage2_scale=slow_prefill)
    v = judge(run, values)
    assert v.band_winner("decode", "graph").config == "decodeonly"
    assert v.band_winner("decode", "graph").other_bands["prefill"] > 1.1
    assert set(verdict.profile_plan(v, run, "r", "t")) == {"profile-decode.env"}


def test_drift_across_rounds_switches_to_the_within_round_sign_flip_test():
    stage1 = {"default": [10.0, 10.2, 9.9], "fast": [9.0, 9.1, 8.95]}
    drifting = [10.0, 10.5, 11.0, 11.5, 12.0, 12.5]
    run, values = make_run(stage1, {"default": drifting, "fast": [x * 0.9 for x in drifting]})
    v = judge(run, values)
    c = v.certifications[0]
    assert c.test == "sign-flip" and c.drift[0] > 0.9
    assert not c.certified and "needs 8 or more paired rounds" in c.text  # 6 rounds cannot reach 0.005 (2^-6)
    # 8 rounds can (2 claims, one-sided: 1/256 <= 0.005)
    drifting8 = [10.0 + 0.5 * i for i in range(8)]
    run, values = make_run(stage1, {"default": drifting8, "fast": [x * 0.9 for x in drifting8]}, rounds=8)
    assert all(c.certified and c.test == "sign-flip" for c in judge(run, values).certifications)


def test_hopeless_noise_says_it_cannot_be_certified_at_a_sane_cost():
    stage1 = {"default": [10.0, 10.2, 9.9], "fast": [9.5, 9.6, 9.55]}
    rng = np.random.default_rng(3)
    fresh = {"default": list(10 * np.exp(rng.normal(0, 0.3, 6))), "fast": list(9.6 * np.exp(rng.normal(0, 0.3, 6)))}
    run, values = make_run(stage1, fresh)
    c = judge(run, values).certifications[0]
    assert not c.certified and c.launches_needed > certify.SANE_LAUNCHES
    assert "cannot be certified at a sane cost" in c.text and "launches per arm would give 80% power" in c.text
    assert "if the true effect were 5% (the screening estimate" in c.text  # not the stage-2 estimate: that is noise


def test_nothing_to_confirm_when_screening_finds_no_candidate():
    stage1 = {"default": [10.0, 10.2, 9.9], "aa": [10.1, 9.95, 10.15]}
    run, values = make_run(stage1)
    assert run["confirmation"]["claims"] == [] and run["confirmation"]["looks"][0]["rounds"] == 0
    v = judge(run, values)
    assert v.status == verdict.NO_CANDIDATES and "keep NCCL defaults" in v.status_note


def test_a_further_look_halves_the_threshold():
    plan = certify.confirmation_plan([certify.Claim("x", "graph", "decode", None, LESS, "screening", 0.9)] * 2,
                                     None, 9, "t")
    assert plan["looks"][0]["threshold"] == pytest.approx(0.005) and plan["looks"][0]["rounds"] == 6
    certify.add_look(plan, 4, "t2")
    assert plan["looks"][1] == {"look": 2, "rounds": 4, "threshold": pytest.approx(0.0025), "created_utc": "t2"}


def test_pending_stage_2_launches_mean_no_verdict_yet():
    stage1 = {"default": [10.0, 10.2, 9.9], "fast": [9.0, 9.15, 8.95]}
    run, values = make_run(stage1, {"default": NOISY1[:6], "fast": [x * 0.9 for x in NOISY1[:6]]})
    run["launches"][-1]["status"] = "pending"
    v = judge(run, values)
    assert v.status == verdict.PENDING and not v.certifications and "--resume" in v.status_note


@pytest.mark.parametrize("run", ["cpu-aa-a", "cpu-aa-b"])
def test_recorded_real_aa_runs_are_screening_only(run):
    v = verdict.evaluate_run(results.load_run(FIXTURES / run))
    assert v.screening.cells, "the fixture must contain estimates"
    assert v.status == verdict.SCREENING_ONLY and "before two-stage verdicts" in v.status_note
    assert not v.certifications and all(w.config is None for w in v.band_winners)


def test_a_band_name_that_cannot_be_a_file_name_gets_no_profile():
    # run folders recorded before band names were validated may hold one (--resume does not re-check)
    stage1 = {"default": [10.0, 10.2, 9.9], "fast": [9.0, 9.15, 8.95]}
    run, values = make_run(stage1, {"default": NOISY1[:6], "fast": [x * 0.9 for x in NOISY1[2:8]]})
    v = judge(run, values)
    from dataclasses import replace

    bad = replace(v, screening=replace(v.screening, bands={"de/code": BANDS["decode"], "prefill": BANDS["prefill"]}),
                  band_winners=tuple(replace(w, band="de/code") if w.band == "decode" else w for w in v.band_winners))
    assert set(verdict.profile_plan(bad, run, "r", "t")) == {"profile-prefill.env"}
