"""Every line commdiag prints fits 100 columns: the shipped CPU smoke spec run for real, and report,
explain and compare over every recorded run folder (GPU recordings in benchmarks/, CPU ones in
tests/fixtures/runs/), stdout and stderr.  cpu-aa and cpu-step are checked where test_confirm.py and
test_step.py already run them.  A single word longer than a line (a path) may stand alone on its line.
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from commdiag.cli import main
from conftest import REPO, assert_fits, run_cli, words

RUNS = sorted(p.parent for base in (REPO / "benchmarks", REPO / "tests" / "fixtures" / "runs")
              for p in base.rglob("run.json"))
WIDTH = 100


def _long(text: str) -> list[str]:
    return [l for l in text.splitlines() if len(l) > WIDTH and " " in l.strip()]


def _invoke(*args) -> tuple[int, str, str]:
    """The CLI in this process (click's runner): the same code as the command line, without paying
    for a fresh interpreter per call over twenty run folders."""
    r = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def test_the_recordings_are_all_here():
    names = {str(p.relative_to(REPO)) for p in RUNS}
    assert len(RUNS) >= 20 and "benchmarks/h200x2-2026-11-30/nvlink2-aa" in names
    assert {"tests/fixtures/runs/cpu-aa-a", "tests/fixtures/runs/cpu-faults"} <= names


@pytest.mark.parametrize("run", RUNS, ids=lambda p: str(p.relative_to(REPO)))
def test_report_and_explain_of_every_recorded_run_fit_100_columns(run, tmp_path):
    code, out, err = _invoke("report", run, "--out", tmp_path / "r.html")
    assert code in (0, 2), err  # 2: an archived folder without its samples, said in one message
    assert not _long(out) and not _long(err), _long(out) + _long(err)
    if code == 2:
        assert err.startswith("commdiag: error: ") and "no measured data" in " ".join(err.split())
        return
    assert out.count("\nreport: ") == 1
    code, out, err = _invoke("explain", "--no-run", run)
    assert code in (0, 2) and not _long(out) and not _long(err), _long(out) + _long(err)


@pytest.mark.parametrize("a, b", [
    ("tests/fixtures/runs/cpu-aa-a", "tests/fixtures/runs/cpu-aa-b"),
    ("tests/fixtures/runs/cpu-aa-a", "tests/fixtures/runs/cpu-faults"),
    ("benchmarks/h200x2-2026-11-29b/nvlink2-aa", "benchmarks/h200x2-2026-11-30/nvlink2-aa"),
    ("benchmarks/h200x2-2026-11-29b/nvlink2", "benchmarks/h200x2-2026-11-29b/nvlink2-p2poff"),
    ("benchmarks/h200x2-2026-11-30-tuner/step", "benchmarks/h200x2-2026-11-30-tuner/step-p2poff"),
    ("benchmarks/h200x2-2026-11-30-tuner/tuned-p2pon", "benchmarks/h200x2-2026-11-30-tuner/tuned-p2poff"),
])
def test_compare_of_recorded_runs_fits_100_columns(a, b):
    code, out, err = _invoke("compare", REPO / a, REPO / b)
    assert code == 0, err
    assert not _long(out) and not _long(err), _long(out) + _long(err)
    assert "answer" in out


def test_cpu_smoke_end_to_end_fits_100_columns_and_explains_its_odd_row(tmp_path):
    """The shipped cpu-smoke spec (tiny: 1 trial, few iterations, screening only): every line of its
    output fits, the banner's estimate comes from recorded components, and the 4 MB row (sizes.bytes, no token count) says why."""
    out = tmp_path / "smoke"
    proc = run_cli("sweep", REPO / "sweeps" / "cpu-smoke.yaml", "--out", out, "--no-confirm",
                   "--set", "trials=1", "--set", "iters=5", "--set", "warmup=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_fits(proc)
    banner = " ".join(proc.stderr.split())
    # before the first launch: an estimate from the recorded components (#31, measure/eta.py)
    assert "expected: about" in banner and "(gloo, forkserver; benchmarks/README.md)" in banner
    assert "screening ETA" in proc.stderr
    lines = proc.stdout.splitlines()
    head = next(n for n, l in enumerate(lines) if l.lstrip().startswith("size(B)"))
    assert "gmean(us)" in lines[head] and "launches" in lines[head] and lines[0].startswith("gmean: ")
    row = next(l for l in lines if l.split()[:1] == ["4194304"])
    assert row.split()[1] == "eager"  # no token count: the tok column is empty
    assert "note: 4194304 B: no token count (listed under sizes.bytes), so in no band" in " ".join(
        proc.stdout.split())
    # the A/A line under gloo says why seed and simple count as identical
    assert "identical to default under gloo (gloo never loads NCCL)" in " ".join(proc.stdout.split()) or \
        "identical to default under gloo, which never loads NCCL" in " ".join(proc.stdout.split())


def test_a_long_usage_error_and_a_long_error_message_wrap():
    proc = run_cli("sweep", "--resume", REPO / "tests" / "fixtures" / "runs" / "cpu-aa-a", "--set", "trials=3")
    assert proc.returncode == 2 and "do not give a SPEC_FILE" in " ".join(proc.stderr.split())
    assert_fits(proc)
    code, out, err = _invoke("report", REPO / "benchmarks" / "h200x1-validation", "--out", "/nonexistent/x.html")
    assert code == 2 and not _long(err)


def test_json_output_is_never_wrapped(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(REPO / "tests" / "fixtures" / "runs" / "cpu-aa-b", run)
    code, out, _ = _invoke("report", run, "--json", "--out", tmp_path / "r.html")
    assert code == 0
    data = json.loads(out)
    assert any(len(l) > WIDTH for l in out.splitlines())  # long values stay whole: JSON is data
    assert data["format"] == "commdiag-verdicts"


@pytest.fixture(scope="module")
def library_probe_once():
    """doctor asks which libnccl this interpreter loads: a real child that imports torch, seconds each
    time.  The three recordings' reports differ in the replayed GPUs, not in that answer, so the first
    real probe (per worker) serves them all; test_ncclib.py tests the probe itself."""
    from commdiag.environment import ncclib

    real, seen = ncclib.probe, {}

    def probe(python=None, env=None, **kw):
        key = (python, None if env is None else tuple(sorted(env.items())), tuple(sorted(kw.items())))
        if key not in seen:
            seen[key] = real(python, env, **kw)
        return seen[key]

    return probe


@pytest.mark.parametrize("recording", ["h200x1/detect.json", "h200x2-nvlink/nvml-readings.json",
                                       "h200x2-nvlink/detect-live.json"])
def test_detect_and_doctor_on_gpu_recordings_fit_100_columns(recording, library_probe_once, monkeypatch):
    from commdiag.environment import ncclib

    monkeypatch.setattr(ncclib, "probe", library_probe_once)
    path = REPO / "tests" / "fixtures" / recording
    for command in ("detect", "doctor"):
        code, out, err = _invoke(command, "--nvml-replay", path)
        assert code in (0, 1) and out, err
        assert not _long(out) and not _long(err), _long(out) + _long(err)


def test_tuner_rules_of_a_recorded_run_fit_100_columns(tmp_path):
    # judged paired by trial, its 8 trials reach no per-size threshold: the notes say why, every line fits
    code, out, err = _invoke("tuner", "rules", REPO / "benchmarks" / "h200x2-2026-11-30-tuner" / "tuner-sizes")
    assert code == 0 and "no certified per-size winner" in out and "(12 needed)" in words(out), err
    assert not _long(out) and not _long(err), _long(out) + _long(err)


def test_rows_with_fewer_launches_say_why_on_a_recorded_two_stage_run():
    from commdiag import cli
    from commdiag.formats import results

    text = cli.render_table(results.load_run(REPO / "benchmarks" / "h200x2-2026-11-30" / "nvlink2-aa"))
    assert not _long(text)
    flat = " ".join(text.split())
    # stage 2 measured the claims' mode (graph) at the band sizes: the other rows have screening launches only
    assert "note: eager, eager-direct, graph-direct mode: screening launches only (stage 2 measures only the " \
           "claims' mode, graph)" in flat
    assert "note: 1835008 B: screening launches only (outside every band; stage 2 measures band sizes)" in flat
    counts = {l.split()[2]: int(l.split()[-3]) for l in text.splitlines() if l.split()[0] == "14336"}
    assert counts["graph"] > counts["eager"]  # the rows the notes explain
