"""Everything the CLI prints is terminal-safe: control characters from the environment are shown, never obeyed."""

from __future__ import annotations

from conftest import run_cli


def test_check_env_prints_an_escape_sequence_in_a_value_as_text():
    hostile = "LL\x1b]0;pwned\x07\x1b[2J"
    proc = run_cli("check-env", "--var", "NCCL_PROTO", env={"NCCL_PROTO": hostile})
    out = proc.stdout + proc.stderr
    assert "\x1b" not in out and "\x07" not in out
    assert "LL\\x1b]0;pwned\\x07\\x1b[2J" in out


def test_the_sweep_table_fits_100_columns_and_never_cuts_two_names_alike():
    from pathlib import Path

    from commdiag import cli
    from commdiag.formats import results

    data = results.load_run(Path(__file__).resolve().parent.parent / "benchmarks" / "h200x2-2026-11-30" / "nvlink2")
    summary = data.summary.copy()
    summary.loc[0, "config"] = "PROTO=LL,ALGO=Ring,MAX_NCHANNELS=8,BUFFSIZE=4194304"
    summary.loc[1, "config"] = "PROTO=LL,ALGO=Ring,MAX_NCHANNELS=8,BUFFSIZE=16777216"
    lines = cli.render_table(summary).splitlines()
    assert max(len(l) for l in lines) <= 100
    assert lines[1].split()[3] != lines[2].split()[3]
