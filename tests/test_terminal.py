"""Everything the CLI prints is terminal-safe: control characters from the environment are shown, never obeyed."""

from __future__ import annotations

from conftest import run_cli


def test_check_env_prints_an_escape_sequence_in_a_value_as_text():
    hostile = "LL\x1b]0;pwned\x07\x1b[2J"
    proc = run_cli("check-env", "--var", "NCCL_PROTO", env={"NCCL_PROTO": hostile})
    out = proc.stdout + proc.stderr
    assert "\x1b" not in out and "\x07" not in out
    assert "LL\\x1b]0;pwned\\x07\\x1b[2J" in out
