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
    from dataclasses import replace
    from pathlib import Path

    from commdiag import cli
    from commdiag.analyse.report import _fit
    from commdiag.formats import results

    data = results.load_run(Path(__file__).resolve().parent.parent / "benchmarks" / "h200x2-2026-11-30" / "nvlink2")
    names = {"default": "PROTO=LL,ALGO=Ring,MAX_NCHANNELS=8,BUFFSIZE=4194304",
             "seed": "PROTO=LL,ALGO=Ring,MAX_NCHANNELS=8,BUFFSIZE=16777216"}
    data = replace(data, samples=data.samples.replace({"config": names}),
                   summary=data.summary.replace({"config": names}))
    lines = cli.render_table(data).splitlines()
    assert max(len(l) for l in lines) <= 100
    shown = {l.split()[3] for l in lines[3:] if l.split()[0] == "14336" and l.split()[2] == "graph"}
    cut = {_fit(n, 21) for n in names.values()}
    assert len(cut) == 2 and cut <= shown, (cut, shown)  # both cut, and still told apart
