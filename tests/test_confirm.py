"""Stage 2 end to end on CPU: real torchrun/gloo A/A sweeps through screening and confirmation, the
confirm command, resume across stages, the spec's confirm key and --certify-sizes' plan."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from commdiag.analyse import certify, screening, stats, verdict
from commdiag.formats import results
from commdiag.measure import stages, sweep
from commdiag.errors import CommdiagError, SpecError
from commdiag.formats.spec import load_spec
from conftest import REPO, assert_fits, one_message, run_cli, words, write_spec

CPU_AA = REPO / "sweeps" / "cpu-aa.yaml"
# The shipped A/A spec at its smallest: one size per band (two claims, so stage 2 still needs 9 rounds), few
# iterations, 2 screening trials, and reuse_process (default and its twin differ in no variable, so each round
# shares one torchrun process): 2 + 9 processes instead of 6 + 18 launches, every stage still real.
SMALL = ("--set", "iters=10", "--set", "warmup=2", "--set", "sizes={hidden: 1024, tokens: [1, 256]}",
         "--set", "trials=2", "--set", "reuse_process=true")


def test_real_cpu_aa_through_both_stages_certifies_nothing_and_resumes_across_stages(tmp_path):
    out = tmp_path / "aa"
    # stage 1 only
    proc = run_cli("sweep", CPU_AA, "--out", out, *SMALL, "--no-confirm", "--json")
    assert " ".join(proc.stderr.split()).startswith(f"run folder {out}: 4 launches to run (4 screening: 2 configs "
                                                    "x 2 trials")  # wrapped at 100 columns
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_fits(proc, stdout=False)  # the progress lines
    data = json.loads(proc.stdout)
    assert data["verdicts"]["status"] == verdict.SCREENING_ONLY and "--no-confirm" in data["verdicts"]["status_note"]
    assert data["profiles"] == [] and not list(out.glob("profile*.env"))
    assert f"commdiag confirm {out}" in data["verdicts"]["status_note"]  # the real path, not a placeholder
    run = results.load_run_json(out)
    assert run["version"] == results.RUN_FORMAT_VERSION and {l["stage"] for l in run["launches"]} == {1}
    # stage 2 later: the plan is printed first, then 12 rounds of default + aa (confirm.configs: [aa]; two
    # two-sided claims, each at the first look's p <= 0.0025: the paired test's smallest p is 2/2^10 =
    # 0.002 at 10 rounds, plus 2 spare)
    proc = run_cli("confirm", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_fits(proc)  # the stage-2 plan, the progress lines, the table and the verdicts
    assert "stage 2 (confirmation, look 1): 12 fresh rounds x 2 configs = 24 launches" in words(proc.stderr)
    assert "why 12 rounds: the paired within-round test's smallest p with k rounds is 2/2^k" in words(proc.stderr)
    assert proc.stderr.index("stage 2 (confirmation") < proc.stderr.index("stage 2 round 1")
    assert max(len(l) for l in proc.stderr.splitlines() + proc.stdout.splitlines()) <= 100
    run = results.load_run_json(out)
    stage2 = [l for l in run["launches"] if l["stage"] == 2]
    assert len(stage2) == 24 and {l["status"] for l in stage2} == {"ok"}
    assert sorted(l["round"] for l in stage2) == sorted(list(range(12)) * 2)
    assert len({l["process"] for l in stage2}) == 12  # reuse_process: one process per round
    assert run["confirmation"]["family_size"] == 2 and run["confirmation"]["test"] == certify.PAIRED_TEST
    assert "confirmation (stage 2): confirmed: 0 of 2 claims certified" in words(proc.stdout)
    assert "aa vs default, decode band (eager): not certified, keep NCCL defaults" in words(proc.stdout)
    assert "paired signed-rank test over 12 rounds" in words(proc.stdout) and not re.search(r": certified \d", proc.stdout)
    assert "A/A check: PASS: aa (identical to default)" in words(proc.stdout)
    assert not list(out.glob("profile*.env"))
    # an interruption in stage 2 leaves pending launches: --resume finishes exactly those
    kept = {l["index"]: l["started_utc"] for l in stage2[:-2]}
    for l in stage2[-2:]:
        for k in list(l):
            if k not in sweep.LAUNCH_KEYS:
                l.pop(k)
        l["status"] = "pending"
    (out / "run.json").write_text(json.dumps(run))
    assert verdict.evaluate_run(results.load_run(out)).status == verdict.PENDING
    proc = run_cli("sweep", "--resume", out, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = [l for l in results.load_run_json(out)["launches"] if l["stage"] == 2]
    assert {l["status"] for l in again} == {"ok"} and len(again) == 24
    assert {l["index"]: l["started_utc"] for l in again[:-2]} == kept  # finished launches were not redone
    v = json.loads(proc.stdout)["verdicts"]
    assert v["status"] == verdict.CONFIRMED and not [c for c in v["certifications"] if c["certified"]]
    # confirmed already: extending needs --rounds (a second look)
    proc = run_cli("confirm", out)
    assert proc.returncode == 2 and "already confirmed" in one_message(proc.stderr) and "Traceback" not in proc.stderr


def test_stage_2_measures_only_what_its_claims_test(tmp_path):
    spec = load_spec(write_spec(tmp_path / "s.yaml", sizes={"hidden": 256, "tokens": [1, 128, 256]},
                                configs={"x": {}}, confirm={"configs": ["x"]}))
    claims = [certify.Claim("x", "eager", "decode", None, stats.TWO_SIDED, "confirm.configs", 1.0)]
    measure = stages.stage2_measure(spec, claims, {"decode": [1024], "prefill": [256 * 1024]})
    # only the claims' series, but every band's sizes: a winner's ratio in the other bands decides profile.env
    # (128 tokens lies in no band: not measured)
    assert measure == {"modes": ["eager"], "vias": ["torch"], "sizes": [1024, 256 * 1024]}


@pytest.mark.parametrize("confirm, field, words", [
    ({"configs": ["nope"]}, "confirm.configs[0]", "not a config"),
    ({"configs": ["default"]}, "confirm.configs[0]", "reference"),
    ({"configs": "x"}, "confirm.configs", "list"),
    ({"rounds": 2}, "confirm.rounds", "3..200"),
    ({"when": 1}, "confirm.when", "configs, rounds"),
])
def test_confirm_key_errors_name_the_field(tmp_path, confirm, field, words):
    path = write_spec(tmp_path / "bad.yaml", configs={"x": {}}, confirm=confirm)
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert e.value.field == field and words in str(e.value) and str(path) in str(e.value)


def test_confirm_key_resolves_and_survives_run_json(tmp_path):
    spec = load_spec(write_spec(tmp_path / "s.yaml", configs={"x": {}}, confirm={"configs": ["x"], "rounds": 8}))
    assert spec.confirm_configs == ("x",) and spec.confirm_rounds == 8
    from commdiag.formats.spec import Spec

    again = Spec.from_json(json.loads(json.dumps(spec.to_json())))
    assert again.confirm_configs == ("x",) and again.confirm_rounds == 8


def test_certify_sizes_prints_its_cost_and_raises_trials(tmp_path):
    spec = load_spec(REPO / "sweeps" / "pcie8.yaml")
    raised, plan = stages.certify_sizes_plan(spec)
    m, k = certify.size_claims_needed(26, 15, stats.ALPHA / 2)  # the run's 1% is split with stage 2
    # 26 configs besides default, 15 sizes; paired by trial, two-sided: 2/2^18 <= 0.005/390 < 2/2^17
    assert m == 390 and k == 18 and raised.trials == k + certify.SIZES_SPARE_TRIALS == 20
    assert plan.launches == 27 * 20 and "paired by trial: 20 trials" in " ".join(plan.lines)
    assert "min" in plan.lines[0]


def test_certify_sizes_tests_every_cell_at_once_paired_by_trial():
    sizes = {4096: 1, 65536: 16}
    trials = certify.size_claims_needed(2, len(sizes), stats.ALPHA / 2)[1]
    assert trials == 11  # 4 claims at 0.005 / 4: 2/2^11 reaches it, 2/2^10 does not
    values, trial_of = [], {}
    for t in range(trials):
        for c, factor in (("default", 1.0), ("slow", 1.5), ("aa", 1.0)):
            launch = 100 * t + len(c)
            trial_of[launch] = t
            for s in sizes:
                values.append(stats.LaunchValue(c, launch, s, "graph",
                                                float(stats.math.log(10 * factor * (1 + 0.01 * ((t * 7 + len(c)) % 5)))),
                                                1))
    scr = screening.screen(values, configs=["default", "slow", "aa"], modes=["graph"], tokens_by_size=sizes,
                           bands={"decode": [1, 64]})
    out = certify.certify_sizes(scr, values, trial_of, trials=trials)
    assert len(out) == 4 and all(c.threshold == pytest.approx(0.005 / 4) for c in out)  # half the run's 1%
    assert {(c.claim.config, c.result) for c in out} == {("slow", "slower"), ("aa", "not certified")}
    slow = next(c for c in out if c.claim.config == "slow")
    assert slow.test == certify.PAIRED and slow.rounds == trials and f"over {trials} trials" in slow.text
    # one trial's default launch lost: that trial is left out and said, and 10 trials cannot reach 0.00125
    lost = [v for v in values if not (v.config == "default" and trial_of[v.launch] == 0)]
    out = certify.certify_sizes(scr, lost, trial_of, trials=trials)
    slow = next(c for c in out if c.claim.config == "slow")
    assert not slow.certified and slow.dropped == 1 and "1 incomplete trial left out" in slow.text
    assert "too few complete trials left to reach p <= 0.0013" in slow.text


def test_old_run_folders_load_as_screening_only_and_confirm_refuses_unfinished_screening(tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(Path(__file__).parent / "fixtures" / "runs" / "cpu-aa-b", run_dir)
    run = json.loads((run_dir / "run.json").read_text())
    run["launches"][0]["status"] = "pending"
    (run_dir / "run.json").write_text(json.dumps(run))
    proc = run_cli("confirm", run_dir)
    assert proc.returncode == 2 and "stage 1 (screening) is unfinished" in one_message(proc.stderr)


def test_a_plan_too_short_to_certify_says_so_and_launches_nothing():
    claims = [certify.Claim("x", "graph", b, None, stats.TWO_SIDED, "confirm.configs", 1.0) for b in ("a", "b")]
    plan = certify.confirmation_plan(claims, 6, 9, "t")  # confirm.rounds: 6 (or confirm --rounds 6)
    assert plan["configs"] == [] and plan["looks"][0]["rounds"] == 0
    text = stages.confirm_plan_text({"launches": []}, plan, 0)
    joined = " ".join(l.strip() for l in text.lines)
    assert text.launches == 0 and "not certifiable with this plan" in text.lines[0] and "nothing is launched" in joined
    assert "10 rounds can" in joined and max(len(l) for l in text.lines) <= 100
    # mixed sidedness, 9 rounds at 0.0025 (the first look's alpha/2 over 2 claims): the one-sided claim is
    # reachable (2^-9), the two-sided one is not (2/2^9): only the first one's config is launched
    mixed = [certify.Claim("fast", "graph", "a", None, stats.LESS, "screening", 0.9),
             certify.Claim("seed", "graph", "b", None, stats.TWO_SIDED, "confirm.configs", 1.2)]
    plan = certify.confirmation_plan(mixed, 9, 9, "t")
    assert plan["configs"] == ["default", "fast"] and plan["looks"][0]["rounds"] == 9
    text = stages.confirm_plan_text({"launches": []}, plan, 9)
    assert text.launches == 18 and any("not certifiable with this plan: seed" in l for l in text.lines)


def test_a_fixed_confirm_rounds_that_cannot_certify_is_refused_before_any_launch(tmp_path):
    path = write_spec(tmp_path / "s.yaml", sizes={"hidden": 256, "tokens": [1, 256]}, configs={"x": {}},
                      confirm={"configs": ["x"], "rounds": 6})
    out = tmp_path / "run"
    proc = run_cli("sweep", path, "--out", out)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    said = one_message(proc.stderr)
    assert f"{path}: confirm.rounds: not certifiable with this plan" in said
    assert "set confirm.rounds: 10 (or auto)" in said and not out.exists()
    # without stage 2 the same spec runs (screening only): nothing to refuse
    spec = load_spec(path)
    stages.check_confirm_rounds(dataclasses.replace(spec, confirm_rounds=10), False)


def test_a_further_look_that_cannot_reach_its_threshold_is_refused():
    claims = [certify.Claim("x", "graph", b, None, stats.TWO_SIDED, "confirm.configs", 1.0) for b in ("a", "b")]
    plan = certify.confirmation_plan(claims, None, 9, "t")  # 12 rounds at 0.0025: this look could certify
    assert certify.next_threshold(plan) == pytest.approx(0.00125)
    stages.check_further_look(Path("r"), plan, 1)  # 13 rounds reach the next look's threshold: 2/2^11
    # a plan that launched nothing (too few rounds) spent nothing: its next look keeps 0.0025
    short = certify.confirmation_plan(claims, 6, 9, "t")
    assert certify.next_threshold(short) == pytest.approx(0.0025)
    with pytest.raises(CommdiagError, match="not certifiable with this plan .* give --rounds 10"):
        stages.check_further_look(Path("r"), short, None)
    with pytest.raises(CommdiagError, match=r"--rounds 3: with 3 rounds in all .* p <= 0.0025 .* --rounds 10 can"):
        stages.check_further_look(Path("r"), short, 3)
    stages.check_further_look(Path("r"), short, 10)
    # a run confirmed before looks spent alpha/2 (confirmation version 2: its first look at alpha/M) has
    # nothing left: a further look is refused
    old = certify.confirmation_plan(claims, None, 9, "t")
    old["looks"][0]["threshold"] = 0.005
    with pytest.raises(CommdiagError, match="spent the whole 1%"):
        stages.check_further_look(Path("r"), old, 4)


def test_band_text_and_gloo_note():
    assert screening.band_text([1, 64]) == "1-64 tokens" and screening.band_text([256, None]) == "256+ tokens"
    run = {"spec": {"backend": "gloo", "sizes": [], "bands": {}}, "configs": [
        {"name": "default", "env": {}}, {"name": "ll", "env": {"NCCL_PROTO": "LL"}}], "launches": []}
    v = verdict.evaluate([], run, {})
    assert any("gloo never loads NCCL" in n for n in v.notes)
    assert any(n.startswith("A/A check (ll identical to default under gloo") for n in v.notes)  # a twin


def test_extending_an_unfinished_confirmation_is_refused_and_a_further_look_states_its_cost(tmp_path):
    claims = [certify.Claim("x", "graph", b, None, stats.LESS, "screening", 0.9) for b in ("a", "b")]
    plan = certify.confirmation_plan(claims, None, 9, "t")
    certify.add_look(plan, 6, "t2")
    text = stages.confirm_plan_text({"launches": []}, plan, 6)
    assert "the looks have spent 0.75% of the run's 1%" in " ".join(text.lines)


def test_a_run_folder_without_its_launch_folders_is_not_extended(tmp_path):
    # an archived or committed run keeps run.json and samples.csv only; confirm rebuilds samples.csv from
    # launches/NNNN/result.json, so extending it would silently drop every earlier launch
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(Path(__file__).parent / "fixtures" / "runs" / "cpu-aa-b", run_dir)
    run = json.loads((run_dir / "run.json").read_text())
    claims = [certify.Claim("aa", "eager", b, None, stats.TWO_SIDED, "confirm.configs", 1.0) for b in ("a", "b")]
    run["confirmation"] = certify.confirmation_plan(claims, None, len(run["launches"]), "t")
    (run_dir / "run.json").write_text(json.dumps(run))
    proc = run_cli("confirm", run_dir, "--rounds", "3")
    assert proc.returncode == 2 and "cannot be extended without losing their samples" in one_message(proc.stderr)
    assert json.loads((run_dir / "run.json").read_text()) == run  # nothing written


def test_the_start_banner_warns_when_confirm_rounds_may_be_too_few(tmp_path):
    # confirm.rounds: 10 reaches seed's 2 two-sided claims at the first look (2/2^10 <= 0.0025), not a family
    # of 4 (a screening candidate in each band as well: 0.00125)
    spec = load_spec(write_spec(tmp_path / "s.yaml", sizes={"hidden": 256, "tokens": [1, 256]},
                                configs={"seed": {}, "y": {}}, confirm={"configs": ["seed"], "rounds": 10}))
    assert stages.spec_families(spec) == (2, 4, stats.TWO_SIDED)
    stages.check_confirm_rounds(spec, False)  # the fewest claims are reachable: no refusal
    run = {"launches": [{"index": 0, "config": "default", "stage": 1, "status": "pending"}],
           "configs": [{"name": n} for n in ("default", "seed", "y")], "confirm_requested": True}
    lines = stages.start_banner(spec, run, tmp_path / "r").lines
    assert len(lines) > 1 and "confirm.rounds: 10 is too few if screening adds every claim it can (4)" in " ".join(
        l.strip() for l in lines) and max(len(l) for l in lines) <= 100
