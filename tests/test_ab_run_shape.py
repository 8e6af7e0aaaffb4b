"""A damaged or hand-edited ab run.json (another user's folder, say) is one error naming the file and
the field, exit 2, before report.html is touched; never a TypeError from deep inside the report.
The run.json is constructed to the shape ``commdiag ab`` writes (ab/runner.py new_run, one_launch)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from commdiag.ab import runner

from conftest import run_cli, words


def ab_run(folder: Path) -> Path:
    launches = []
    for r in range(8):
        for c, level in (("seed", 120.0), ("default", 100.0)) if r % 2 else (("default", 100.0), ("seed", 120.0)):
            launches.append({"index": len(launches), "config": c, "round": r, "status": "ok", "exit_code": 0,
                             "machine": {"available": False},
                             "values": {"toks": level * math.exp(0.001 * ((r * 7 + len(c)) % 5))}})
    run = {"format": runner.RUN_FORMAT, "version": runner.RUN_FORMAT_VERSION, "state": "complete",
           "spec": {"name": "shape", "metrics": [{"name": "toks", "better": "higher"}], "rounds": 8,
                    "min_effect": 0.03},
           "configs": [{"name": "default", "env": {}, "overrides": {}},
                       {"name": "seed", "env": {"VALUE": "120"}, "overrides": {"VALUE": "120"}}],
           "launches": launches, "machine_state": {"available": False, "reason": "not read"}}
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps(run))
    return folder




def test_the_constructed_run_is_one_the_report_takes(tmp_path):
    run_dir = ab_run(tmp_path / "run")
    ok = run_cli("report", run_dir)
    assert ok.returncode == 0 and "seed: toks is BETTER than default" in words(ok.stdout), ok.stderr
    assert (run_dir / "report.html").is_file()


@pytest.mark.parametrize("where, value, field", [
    ("index", "<b>7</b>", "launches[0].index"),
    ("round", "two", "launches[0].round"),
    ("round", None, "launches[0].round"),
    ("status", "done", "launches[0].status"),
    ("config", "nobody", "launches[0].config"),
    ("values", {"toks": "1e3"}, "launches[0].values"),
])
def test_a_damaged_launch_is_one_error_naming_its_field(tmp_path, where, value, field):
    run_dir = ab_run(tmp_path / "run")
    run = json.loads((run_dir / "run.json").read_text())
    run["launches"][0][where] = value
    (run_dir / "run.json").write_text(json.dumps(run))
    proc = run_cli("report", run_dir)
    said = words(proc.stderr)
    assert proc.returncode == 2 and f"{run_dir / 'run.json'}: {field}:" in said, said
    assert "TypeError" not in said and "report failed" not in said
    assert not (run_dir / "report.html").exists()  # nothing written


def test_a_config_name_with_control_characters_is_refused(tmp_path):
    run_dir = ab_run(tmp_path / "run")
    run = json.loads((run_dir / "run.json").read_text())
    run["configs"][1]["name"] = "seed\x1b]0;title\x07"
    for l in run["launches"]:
        if l["config"] == "seed":
            l["config"] = run["configs"][1]["name"]
    (run_dir / "run.json").write_text(json.dumps(run))
    proc = run_cli("report", run_dir)
    assert proc.returncode == 2 and "configs[1].name:" in words(proc.stderr) and "control characters" in proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr and not (run_dir / "report.html").exists()


def test_control_characters_in_a_failed_launchs_output_are_shown_not_written_raw(tmp_path):
    """A benchmark's stderr tail and error (and the spec's description) may hold terminal control
    sequences: report.html shows them as text (\\x1b), so cat report.html on a terminal obeys none."""
    run_dir = ab_run(tmp_path / "run")
    run = json.loads((run_dir / "run.json").read_text())
    evil = "\x1b]0;owned\x07\x1b[2J\x9b31m\u2028<b>x</b>"
    first = run["launches"][0]
    first.update(status="failed", error="toks: " + evil, tail="--- stderr.txt ---\n 50%\r100%\r\n" + evil)
    first.pop("values")
    run["spec"]["description"] = evil
    (run_dir / "run.json").write_text(json.dumps(run))
    proc = run_cli("report", run_dir)
    assert proc.returncode == 0, proc.stderr
    page = (run_dir / "report.html").read_text()
    body = page.split("</script></head>", 1)[1]  # plotly.js itself is not ours to judge
    for raw in ("\x1b", "\x07", "\x9b", "\u2028"):
        assert raw not in body, repr(raw)
    assert "\\x1b]0;owned\\x07" in body and "&lt;b&gt;x&lt;/b&gt;" in body
    assert " 50%\n100%\n" in body and "\r" not in body  # a progress bar's states, one a line
