"""``commdiag compare``: recorded real runs, known shifts, fingerprint and settings warnings."""

from __future__ import annotations

import json


from commdiag.analyse import compare
from commdiag.formats import results
from conftest import run_cli
from test_report import FIXTURES, assert_drawn, make_run, render

SIZES = [4096, 65536, 1048576]


def test_two_recorded_aa_runs_through_the_cli(tmp_path):
    a, b = FIXTURES / "cpu-aa-a", FIXTURES / "cpu-aa-b"
    proc = run_cli("compare", a, b)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    rows = [(l, lines[n + 1]) for n, l in enumerate(lines) if l.strip().startswith("eager")]  # row, answer
    assert len(rows) == 2 * 4  # default and aa at 4 sizes
    assert not [a for _, a in rows if "certified faster" in a or "certified slower" in a]
    # 3 against 3 launches: the exact test cannot reach 1%/8 at all, and says so (once, under the table)
    assert all("3 vs 3 launches cannot reach 0.0013 (note below)" in a for _, a in rows)
    assert "smallest p the exact test can give is 0.1, above the 0.0013 needed" in " ".join(proc.stdout.split())
    assert "warning: environment differs" not in proc.stdout  # recorded on the same machine
    assert all(len(l) <= 100 for l in lines if " " in l.strip())
    # A and B are each run's gmean: the numbers the sweep table shows for the same cells
    from commdiag import cli

    for run, col in ((a, 3), (b, 4)):
        table = {(l.split()[3], l.split()[0]): l.split()[4] for l in cli.render_table(results.load_run(run))
                 .splitlines() if l.split()[0].isdigit()}
        for row, _ in rows:
            w = row.split()
            assert table[(w[2], w[1])] == w[col], (run, row)

    proc = run_cli("compare", a, b, "--json", "--html", tmp_path / "cmp.html")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["format"] == "commdiag-compare" and data["version"] == 2
    assert {(c["config"], c["size_bytes"]) for c in data["changes"]} == {
        (c, s) for c in ("default", "aa") for s in (4096, 65536, 1048576, 4194304)}
    dom, console = render(tmp_path / "cmp.html")
    assert_drawn(dom, console, expected=1)


def test_a_50_percent_slowdown_is_certified_with_enough_launches_and_noise_is_not(tmp_path):
    wobble = [1.0, 1.03, 0.99, 1.01, 0.98, 1.02, 1.0, 0.97, 1.015, 0.995]
    base = {"default": {s: [10.0 * w for w in wobble] for s in SIZES},
            "ll": {s: [8.0 * w for w in wobble] for s in SIZES}}
    slower = {"default": {s: [15.0 * w for w in wobble[::-1]] for s in SIZES},
              "ll": {s: [8.0 * w for w in wobble[3:] + wobble[:3]] for s in SIZES}}
    a = make_run(tmp_path / "a", base)
    b = make_run(tmp_path / "b", slower)
    r = compare.run(a, b)
    by = {(c.config, c.mode, c.size_bytes): c for c in r.changes}
    assert len(by) == 2 * 2 * len(SIZES) == r.family_size
    for s in SIZES:
        for mode in ("graph", "eager"):
            assert by[("default", mode, s)].verdict == compare.SLOWER
            assert by[("default", mode, s)].ratio == compare_ratio(1.5)
            assert by[("ll", mode, s)].verdict == compare.NOT_CERTIFIED
    assert "certified slower in B" in compare.render_text(r)
    # the answer in one line, before the cells (issue #36: 12 two-line cells and 3 notes to scan)
    head = compare.render_text(r).splitlines()[2]
    assert head.startswith(f"conclusion ({len(by)} cells): B certified slower in {2 * len(SIZES)} cell(s): default "), head
    # the same shift with 3 launches a run cannot be certified: the line gives the floor instead
    r3 = compare.run(make_run(tmp_path / "a3", {"default": {4096: [10.0, 10.3, 9.9]}}),
                     make_run(tmp_path / "b3", {"default": {4096: [15.0, 15.4, 14.8]}}))
    (c,) = [c for c in r3.changes if c.mode == "graph"]
    assert c.verdict == compare.NOT_CERTIFIED and c.p == compare_ratio(0.1) and c.p_floor == compare_ratio(0.1)
    assert compare.conclusion(r3) == ("conclusion: no certified change in 2 cells (2 with too few launches to "
                                      "certify: note below)")
    assert "smallest attainable is 0.1" in c.label


def compare_ratio(expected: float):
    import pytest

    return pytest.approx(expected, rel=0.02)


def test_fingerprint_and_settings_differences_are_warnings(tmp_path):
    table = {"default": {s: [10.0, 10.3, 9.9] for s in SIZES}, "ll": {s: [8.0, 8.1, 7.9] for s in SIZES}}
    a = make_run(tmp_path / "a", table)
    b = make_run(tmp_path / "b", table, configs={"default": {}, "ll": {"NCCL_PROTO": "LL128"}})
    run_b = json.loads((b / "run.json").read_text())
    run_b["fingerprint"]["worker"]["nccl"] = "2.27.3"
    run_b["fingerprint"]["worker"]["gpus"] = [{"rank": 0, "gpu_name": "NVIDIA H100"}]
    (b / "run.json").write_text(json.dumps(run_b))
    r = compare.compare(results.load_run(a), results.load_run(b))
    keys = {d.key for d in r.fingerprint}
    assert "worker.nccl" in keys and "worker.gpus.0.gpu_name" in keys
    text = compare.render_text(r)
    assert "warning: environment differs: worker.nccl: '2.28.9' (A) vs '2.27.3' (B)" in text
    assert any(d.key == "configs.ll.env" for d in r.settings)
    assert "warning: settings differ: configs.ll.env" in text


def test_a_time_budget_against_fixed_counts_is_a_settings_difference(tmp_path):
    """Comparing a time-budgeted run with a fixed-count one says so (#31: the counts differ per size)."""
    table = {"default": {s: [10.0, 10.3, 9.9] for s in SIZES}}
    a, b = make_run(tmp_path / "a", table), make_run(tmp_path / "b", table)
    for run_dir, budget in ((a, None), (b, 25.0)):
        run = json.loads((run_dir / "run.json").read_text())
        run["spec"]["time_per_size_ms"] = budget
        (run_dir / "run.json").write_text(json.dumps(run))
    text = compare.render_text(compare.compare(results.load_run(a), results.load_run(b)))
    assert "warning: settings differ: spec.time_per_size_ms: None (A) vs 25.0 (B)" in text


def test_v1_and_v2_runs_match_on_common_configs_and_sizes():
    r = compare.run(FIXTURES / "cpu-aa-a", FIXTURES / "cpu-faults")
    assert {(c.config, c.size_bytes) for c in r.changes} == {
        (c, s) for c in ("default", "aa") for s in (4096, 1048576)}
    assert set(r.only_b) == {"wrongsum", "crash"}
    assert any(d.key == "spec.iters" for d in r.settings)
    assert not [c for c in r.changes if c.verdict in (compare.FASTER, compare.SLOWER)]


def test_no_common_data_says_so(tmp_path):
    a = make_run(tmp_path / "a", {"default": {4096: [1.0, 1.1]}})
    b = make_run(tmp_path / "b", {"default": {8192: [1.0, 1.1]}})
    r = compare.run(a, b)
    assert r.changes == ()
    assert any("nothing to compare" in w for w in r.warnings)


def test_compare_of_a_run_with_itself_says_so(tmp_path):
    a = FIXTURES / "cpu-aa-a"
    proc = run_cli("compare", a, str(a) + "/")
    assert proc.returncode == 2 and "the same run folder as A" in proc.stderr and "Traceback" not in proc.stderr
    # a copy of the folder is compared, with a line saying that B is the same run
    import shutil

    shutil.copytree(a, tmp_path / "copy")
    proc = run_cli("compare", a, tmp_path / "copy")
    assert proc.returncode == 0, proc.stderr
    assert "note: B holds the same run as A (a copy: same start time and seed)" in proc.stdout
    assert json.loads(run_cli("compare", a, tmp_path / "copy", "--json").stdout)["same_run"] is True
