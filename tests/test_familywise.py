"""Issue #37: where the 1% family-wise promise broke, through the shipped functions.

Each false-certification rate is checked at its upper 95% Wilson bound (not the rate plus a margin): the
bound must be at most 1%.  The stage-2 A/A suite is vectorised with numpy (4000 runs per noise model, the
launch order from the shipped ``measure.stages.add_rounds``; rounds, thresholds, test, ratio, decision
and the tail check from certify/paired); the cases that need the whole claim function (failed launches,
coarse metrics, reuse_process) run a few hundred runs through ``certify.test_claim`` and
``ab.verdict.judge`` themselves.  ``benchmarks/familywise.py`` runs all of it at 4000 runs per model.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import numpy as np
import pytest

from commdiag.ab import verdict as abv
from commdiag.analyse import certify, paired
from commdiag.analyse.stats import ALPHA, DEFAULT, LESS, TWO_SIDED
from commdiag.formats.spec import launch_order
from commdiag.measure import stages, sweep
from conftest import one_message, run_cli, write_spec


def wilson_upper(k: int, n: int, z: float = 1.96) -> float:
    """The upper end of the 95% Wilson interval of k events in n runs."""
    p = k / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre + half) / (1 + z * z / n)


def test_wilson_upper_is_the_textbook_value():
    assert wilson_upper(0, 4000) == pytest.approx(0.00096, abs=1e-5)
    assert wilson_upper(20, 4000) == pytest.approx(0.00773, abs=1e-4)


# ---------------------------------------------------------------- the stage-2 A/A suite (vectorised)

RUNS = 4000
TWIN_CLAIMS = [certify.Claim("twin", "graph", b, None, TWO_SIDED, "confirm.configs", 1.0) for b in ("decode", "prefill")]
MODELS = ["normal3", "two-state", "t1", "t2", "drift5", "step10", "first+10", "first-10", "alternating10",
          "linear5", "spread10x", "quantised5"]


def stage2_places(runs: int, rounds: int, seed: int, configs=("default", "twin")):
    """pos[run, config, round] (place inside its round) and index[run, config, round] from _add_rounds."""
    rng = random.Random(seed)
    pos = np.zeros((runs, len(configs), rounds), dtype=int)
    index = np.zeros((runs, len(configs), rounds), dtype=int)
    for r in range(runs):
        run = {"seed": rng.randrange(2 ** 31), "launches": []}
        stages.add_rounds(run, {"looks": [{"rounds": rounds}], "configs": list(configs)}, SimpleNamespace(trials=0),
                          rounds)
        for launch in run["launches"]:
            c = configs.index(launch["config"])
            index[r, c, launch["round"]] = launch["index"]
            pos[r, c, launch["round"]] = launch["index"] % len(configs)
    return pos, index


def launch_values(model: str, rng, pos, index) -> np.ndarray:
    """ln values [run, config, round] under a model with no true effect."""
    shape = pos.shape
    total = index.max() + 1
    if model == "two-state":
        v = np.where(rng.random(shape) < 0.5, math.log(1.7), 0.0) + rng.normal(0, 0.01, shape)
    elif model in ("t1", "t2"):
        v = 0.01 * rng.standard_t(int(model[1]), shape)
    elif model == "spread10x":
        v = rng.normal(0, 1, shape) * np.array([0.01, 0.10])[None, :, None]
    else:
        v = rng.normal(0, 0.03 if model in ("normal3", "quantised5") else 0.01, shape)
    if model == "drift5":  # between and within rounds: the run's launch index
        v = v + index / total * math.log(1.05)
    if model == "step10":  # the machine steps 10% slower at a random launch of the run
        v = v + np.where(index >= rng.integers(0, total, (shape[0], 1, 1)), math.log(1.10), 0.0)
    if model in ("first+10", "first-10"):
        v = v + np.where(pos == 0, math.log(1.10 if model == "first+10" else 0.90), 0.0)
    if model == "alternating10":
        v = v + np.where(index % 2 == 1, math.log(1.05), math.log(0.95))
    if model == "linear5":
        v = v + pos * math.log(1.05)
    if model == "quantised5":  # a time printed in 5% steps (integers around 20)
        v = np.log(np.round(20 * np.exp(v)) / 20)
    return v


def stage2_false(d_bands: list[np.ndarray], x_bands, y_bands, thr: float) -> np.ndarray:
    """Per run: any claim certified (the library's decision and tail check, vectorised over runs)."""
    false = np.zeros(d_bands[0].shape[0], dtype=bool)
    for d, x, y in zip(d_bands, x_bands, y_bands):
        p = np.atleast_1d(paired.signed_rank_p(d, TWO_SIDED))
        ratio = np.exp(np.atleast_1d(paired.hodges_lehmann(d)))
        with np.errstate(over="ignore", invalid="ignore"):
            mean_ratio = np.exp(x).mean(-1) / np.exp(y).mean(-1)
        for i in np.flatnonzero(p <= thr):  # the library's decision where the test rejects at all
            pi, ri, mi = p[i], ratio[i], mean_ratio[i]
            res = certify.decide(float(pi), float(ri), thr, TWO_SIDED)
            if res == certify.SLOWER or (res == certify.FASTER and not mi >= 1.0):
                false[i] = True
    return false


@pytest.fixture(scope="module")
def places():
    k2 = certify.rounds_needed(TWIN_CLAIMS)
    return k2, stage2_places(RUNS, k2, 37)


@pytest.mark.parametrize("model", MODELS)
def test_stage_2_aa_twins_stay_within_1_percent_at_the_upper_wilson_bound(model, places):
    k2, (pos, index) = places
    rng = np.random.default_rng(MODELS.index(model) + 3700)
    v = launch_values(model, rng, pos, index)
    xs, ys, ds = [], [], []
    for _ in TWIN_CLAIMS:  # a band's value: the launch's value and the band's own small noise
        band = v + rng.normal(0, 0.003, v.shape)
        xs.append(band[:, 1])
        ys.append(band[:, 0])
        ds.append(band[:, 1] - band[:, 0])
    false = stage2_false(ds, xs, ys, certify.threshold(ALPHA, len(TWIN_CLAIMS)))
    assert wilson_upper(int(false.sum()), RUNS) <= ALPHA, (model, false.mean())


def test_any_number_of_further_looks_stays_within_1_percent():
    # four looks (the first at k2 rounds, then commdiag confirm --rounds 4 three times) at the thresholds
    # add_look sets; main's halving from alpha/M reached 1.32% [1.01, 1.73] in the audit
    plan = certify.confirmation_plan(TWIN_CLAIMS, None, 9, "t")
    for k in range(3):
        certify.add_look(plan, 4, f"t{k}")
    looks = [(certify.total_rounds(plan, i + 1), lk["threshold"]) for i, lk in enumerate(plan["looks"])]
    assert sum(t for _, t in looks) * len(TWIN_CLAIMS) <= ALPHA
    runs = 4000
    rng = np.random.default_rng(2)
    base = rng.normal(0, 0.05, (runs, 2, looks[-1][0]))  # 5% launch noise: the 3% rule rarely stops a claim
    d = [base[:, 1] - base[:, 0] + rng.normal(0, 0.003, base[:, 0].shape) for _ in TWIN_CLAIMS]
    false = np.zeros(runs, dtype=bool)
    for n, thr in looks:
        for db in d:
            p = paired.signed_rank_p(db[:, :n], TWO_SIDED)
            ratio = np.exp(paired.hodges_lehmann(db[:, :n]))
            false |= (p <= thr) & ((ratio <= 0.97) | (ratio >= 1.03))
    assert wilson_upper(int(false.sum()), runs) <= ALPHA, false.mean()


# ---------------------------------------------------------------- reuse_process (item 1)

REUSE_CONFIGS = {DEFAULT: {"env": {}}, "ll": {"env": {"NCCL_PROTO": "LL"}},
                 "twin": {"env": {"NCCL_BUFFSIZE": "4194304"}}}  # NCCL's own value: an A/A twin


def test_reuse_process_batches_a_round_only_when_every_config_shares_the_process():
    spec = SimpleNamespace(trials=3, configs=[SimpleNamespace(name=n) for n in REUSE_CONFIGS])
    launches = [{"index": l.index, "config": l.config, "trial": l.trial} for l in launch_order(spec, 5)]
    assert sweep.process_batches(launches, REUSE_CONFIGS, True) == [[l] for l in launches]
    shared = {n: c for n, c in REUSE_CONFIGS.items() if n != "twin"} | {"lr": {"env": {"NCCL_ALGO": "Ring"}}}
    spec = SimpleNamespace(trials=3, configs=[SimpleNamespace(name=n) for n in shared])
    launches = [{"index": l.index, "config": l.config, "trial": l.trial} for l in launch_order(spec, 5)]
    batches = sweep.process_batches(launches, shared, True)
    assert [len(b) for b in batches] == [3, 3, 3] and all(len({l["trial"] for l in b}) == 1 for b in batches)


def test_a_first_run_in_a_process_effect_never_certifies_a_twin():
    # +10% for the first run of every process (the first communicator and kernels, real on GPUs): main
    # shared default's process with ll but ran the twin alone, first every time: certified 9-63% of runs
    claims = [certify.Claim("twin", "graph", "decode", None, TWO_SIDED, "confirm.configs", 1.0)]
    k2 = certify.rounds_needed(claims)
    thr = certify.threshold(ALPHA, len(claims))
    runs, false = 400, 0
    rng = np.random.default_rng(11)
    for r in range(runs):
        run = {"seed": r, "launches": []}
        stages.add_rounds(run, {"looks": [{"rounds": k2}], "configs": list(REUSE_CONFIGS)},
                          SimpleNamespace(trials=0), k2)
        value = {}
        for batch in sweep.process_batches(run["launches"], REUSE_CONFIGS, True):
            for n, l in enumerate(batch):
                value[(l["config"], l["round"])] = rng.normal(0, 0.01) + (math.log(1.10) if n == 0 else 0.0)
        c = certify.test_claim(claims[0], {k: value[("twin", k)] for k in range(k2)},
                               {k: value[(DEFAULT, k)] for k in range(k2)}, thr=thr, look=1, eligible=True)
        false += c.certified
    assert wilson_upper(false, runs) <= ALPHA, false / runs


# ---------------------------------------------------------------- failures that depend on the config (item 3)

def test_a_config_whose_slow_launches_time_out_is_not_certified_faster():
    # two launch states for both; the config's slow launches time out (20 rounds, as confirm.rounds: 20):
    # judged on its good launches alone (main dropped those rounds) it was "certified faster" in 6.6%
    claim = certify.Claim("x", "graph", "decode", None, LESS, "screening", 0.9)
    thr = certify.threshold(ALPHA, 1)
    runs, false = 600, 0
    rng = np.random.default_rng(12)
    for _ in range(runs):
        slow = rng.random((2, 20)) < 0.3
        v = np.where(slow, math.log(1.5), 0.0) + rng.normal(0, 0.01, (2, 20))
        xs = {r: (None if slow[1, r] else float(v[1, r])) for r in range(20)}
        ys = {r: float(v[0, r]) for r in range(20)}
        c = certify.test_claim(claim, xs, ys, thr=thr, look=1, eligible=True, planned=20)
        false += c.certified
    assert wilson_upper(false, runs) <= ALPHA, false / runs
    assert c.failed == sum(v is None for v in xs.values()) and "failed launches counted" in c.text


def test_failed_stage_2_launches_reach_the_claim_through_the_run_folder_verdicts():
    from commdiag.analyse import stats as st, verdict

    sizes = {4096: 1, 1048576: 256}
    run = {"version": 5, "spec": {"sizes": [{"bytes": b, "tokens": t} for b, t in sizes.items()], "modes": ["graph"],
                                  "bands": {"decode": [1, 64], "prefill": [256, None]}},
           "configs": [{"name": DEFAULT, "env": {}}, {"name": "x", "env": {"NCCL_PROTO": "LL"}}], "launches": []}
    claims = [certify.Claim("x", "graph", b, None, LESS, "screening", 0.8) for b in ("decode", "prefill")]
    run["confirmation"] = certify.confirmation_plan(claims, None, 0, "t")
    k2 = run["confirmation"]["looks"][0]["rounds"]
    values = []
    for trial in range(3):  # screening (its sizes make the bands)
        for config, t in ((DEFAULT, 10.0), ("x", 8.0)):
            run["launches"].append({"index": len(run["launches"]), "config": config, "stage": 1, "trial": trial,
                                    "status": "ok"})
            values += [st.LaunchValue(config, len(run["launches"]) - 1, s, "graph", math.log(t), 1) for s in sizes]
    for r in range(k2):
        for config, t in ((DEFAULT, 10.0), ("x", 8.0)):
            status = "timeout" if config == "x" and r % 3 == 0 else "ok"  # a third of x's launches time out
            run["launches"].append({"index": len(run["launches"]), "config": config, "stage": 2, "round": r,
                                    "status": status})
            if status == "ok":
                values += [st.LaunchValue(config, len(run["launches"]) - 1, s, "graph", math.log(t * (1 + r / 1000)), 2)
                           for s in sizes]
    v = verdict.evaluate(values, run, st.exclusions(run))
    for c in v.certifications:  # 20% faster on every good launch, but a third failed: not certified
        assert c.failed == len(range(0, k2, 3)) and not c.certified
    # main left those rounds out and certified x 20% faster on the good ones (then excluded it as a winner)


def test_an_ab_arm_that_fails_often_is_not_certified_equivalent():
    # main: an arm that times out 20% of the time was EQUIVALENT in 50% of runs at 11 rounds, 100% at 20
    runs, eq = 400, 0
    rng = np.random.default_rng(13)
    for _ in range(runs):
        launches = []
        for r in range(20):
            for config in (DEFAULT, "arm"):
                fail = config == "arm" and rng.random() < 0.3
                launches.append({"config": config, "round": r, "status": "failed" if fail else "ok",
                                 "values": None if fail else {"tok_s": 1000 * math.exp(rng.normal(0, 0.01))}})
        eq += abv.judge(launches, ["arm"], [("tok_s", "higher")], 0.03)[0].verdict == abv.EQUIVALENT
    assert wilson_upper(eq, runs) <= ALPHA, eq / runs


def test_an_ab_arm_failing_a_fifth_of_its_launches_is_not_equivalent():
    # the literal companion of the simulation above (slow set): identical values, 4 of 20 arm launches
    # failed; main left those rounds out and called the arm EQUIVALENT
    launches = []
    for r in range(20):
        launches.append({"config": DEFAULT, "round": r, "status": "ok", "values": {"tok_s": 1000.0 + r % 3}})
        fail = r % 5 == 2
        launches.append({"config": "arm", "round": r, "status": "failed" if fail else "ok",
                         "values": None if fail else {"tok_s": 1000.0 + (r + 1) % 3}})
    (v,) = abv.judge(launches, ["arm"], [("tok_s", "higher")], 0.03)
    assert v.verdict == abv.INCONCLUSIVE and v.failed == 4 and v.default_failed == 0 and v.rounds == 20
    assert "failed launches counted as twice the worst value: 4 of arm" in v.note


# ---------------------------------------------------------------- coarse metrics (item 4)

def _ab_runs(effect: float, runs: int, seed: int, rounds: int = 20, step: float = 1.0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(runs):
        launches = []
        for r in range(rounds):
            for config, e in ((DEFAULT, 0.0), ("arm", effect)):
                v = 20 * math.exp(e + rng.normal(0, 0.02))
                launches.append({"config": config, "round": r, "status": "ok", "values": {"m": round(v / step) * step}})
        out.append(abv.judge(launches, ["arm"], [("m", "higher")], 0.03)[0])
    return out


def test_a_metric_coarser_than_a_third_of_min_effect_gets_no_verdict():
    # integers around 20: 5% steps.  main: a true +3.5% EQUIVALENT in 11.2%, a true +2% BETTER in 9.9%
    for effect, wrong in ((math.log(1.035), abv.EQUIVALENT), (math.log(1.02), abv.BETTER)):
        vs = _ab_runs(effect, 400, 14)
        k = sum(v.verdict == wrong for v in vs)
        assert wilson_upper(k, 400) <= ALPHA, (effect, k)
        assert all(v.verdict == abv.INCONCLUSIVE and "too coarse" in v.note for v in vs)
        assert vs[0].resolution == pytest.approx(0.05, rel=0.1)
    fine = _ab_runs(math.log(1.10), 5, 15, step=0.01)  # 0.05% steps: a verdict as usual
    assert all(v.verdict == abv.BETTER and v.resolution is None or v.resolution < 0.01 for v in fine)


def test_one_coarse_run_is_inconclusive_and_says_why():
    # integers around 20 (5% steps), the arm 10% higher in every round: main said BETTER
    launches = []
    for r in range(12):
        launches += [{"config": DEFAULT, "round": r, "status": "ok", "values": {"m": 20 + r % 2}},
                     {"config": "arm", "round": r, "status": "ok", "values": {"m": 22 + r % 2}}]
    (v,) = abv.judge(launches, ["arm"], [("m", "higher")], 0.03)
    assert v.verdict == abv.INCONCLUSIVE and "too coarse for a verdict" in v.note and v.resolution > 0.01


def test_resolution_is_read_from_the_values():
    assert abv.resolution([19.0, 20.0, 22.0, 21.0, 20.0, 19.0]) == pytest.approx(1 / 20)
    assert abv.resolution([1287.64, 1290.13, 1301.9, 1279.55, 1288.01, 1293.3]) is None  # finer than the values show
    assert abv.resolution([20.0] * 6) == math.inf and abv.resolution([20.0, 21.0]) is None  # too few to tell
    assert abv.resolution([130.0] * 8, [100.0] * 8) is None  # each arm constant: the gap is the effect
    assert abv.resolution([20.0, 21.0, 21.0, 20.0], [20.0] * 4) == pytest.approx(1 / 20)  # an arm shows the step
    assert abv.resolution([0.5, 1.0, 1.5, 2.5, 2.5, 0.5]) == pytest.approx(0.5 / 1.25)


def test_the_interval_with_ties_and_zeros_is_the_test_inverted():
    rng = np.random.default_rng(16)
    for _ in range(30):
        n = int(rng.integers(8, 16))
        d = np.round(rng.normal(0.01, 0.02, n) / 0.01) * 0.01  # coarse: ties and zeros
        tail = 0.01
        ci = paired.interval(d, tail)
        if ci is None:
            continue
        assert (ci[0] > 0) <= (paired.signed_rank_p(d, "greater") <= tail)
        assert (ci[1] < 0) <= (paired.signed_rank_p(d, LESS) <= tail)
        assert ci[0] <= paired.hodges_lehmann(d) <= ci[1]
    d = rng.normal(0, 0.02, 15)  # without ties: the Walsh-average formula, exactly as before
    c = paired.critical_count(15, 0.01)
    w = np.sort(paired._walsh(d))
    assert paired.interval(d, 0.01) == (w[c], w[-1 - c]) == paired._inverted(d, 0.01)


# ---------------------------------------------------------------- what a verdict claims: tails (item 7)

def test_a_config_whose_launches_show_a_tail_default_s_do_not_is_never_crowned():
    # 5% faster on 19 of 20 launches, 3x slower on one: the typical launch is faster (main certified it),
    # the mean time 5% worse
    claim = certify.Claim("x", "graph", "decode", None, LESS, "screening", 0.95)
    rng = np.random.default_rng(18)
    ys = {r: math.log(10.0) + float(rng.normal(0, 0.003)) for r in range(20)}
    xs = {r: ys[r] + math.log(0.95) + float(rng.normal(0, 0.003)) for r in range(20)}
    xs[7] = ys[7] + math.log(3.0)
    c = certify.test_claim(claim, xs, ys, thr=certify.threshold(ALPHA, 1), look=1, eligible=True, planned=20)
    assert c.p <= c.threshold and c.ratio < 0.97  # what the test alone says
    assert c.tail and not c.certified and c.mean_ratio > 1.04 and "mean time is +" in c.headline
    # a plain winner, and one whose tail default shares (two states for both), are crowned
    del xs[7], ys[7]
    assert certify.test_claim(claim, xs, ys, thr=c.threshold, look=1, eligible=True).certified
    both = {r: v + (math.log(2.0) if r % 4 == 0 else 0.0) for r, v in ys.items()}
    xboth = {r: v + (math.log(2.0) if r % 4 == 0 else 0.0) for r, v in xs.items()}
    assert certify.test_claim(claim, xboth, both, thr=c.threshold, look=1, eligible=True).certified


def test_about_n_rounds_comes_with_its_range():
    # one run's noise and effect are estimates: near the margin "about N" moved 0.5-2x between runs
    from commdiag.ab import render

    rng = np.random.default_rng(20)
    launches = []
    for r in range(10):
        for config, e in ((DEFAULT, 0.0), ("arm", math.log(1.05))):
            launches.append({"config": config, "round": r, "status": "ok",
                             "values": {"m": 1000 * math.exp(e + rng.normal(0, 0.03))}})
    (v,) = abv.judge(launches, ["arm"], [("m", "higher")], 0.03)
    assert v.verdict == abv.INCONCLUSIVE and v.rounds_range is not None
    lo, hi = v.rounds_range
    assert lo <= v.rounds_needed and (hi is None or hi >= v.rounds_needed) and (hi is None or hi > lo)
    text = render._plain(v, 0.03)
    assert f"about {v.rounds_needed} rounds (likely {lo}-" in text or f"(likely {lo} or more" in text
    assert v.to_json()["rounds_range"] == [lo, hi]


# ---------------------------------------------------------------- bugs (item 5)

def test_an_ab_arm_with_exactly_one_complete_round_is_judged_not_raised():
    launches = [{"config": DEFAULT, "round": 0, "status": "ok", "values": {"m": 10.0}},
                {"config": "arm", "round": 0, "status": "ok", "values": {"m": 11.0}},
                {"config": DEFAULT, "round": 1, "status": "ok", "values": {"m": 10.0}},
                {"config": "arm", "round": 1, "status": "failed", "error": "x"},
                {"config": DEFAULT, "round": 2, "status": "failed", "error": "x"},
                {"config": "arm", "round": 2, "status": "failed", "error": "x"}]
    (v,) = abv.judge(launches[:2], ["arm"], [("m", "lower")], 0.03)  # main: TypeError (max of int and None)
    assert v.verdict == abv.INCONCLUSIVE and v.rounds == 1 and v.noise is None and v.rounds_needed == 8
    (v,) = abv.judge(launches, ["arm"], [("m", "lower")], 0.03)  # and with failed rounds around it
    assert v.verdict == abv.INCONCLUSIVE and v.rounds == 2 and v.failed == 1


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_signed_rank_p_refuses_non_finite_rounds(bad):
    # main ranked a NaN round as the largest negative one: p = 1/512 for 8 positive rounds and a NaN
    with pytest.raises(ValueError, match="finite"):
        paired.signed_rank_p([0.1] * 8 + [bad], LESS)
    with pytest.raises(ValueError, match="finite"):
        paired.signed_rank_p(np.array([[0.1] * 9, [0.1] * 8 + [bad]]), TWO_SIDED)


# ---------------------------------------------------------------- seeds (item 8)

def test_every_single_node_run_draws_a_fresh_seed_and_records_it(tmp_path):
    from commdiag.formats.spec import load_spec

    spec = load_spec(write_spec(tmp_path / "s.yaml"))
    runs = [sweep.new_run(spec, tmp_path / f"r{i}", 2) for i in range(3)]
    assert len({r["seed"] for r in runs}) == 3 and {r["seed_source"] for r in runs} == {"drawn"}
    fixed = load_spec(write_spec(tmp_path / "f.yaml", seed=42))
    assert sweep.new_run(fixed, tmp_path / "f", 2)["seed"] == 42
    assert sweep.new_run(fixed, tmp_path / "f", 2)["seed_source"] == "spec"


def test_a_multi_node_run_without_a_seed_is_refused_before_any_launch(tmp_path):
    # main derived the seed from the spec: every rerun repeated the same launch order (300 of 300)
    path = write_spec(tmp_path / "m.yaml", nnodes=2, rdzv_endpoint="127.0.0.1:29400", launch="torchrun")
    out = tmp_path / "run"
    proc = run_cli("sweep", path, "--out", out)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    said = one_message(proc.stderr)
    assert f"{path}: seed: required when nnodes > 1" in said and "--set seed=" in said
    assert not out.exists()
