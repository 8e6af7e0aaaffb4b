"""commdiag step: the model: block's validation, the comm-share arithmetic, and a real torchrun/gloo step run
through screening and confirmation on CPU (small shapes)."""

from __future__ import annotations

import json
import math

import pytest

from commdiag.analyse import stats, steptable, verdict
from commdiag.errors import SpecError
from commdiag.formats import results
from commdiag.formats.spec import load_spec
from commdiag.formats.stepspec import StepModel
from conftest import REPO, assert_fits, run_cli, write_spec

CPU_STEP = REPO / "sweeps" / "cpu-step.yaml"
TINY = ("--set", "iters=8", "--set", "warmup=1", "--set", "model.layers=2", "--set", "sizes.tokens=[1, 64]",
        "--set", "trials=1")

MOE = {"kind": "moe", "hidden": 64, "heads": 4, "kv_heads": 2, "layers": 2, "experts": 8, "top_k": 2,
       "expert_intermediate": 32}


def _spec(tmp_path, model, **top):
    top = {"name": "s", "model": model, "sizes": {"tokens": [1, 3]}, **top}
    return write_spec(tmp_path / "spec.yaml", **top)


def test_shipped_step_specs_load_with_their_tp_degree():
    for name, tp, kind in (("step-moe-tp2", 2, "moe"), ("step-moe-tp8", 8, "moe"),
                           ("step-dense70b-tp2", 2, "dense"), ("step-dense70b-tp8", 8, "dense"), ("cpu-step", 2, "dense")):
        spec = load_spec(REPO / "sweeps" / f"{name}.yaml")
        assert spec.nproc_per_node == tp and spec.model["kind"] == kind
        assert spec.vias == ("step", "step-compute", "step-comm")
        # the all-reduce of a step is tokens x hidden x dtype bytes per rank
        elem = 2 if spec.dtype == "bfloat16" else 4
        assert [s.bytes for s in spec.sizes] == [s.tokens * spec.model["hidden"] * elem for s in spec.sizes]
    m = StepModel(**load_spec(REPO / "sweeps" / "step-moe-tp2.yaml").model)
    assert m.active_experts(1) == 8 and m.active_experts(3) == 24 and m.active_experts(256) == 256
    assert m.distinct_layers(2, 2, 3) == 6  # 1.36 GB a layer within 8 GiB


@pytest.mark.parametrize("model, sets, field, words", [
    ({**MOE, "kind": "sparse"}, {}, "model.kind", "is not one of dense, moe"),
    ({k: v for k, v in MOE.items() if k != "top_k"}, {}, "model.top_k", "required for kind: moe"),
    ({**MOE, "heads": 3, "kv_heads": 3, "head_dim": 16}, {}, "model.heads", "do not split over TP=2"),
    ({**MOE, "kv_heads": 3}, {}, "model.kv_heads", "must divide heads"),
    ({**MOE, "top_k": 9}, {}, "model.top_k", "must be an integer 1..8"),
    ({**MOE, "expert_intermediate": 33}, {}, "model.expert_intermediate", "does not split over TP=2"),
    ({**MOE, "wat": 1}, {}, "model.wat", "unknown key"),
    ({**MOE, "weight_pool_gib": 0}, {}, "model.weight_pool_gib", "must be a number of GiB"),
    ({"kind": "dense", "hidden": 64, "heads": 4, "layers": 1, "intermediate": 64, "shared_experts": 1}, {},
     "model.shared_experts", "only for kind: moe"),
    (MOE, {"sizes": {"tokens": [1], "bytes": [1024]}}, "sizes.bytes", "not with model"),
    (MOE, {"sizes": {"tokens": [1], "hidden": 32}}, "sizes.hidden", "differs from model.hidden"),
    (MOE, {"sizes": {"hidden": 64}}, "sizes.tokens", "required with model"),
    (MOE, {"vias": ["step-comm"]}, "vias", "must include step"),
    (MOE, {"vias": ["step", "torch"]}, "vias[1]", "is not a series of commdiag step"),
    (MOE, {"reuse_process": True}, "reuse_process", "not with model"),
])
def test_bad_model_blocks_are_one_error_naming_the_field(tmp_path, model, sets, field, words):
    with pytest.raises(SpecError) as e:
        load_spec(_spec(tmp_path, model, **sets))
    assert e.value.field == field and words in str(e.value), str(e.value)


def test_sweep_and_step_refuse_each_others_specs(tmp_path):
    proc = run_cli("sweep", CPU_STEP)
    assert proc.returncode == 2 and "this is a step spec" in proc.stderr and "commdiag step" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_cli("step", REPO / "sweeps" / "cpu-smoke.yaml")
    assert proc.returncode == 2 and "model: missing" in proc.stderr and "Traceback" not in proc.stderr


def test_comm_share_is_one_minus_compute_over_step_per_launch():
    run = {"spec": {"sizes": [{"bytes": 100, "tokens": 1}], "modes": ["graph"]},
           "configs": [{"name": "default"}, {"name": "seed"}]}
    vals = []
    for launch, (full, comp, comm) in enumerate([(100.0, 80.0, 30.0), (110.0, 77.0, 33.0), (90.0, 81.0, 18.0)]):
        for mode, t in (("graph", full), ("graph-compute", comp), ("graph-comm", comm)):
            vals.append(stats.LaunchValue("default", launch, 100, mode, math.log(t), 1))
    vals.append(stats.LaunchValue("seed", 9, 100, "graph", math.log(50.0), 2))  # stage 2: the step alone
    rows = steptable.step_rows(vals, run)
    d = next(r for r in rows if r.config == "default")
    # times: the gmean over launches (what every table shows); shares: the median of the per-launch shares
    assert d.step_us.value == pytest.approx((100.0 * 110.0 * 90.0) ** (1 / 3)) and d.step_us.stat == "gmean"
    assert (d.step_us.lo, d.step_us.hi) == pytest.approx((90.0, 110.0))
    assert d.comm_share.launches == 3
    assert sorted([d.comm_share.lo, d.comm_share.value, d.comm_share.hi]) == pytest.approx([0.1, 0.2, 0.3])
    assert d.comm_share.stat == "median"
    assert d.comm_alone.value == pytest.approx(0.3) and d.tokens_per_s == pytest.approx(1 / (d.step_us.value * 1e-6))
    s = next(r for r in rows if r.config == "seed")
    assert s.comm_share is None and s.step_us.launches == 1
    text = steptable.render(rows)
    assert "comm share 20.0% [10.0% to 30.0%]" in text and "n=3" in text
    # the all-reduces alone (30%) against the share (20%): its meaning beside it, within 100 columns
    assert "all-reduces alone 30.0% of the step: more than they add: compute hides part of them" in text
    assert max(len(l) for l in text.splitlines()) <= 100
    assert steptable.to_json(rows)["format"] == "commdiag-step-table"


def test_real_cpu_step_measures_comm_share_and_confirms_on_the_step_alone(tmp_path):
    out = tmp_path / "step"
    proc = run_cli("step", CPU_STEP, "--out", out, *TINY, "--no-confirm", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_fits(proc, stdout=False)
    data = json.loads(proc.stdout)
    assert data["step"]["format"] == "commdiag-step-table" and data["step"]["version"] == 2
    rows = data["step"]["rows"]
    assert {(r["config"], r["tokens"]) for r in rows} == {(c, t) for c in ("default", "seed") for t in (1, 64)}
    for r in rows:
        assert r["mode"] == "eager" and r["step_us"]["launches"] == 1
        assert r["comm_share"]["value"] < 1.0
        assert r["comm_us"]["value"] > 0 and r["step_us"]["stat"] == "gmean" and r["comm_share"]["stat"] == "median"
    # the step includes the all-reduces, so removing them leaves less time; gloo on CPU is slow (ms), so
    # the share is clearly above zero: in the typical row (one launch of 8 samples each: a slice of one
    # row's compute-only samples landed in a busy moment of the 2 cores once, share -12%, CI 2026-12-06)
    shares = sorted(r["comm_share"]["value"] for r in rows)
    assert shares[len(shares) // 2] > 0.0, shares
    assert sum(r["compute_us"]["value"] < r["step_us"]["value"] for r in rows) >= len(rows) // 2 + 1, rows
    summary = {(s["config"], s["tokens"], s["mode"]) for s in data["summary"]}
    assert ("default", 1, "eager-compute") in summary and ("seed", 64, "eager-comm") in summary
    run = results.load_run_json(out)
    assert run["spec"]["model"]["layers"] == 2 and "step" in run["method"]
    # stage 2 is planned by the same path as sweep's: only the full step, and a plan too short to certify
    # launches nothing (one two-sided claim, decode band: the first look needs 9 rounds, 2/2^9 <= 0.005)
    proc = run_cli("confirm", out, "--rounds", "3", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = " ".join(proc.stderr.split())
    assert "not certifiable with this plan: 3 rounds cannot reach p <= 0.005" in said and "9 rounds can" in said
    assert_fits(proc, stdout=False)  # the stage-2 plan and progress lines
    run = results.load_run_json(out)
    assert run["confirmation"]["measure"]["vias"] == ["step"]
    assert run["confirmation"]["measure"]["modes"] == ["eager"]
    assert run["confirmation"]["rounds_needed"] == 11 and run["confirmation"]["looks"][0]["rounds"] == 0
    assert not [l for l in run["launches"] if l["stage"] == 2]
    data = verdict.evaluate_run(results.load_run(out))
    assert data.status == verdict.NOT_CERTIFIABLE and "--rounds 9" in data.status_note
    assert all(not c.certified for c in data.certifications)
    proc = run_cli("report", out)
    assert proc.returncode == 0 and "comm share" in proc.stdout and "not certifiable with this plan" in proc.stdout
    assert_fits(proc)  # the step table and the stage-2 verdicts, 100 columns
