"""Rules from a run whose A/A twin was certified per size say so: the run's A/A check failed, so the
machine certified noise, and any rule from it is suspect.  The run folder is test_tuner_rules'
constructed --certify-sizes run (make_run)."""

from __future__ import annotations

from commdiag.tuner import fromrun

from conftest import run_cli, words
from test_tuner_rules import LL, make_run


def test_rules_from_a_run_whose_twin_was_certified_carry_the_failed_aa_check(tmp_path):
    run_dir = make_run(tmp_path / "run", {"ll": LL, "twin": {}}, {"ll": {114688: 80.0}, "twin": {14336: 70.0}})
    res = fromrun.derive(run_dir)
    assert res.rules  # ll's certified size still makes its rule: the note is beside it
    failed = [n for n in res.notes if n.startswith("A/A check: FAIL: twin was certified faster than default")]
    assert failed, res.notes
    proc = run_cli("tuner", "rules", run_dir)
    assert proc.returncode == 0, proc.stderr
    assert "A/A check: FAIL: twin was certified faster than default in 14336 B" in words(proc.stdout)
    assert max(len(l) for l in proc.stdout.splitlines()) <= 100
