"""Racing (#31): screening stops launching configs that clearly lose, and says so; it never drops a winner
in more than 1% of simulated runs (the fast form of benchmarks/racing_simulation.py)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from commdiag.analyse import racing, screening, verdict
from commdiag.analyse.stats import DEFAULT, LaunchValue
from commdiag.formats import results
from commdiag.formats.spec import load_spec
from commdiag.measure import sweep

ROOT = Path(__file__).resolve().parents[1]
BANDS = {"decode": [1, 64], "prefill": [256, None]}
TOKENS = {1024: 1, 16384: 16, 262144: 256, 1048576: 1024}


def _values(effects: dict[str, tuple[float, float]], launches: int, noise=(0.0, 0.02, -0.02, 0.01)):
    """Launch values: config -> (decode factor, prefill factor), ``launches`` launches each."""
    out, index = [], 0
    for k in range(launches):
        for c, (dec, pre) in effects.items():
            for size, tok in TOKENS.items():
                f = dec if tok <= 64 else pre
                out.append(LaunchValue(c, index, size, "eager", math.log(10 * f) + noise[(index + k) % 4], 1))
            index += 1
    return out


def _screen(values, configs):
    return screening.screen(values, configs=configs, modes=["eager"], tokens_by_size=TOKENS, bands=BANDS)


EFFECTS = {DEFAULT: (1, 1), "aa1": (1, 1), "aa2": (1, 1), "aa3": (1, 1), "loser": (3, 3),
           "ll-like": (0.9, 3), "named-loser": (3, 3), "slightly-slower": (1.15, 1.15)}


def test_after_one_trial_the_spread_between_configs_keeps_a_3x_loser():
    """One launch each: the noise is the spread between configs (real effects included), so a 3x loser
    among a few others is not "far more than the noise" yet."""
    assert racing.decide(_screen(_values(EFFECTS, 1), list(EFFECTS)), after_trial=1) == []


@pytest.mark.parametrize("launches", [2, 3])
def test_only_configs_slower_in_every_band_are_dropped_and_named_configs_never(launches):
    configs = list(EFFECTS)
    drops = racing.decide(_screen(_values(EFFECTS, launches), configs), after_trial=launches,
                          protected=("named-loser",))
    assert [d.config for d in drops] == ["loser"]
    assert "every band and mode" in drops[0].reason and f"trial {launches}" in drops[0].reason
    assert drops[0].margin > racing.Z
    # already dropped: not again
    assert racing.decide(_screen(_values(EFFECTS, launches), configs), after_trial=launches,
                         protected=("named-loser",), already={"loser"}) == []


def test_noisy_launches_keep_a_loser_running():
    """Two launch states 3x apart (gloo on busy cores): a 3x loss is within the noise, so nothing is dropped."""
    effects = {DEFAULT: (1, 1), "aa1": (1, 1), "aa2": (1, 1), "aa3": (1, 1), "aa4": (1, 1), "loser": (3, 3)}
    noisy = (0.0, math.log(3), 0.0, math.log(3))
    assert racing.decide(_screen(_values(effects, 2, noisy), list(effects)), after_trial=2) == []


def _simulation():
    spec = importlib.util.spec_from_file_location("racing_simulation", ROOT / "benchmarks" / "racing_simulation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("model", ["two-state-gpu-eager", "linear-position5%"])
def test_simulated_pcie8_runs_never_drop_the_winner(model):
    """The fast form: 4 seeded pcie8-shaped runs of the two hardest models through screen + racing.decide
    (the full form is benchmarks/racing_simulation.py, every model: at most 1% of runs may drop the
    winner; numbers in benchmarks/README.md)."""
    r = _simulation().simulate(model, runs=4, seed0=1000)
    assert r["winner_dropped"] == 0


def test_simulated_quiet_runs_drop_the_losers():
    r = _simulation().simulate("lognormal3", runs=2, seed0=7)
    assert r["winner_dropped"] == 0 and r["aa_dropped"] == 0
    assert r["loser_drop_rate"] == 1.0 and r["launch_share"] < 0.92  # the losers' third trial


def _fake_launch(run_dir: Path, launch: dict, factor: float) -> None:
    """What a worker leaves: result.json with every rank's samples (a loser's `factor` times slower)."""
    folder = results.launch_dir(run_dir, launch["index"])
    folder.mkdir(parents=True)
    jitter = 1 + 0.02 * (launch["index"] % 4)  # launches differ a little, as real ones do
    samples = {str(s): [10.0 * factor * jitter * (1 + 0.01 * (i % 3)) for i in range(20)] for s in TOKENS}
    ranks = [{"rank": r, "samples": {"torch": {"eager": samples}}, "wrong": {"torch": {s: 0 for s in samples}},
              "enqueue_us": {"torch": {}},
              "measure_s": 0.1} for r in range(2)]
    (folder / "result.json").write_text(json.dumps({"version": 2, "ranks": ranks}))
    launch.update(status=results.OK, wall_s=1.0, measure_s=0.1, wrong=0)


def test_the_sweep_drops_a_losers_remaining_launches_and_records_why(tmp_path):
    """The sweep's hook on a real run folder: after trial 2 completes, the loser's trial-3 launch is
    ``dropped`` with the reason, run.json records the look, it loads back (format 7), and the
    verdicts (CLI and report) say what was dropped; a trial still open drops nothing."""
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text("name: race\nbackend: gloo\nnproc_per_node: 2\ndtype: float32\n"
                         "sizes: {hidden: 256, tokens: [1, 16, 256, 1024]}\ntrials: 3\n"
                         "configs: {aa1: {A: '1'}, aa2: {A: '2'}, aa3: {A: '3'}, aa4: {A: '4'}, loser: {A: '5'}}\n")
    spec = load_spec(spec_file)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run = sweep.new_run(spec, run_dir, 2)
    assert run["version"] == 7 and run["racing"] == {"enabled": True, "looks": []}
    first2 = [l for l in run["launches"] if l["trial"] < 2]
    for l in first2[:-1]:
        _fake_launch(run_dir, l, 3.0 if l["config"] == "loser" else 1.0)
        assert sweep.race(spec, run, run_dir) == []  # trial 2 is not complete yet; one trial keeps all
    assert [lk["after_trial"] for lk in run["racing"]["looks"]] == [1]
    _fake_launch(run_dir, first2[-1], 3.0 if first2[-1]["config"] == "loser" else 1.0)
    drops = sweep.race(spec, run, run_dir)
    assert [d["config"] for d in drops] == ["loser"]
    dropped = [l for l in run["launches"] if l["status"] == results.DROPPED]
    assert {(l["config"], l["trial"]) for l in dropped} == {("loser", 2)}
    assert all("every band and mode" in l["dropped"] for l in dropped)
    assert sweep.race(spec, run, run_dir) == []  # one look per trial
    assert [lk["after_trial"] for lk in run["racing"]["looks"]] == [1, 2]
    results.save_run(run_dir, run)
    back = results.load_run_json(run_dir)
    assert sum(l["status"] == results.DROPPED for l in back["launches"]) == 1
    notes = racing.notes(back)
    assert notes[0].startswith("racing: 1 config(s) no longer launched in screening, 1 launch(es) saved")
    v = verdict.evaluate([], back, {})
    assert any(n.startswith("racing:") for n in v.notes)
    assert sweep.SweepResult(run_dir, "complete", {"ok": 17, "dropped": 1}).all_ok


def test_racing_false_and_old_runs_run_every_launch(tmp_path):
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text("name: norace\nbackend: gloo\nracing: false\nsizes: {hidden: 8, tokens: [1]}\n"
                         "configs: {b: {A: '1'}}\n")
    spec = load_spec(spec_file)
    assert spec.racing is False
    run = sweep.new_run(spec, tmp_path, 2)
    assert sweep.race(spec, run, tmp_path) == [] and run["racing"]["enabled"] is False
    old = spec.to_json()
    old.pop("racing")
    assert type(spec).from_json(old).racing is False  # a format-6 run keeps its full plan
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nbackend: gloo\nracing: 3\nsizes: {hidden: 8, tokens: [1]}\n")
    with pytest.raises(Exception, match="racing"):
        load_spec(bad)


def test_certify_sizes_runs_every_screening_launch(tmp_path, monkeypatch):
    """--certify-sizes tests its per-size claims on stage 1 itself: racing is off for it."""
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text("name: sizes\nbackend: gloo\nsizes: {hidden: 8, tokens: [1, 256]}\nconfigs: {b: {A: '1'}}\n")
    seen = {}

    class Seen(Exception):
        pass

    def stop(spec, folder, *a, **k):
        seen["run"] = folder.run
        raise Seen

    monkeypatch.setattr(sweep, "_run_stages", stop)
    with pytest.raises(Seen):
        sweep.run_sweep(load_spec(spec_file), run_dir=tmp_path / "run", certify_sizes=True)
    assert seen["run"]["racing"]["enabled"] is False and "certify-sizes" in seen["run"]["racing"]["note"]
