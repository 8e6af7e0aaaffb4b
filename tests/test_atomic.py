"""Atomic writes: the file a user gets has the mode a plain open() would give it, not mkstemp's 0600."""

from __future__ import annotations

import os
import stat

from commdiag.atomic import write_json, write_text


def test_new_files_follow_the_umask_and_existing_files_keep_their_mode(tmp_path):
    # report.html, run.json and profile.env came out 0600: a teammate on the same box could not open the report
    old = os.umask(0o022)
    try:
        write_text(tmp_path / "report.html", "<html></html>")
        write_json(tmp_path / "run.json", {"a": 1})
    finally:
        os.umask(old)
    for name in ("report.html", "run.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name
    kept = tmp_path / "summary.csv"
    kept.write_text("old")
    kept.chmod(0o640)
    write_text(kept, "new")
    assert kept.read_text() == "new" and stat.S_IMODE(kept.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "run.json", "summary.csv"]
