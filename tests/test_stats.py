"""The verdict method on literal data and recorded real CPU runs: stats.py, screening.py, certify.py, verdict.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from commdiag.analyse import certify, paired, screening, stats, verdict
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


NOISY1 = [10.0, 10.1, 9.9, 10.05, 9.95, 10.02, 9.98, 10.08, 10.03, 9.97, 10.06, 9.94, 10.01]


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
    assert stats.launches_to_reach(0.005, TWO_SIDED) == 6 and stats.launches_to_reach(0.005, LESS) == 5


def _enumerated_p(d, alternative):
    """The signed-rank p by brute force: every one of the 2^n sign patterns of the non-zero d's, with
    mid-ranks for tied |d| (what paired.py computes by dynamic programming)."""
    from scipy.stats import rankdata

    d = np.asarray(d, dtype=float)
    d = d[np.abs(d) >= paired.ZERO_TOL]
    if d.size == 0:
        return 1.0
    r = rankdata(np.round(np.abs(d), 9))
    t = r[d > 0].sum()
    signs = (np.arange(2 ** len(d))[:, None] >> np.arange(len(d))) & 1  # every pattern, one per row
    w = signs @ r
    if alternative == LESS:
        return float(np.mean(w <= t + 1e-9))
    mu = r.sum() / 2
    return float(np.mean(np.abs(w - mu) >= abs(t - mu) - 1e-9))


def test_the_paired_p_is_the_full_enumeration_with_ties_and_zeros_up_to_16_rounds():
    rng = np.random.default_rng(16)
    for n in list(range(1, 17)) + [16, 16]:
        for kind in ("plain", "ties", "zeros"):
            d = rng.normal(0.2, 1.0, n)
            if kind == "ties":
                d = np.round(d * 2) / 2 + 0.001 * (d > 0)  # tied |d| of both signs
            elif kind == "zeros":
                d[: max(1, n // 4)] = 0.0
            for alt in (LESS, TWO_SIDED):
                assert paired.signed_rank_p(d, alt) == pytest.approx(_enumerated_p(d, alt), abs=1e-12), (n, kind, alt)


def test_the_paired_p_matches_scipys_exact_wilcoxon_and_is_vectorised():
    from scipy.stats import wilcoxon

    rng = np.random.default_rng(200)
    rows = [rng.normal(0.3, 1.0, 9) for _ in range(30)]
    for n in (5, 12, 25, 50, 200):
        rows.append(rng.normal(0.2, 1.0, n))
    for d in rows:
        for alt in (LESS, TWO_SIDED):
            want = wilcoxon(d, alternative=alt, method="exact").pvalue
            assert paired.signed_rank_p(d, alt) == pytest.approx(want, rel=1e-9, abs=1e-15)
    block = np.stack(rows[:30])  # claims x rounds, as the simulation calls it
    block[3, :2] = 0.0  # a row with zeros takes the exact path of its own
    got = paired.signed_rank_p(block, LESS)
    assert list(got) == pytest.approx([paired.signed_rank_p(r, LESS) for r in block])


def test_the_paired_floor_rounds_estimate_and_interval():
    assert paired.smallest_p(6, LESS) == 1 / 64 and paired.smallest_p(9, TWO_SIDED) == pytest.approx(2 / 512)
    assert paired.signed_rank_p([-1.0] * 8, LESS) == pytest.approx(1 / 256)  # every round faster: the floor
    assert paired.rounds_to_reach(0.005, LESS) == 8 and paired.rounds_to_reach(0.005, TWO_SIDED) == 9
    # the Walsh averages of [1, 2, 3]: 1, 1.5, 2, 2, 2.5, 3
    assert paired.hodges_lehmann([1.0, 2.0, 3.0]) == pytest.approx(2.0)
    assert paired.hodges_lehmann([0.0, 0.0, 10.0]) == pytest.approx(2.5)  # robust: one wild round moves it little
    assert paired.interval([1.0, 2.0, 3.0], 0.01) is None  # 3 rounds cannot make a 98% interval
    rng = np.random.default_rng(5)
    for _ in range(200):  # the interval's duality with the test: its upper end < 0 iff p <= the tail level
        d = rng.normal(-0.5, 1.0, 10)
        lo, hi = paired.interval(d, 0.02)
        assert (hi < 0) == (paired.signed_rank_p(d, LESS) <= 0.02)
        assert (lo > 0) == (paired.signed_rank_p(-d, LESS) <= 0.02)
        assert lo <= paired.hodges_lehmann(d) <= hi


def test_the_cpu_twin_that_was_crowned_is_not_certified():
    # A real case: gloo A/A on CPU, launch medians 2630/2418/3275 (default) vs 717/847/847 us
    # (twin_b): the old t interval said "0.291 faster" and named a winner.  Screening still shows the
    # estimate; stage 2's fresh launches fall into the same two states for both and certify nothing.
    stage1 = {"default": [2630.0, 2418.0, 3275.0], "twin_a": [2500.0, 800.0, 2900.0], "twin_b": [717.0, 847.0, 847.0]}
    fresh = {"default": [760.0, 2700.0, 820.0, 2950.0, 790.0, 2600.0, 2650.0, 810.0],
             "twin_b": [2800.0, 830.0, 2500.0, 770.0, 3100.0, 805.0, 790.0, 2750.0]}
    run, values = make_run(stage1, fresh)
    v = judge(run, values)
    est = v.screening.band_cell("twin_b", "decode", "graph")
    assert est.ratio < 0.35 and "not certified" in est.label  # an estimate, labelled as such
    assert [c.claim.config for c in v.certifications] == ["twin_b", "twin_b"]
    (c, _) = v.certifications
    assert not c.certified and c.result == certify.NOT_CERTIFIED
    assert "two states" in c.text and "keep NCCL defaults" in c.text
    assert "smallest attainable 0.0039" in c.text and "over 8 rounds" in c.text  # 2 claims, one-sided: 2^-8
    assert all(w.config is None for w in v.band_winners)
    assert verdict.profile_plan(v, run, "r", "t") == {}


def test_a_clear_10_percent_winner_is_certified_and_makes_profiles():
    stage1 = {"default": [10.0, 10.2, 9.9], "fast": [9.0, 9.15, 8.95], "aa": [10.1, 9.95, 10.15]}
    fresh = {"default": NOISY1[:11], "fast": [x * 0.9 for x in NOISY1[2:13]]}
    run, values = make_run(stage1, fresh)
    v = judge(run, values)
    assert v.status == verdict.CONFIRMED and v.family_size == 2
    assert {(c.claim.band, c.claim.alternative) for c in v.certifications} == {("decode", LESS), ("prefill", LESS)}
    for c in v.certifications:
        assert c.result == certify.FASTER and c.ratio == pytest.approx(0.9, abs=0.01)
        assert c.p == pytest.approx(1 / 2048) and c.p <= c.threshold == pytest.approx(0.0025)
        assert c.rounds == 11 and c.test == certify.PAIRED and c.ratio_ci[1] < 0.97
        assert c.text.startswith("certified 10.1% faster: ratio 0.899 (Hodges-Lehmann, 99.5% interval 0.893-0.905)")
        assert c.lines("  ")[0] == f"  fast vs default, {c.claim.band} band (graph): certified 10.1% faster"
        assert c.lines("  ")[1].startswith("      ratio 0.899") and max(len(x) for x in c.lines("  ")) <= 100
    assert v.band_winner("decode", "graph").config == "fast"
    plan = verdict.profile_plan(v, run, "reports/x", "2026-11-30T00:00:00Z")
    assert set(plan) == {"profile-decode.env", "profile-prefill.env", "profile.env"}
    settings, meta = plan["profile.env"]
    assert settings == {"NCCL_PROTO": "fast"} and meta["config"] == "fast" and "p = 0.00049" in meta["certified"]


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
    fresh = {"default": NOISY1[:12], "seed": [x * 2.4 for x in NOISY1[1:13]]}
    run, values = make_run(stage1, fresh, confirm=("seed",))
    v = judge(run, values)
    assert v.family_size == 2 and {c.claim.alternative for c in v.certifications} == {TWO_SIDED}
    assert all(c.result == certify.SLOWER and c.ratio > 2.3 for c in v.certifications)
    assert "certified 140.2% slower" in v.certifications[0].text and v.certifications[0].rounds == 12
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
    run, values = make_run(stage1, {"default": NOISY1[:11], "fast": [x * 0.9 for x in NOISY1[1:12]]},
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
    run, values = make_run(stage1, {"default": [10.0] * 11,
                                    "tiny": [9.85, 9.851, 9.849, 9.852, 9.848, 9.85, 9.853, 9.847, 9.846, 9.854,
                                             9.8505]})
    v = judge(run, values)
    (c, _) = v.certifications
    assert c.p <= c.threshold and not c.certified and "1.5% faster is real" in c.text and "below the 3%" in c.text


def test_profile_env_is_withheld_when_the_decode_winner_is_slower_in_prefill():
    stage1 = {"default": [10.0, 10.2, 9.9], "decodeonly": [9.0, 9.1, 8.95]}
    slow_prefill = {"decodeonly": {1048576: 1.25, 4194304: 1.25}}  # fresh launches: 10% faster, but slow prefill
    run, values = make_run(stage1, {"default": NOISY1[:11], "decodeonly": [x * 0.9 for x in NOISY1[1:12]]},
                           stage2_scale=slow_prefill)
    v = judge(run, values)
    assert v.band_winner("decode", "graph").config == "decodeonly"
    assert v.band_winner("decode", "graph").other_bands["prefill"] > 1.1
    assert set(verdict.profile_plan(v, run, "r", "t")) == {"profile-decode.env"}


def test_drift_across_rounds_is_paired_away_and_only_reported():
    # The machine slows 5% a round through stage 2: launches of different rounds are not comparable, launches
    # of the same round are.  The paired test certifies the 10% effect, and the trend is reported, not acted on.
    stage1 = {"default": [10.0, 10.2, 9.9], "fast": [9.0, 9.1, 8.95]}
    drifting = [10.0 * 1.05 ** i for i in range(11)]
    wobble = [1.0, 1.004, 0.997, 1.002, 0.999, 1.003, 0.998, 1.001, 1.002, 0.998, 1.0]
    run, values = make_run(stage1, {"default": drifting, "fast": [x * 0.9 * w for x, w in zip(drifting, wobble)]})
    for c in judge(run, values).certifications:
        assert c.certified and c.test == certify.PAIRED and c.ratio == pytest.approx(0.9, abs=0.005)
        assert c.drift[0] > 0.9 and c.drift[1] < 0.05  # default's Spearman trend, in the JSON only
        assert "drift" not in c.text
    # the unpaired test on the same launches cannot see it: the drift spreads both arms over the same range
    c = judge(run, values).certifications[0]
    x = [math.log(v) for v in c.config_us]
    y = [math.log(v) for v in c.default_us]
    assert stats.rank_test(x, y, LESS) > c.threshold


def test_incomplete_rounds_are_left_out_and_counted():
    stage1 = {"default": [10.0, 10.2, 9.9], "fast": [9.0, 9.1, 8.95]}
    run, values = make_run(stage1, {"default": NOISY1[:11], "fast": [x * 0.9 for x in NOISY1[1:12]]})
    lost = [l for l in run["launches"] if l.get("stage") == 2 and l["config"] == "fast" and l["round"] in (3, 5, 7)]
    values = [v for v in values if v.launch != lost[0]["index"]]  # its values never made it (not a failed status)
    c = judge(run, values).certifications[0]
    assert c.rounds == 10 and c.dropped == 1 and "1 incomplete round left out" in c.text
    assert len(c.config_us) == len(c.default_us) == 10  # p, ratio and the plotted launches: the same rounds
    assert c.certified  # the two spare rounds: one lost launch still certifies (2^-10 <= 0.0025)
    values = [v for v in values if v.launch not in {l["index"] for l in lost}]
    c = judge(run, values).certifications[0]
    assert c.rounds == 8 and c.dropped == 3 and c.p_floor == pytest.approx(1 / 256) and not c.certified
    assert "too few complete rounds left" in c.text


def test_a_plan_with_too_few_rounds_is_not_certifiable_and_launches_nothing():
    stage1 = {"default": [10.0, 10.2, 9.9], "fast": [9.0, 9.1, 8.95]}
    run, values = make_run(stage1, rounds=6)  # confirm.rounds: 6 for 2 one-sided claims: 2^-6 > 0.0025
    plan = run["confirmation"]
    assert plan["configs"] == [] and plan["looks"][0]["rounds"] == 0 and plan["rounds_needed"] == 11
    assert plan["looks"][0]["alpha_spent"] == 0
    v = judge(run, values)
    assert v.status == verdict.NOT_CERTIFIABLE and "--rounds 9" in v.status_note
    c = v.certifications[0]
    assert c.headline == "not certifiable with this plan, keep NCCL defaults"
    assert "fast was not launched" in c.text and "commdiag confirm RUN_DIR --rounds 9" in c.text
    # a further look keeps the threshold: the first look could not certify anything, so it spent nothing
    certify.add_look(plan, 9, "t2")
    assert plan["looks"][1]["threshold"] == pytest.approx(0.0025) and plan["configs"] == ["default", "fast"]


def test_hopeless_noise_says_it_cannot_be_certified_at_a_sane_cost():
    stage1 = {"default": [10.0, 10.2, 9.9], "fast": [9.5, 9.6, 9.55]}
    rng = np.random.default_rng(3)
    fresh = {"default": list(10 * np.exp(rng.normal(0, 0.3, 8))), "fast": list(9.6 * np.exp(rng.normal(0, 0.3, 8)))}
    run, values = make_run(stage1, fresh)
    c = judge(run, values).certifications[0]
    assert not c.certified and c.launches_needed > certify.SANE_LAUNCHES
    assert "cannot be certified at a sane cost" in c.text and "launches per arm would give 80% power" in c.text
    # the effect powered for is screening's estimate (independent of these rounds), not stage 2's: that is noise
    assert "if the true effect were the screening estimate's 4.8% faster" in c.text


def test_nothing_to_confirm_when_screening_finds_no_candidate():
    stage1 = {"default": [10.0, 10.2, 9.9], "aa": [10.1, 9.95, 10.15]}
    run, values = make_run(stage1)
    assert run["confirmation"]["claims"] == [] and run["confirmation"]["looks"][0]["rounds"] == 0
    v = judge(run, values)
    assert v.status == verdict.NO_CANDIDATES and "keep NCCL defaults" in v.status_note


def test_further_looks_spend_half_of_what_is_left_and_stay_within_alpha():
    # the first look spends alpha/2, each later one half of what is left: 1% over any number of looks
    # (main tested the first at alpha/M and then halved: 1% + 0.5% + 0.25% + ... = 1.875% after four)
    plan = certify.confirmation_plan([certify.Claim("x", "graph", "decode", None, LESS, "screening", 0.9)] * 2,
                                     None, 9, "t")
    assert plan["looks"][0]["threshold"] == pytest.approx(0.0025) and plan["looks"][0]["rounds"] == 11
    assert plan["looks"][0]["alpha_spent"] == pytest.approx(0.005) and "alpha/2" in plan["alpha_spending"]
    certify.add_look(plan, 4, "t2")
    assert plan["looks"][1] == {"look": 2, "rounds": 4, "threshold": pytest.approx(0.00125), "created_utc": "t2",
                                "alpha_spent": pytest.approx(0.0025)}
    for k in range(3, 12):
        certify.add_look(plan, 4, f"t{k}")
        assert plan["looks"][-1]["threshold"] == pytest.approx(0.0025 / 2 ** (k - 1))
        assert certify.alpha_spent(plan) < stats.ALPHA
    assert certify.alpha_spent(plan) == pytest.approx(stats.ALPHA * (1 - 2 ** -11))


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
    run, values = make_run(stage1, {"default": NOISY1[:11], "fast": [x * 0.9 for x in NOISY1[2:13]]})
    v = judge(run, values)
    from dataclasses import replace

    bad = replace(v, screening=replace(v.screening, bands={"de/code": BANDS["decode"], "prefill": BANDS["prefill"]}),
                  band_winners=tuple(replace(w, band="de/code") if w.band == "decode" else w for w in v.band_winners))
    assert set(verdict.profile_plan(bad, run, "r", "t")) == {"profile-prefill.env"}
