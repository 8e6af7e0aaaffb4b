"""Read-only commands are read-only: load_run, report and compare never write
measured data; only the sweep (``assemble(..., write=True)``) rebuilds samples.csv/summary.csv.

Run folders are a recorded CPU run (tests/fixtures/runs/cpu-aa-a) damaged in the ways seen in the
adversarial pass, plus launch folders with result.json files in the worker's format.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from commdiag.formats import results
from commdiag.errors import CommdiagError

from conftest import REPO, one_message, run_cli, words

# run folders are read with pandas; CI's second run (Debian's python3.11, the install tests' few
# dependencies) has none
pytestmark = pytest.mark.skipif(importlib.util.find_spec("pandas") is None, reason="reading run folders needs pandas")

RUN = REPO / "tests" / "fixtures" / "runs" / "cpu-aa-a"


def _tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _result(samples: dict[int, list[float]], wrong: int = 0) -> dict:
    rank = lambda r: {"rank": r, "samples": {"torch": {"eager": {str(s): v for s, v in samples.items()}}},  # noqa: E731
                      "enqueue_us": {"torch": {}}, "wrong": {"torch": {str(s): wrong for s in samples}}}
    return {"format": "commdiag-launch", "version": 2, "ranks": [rank(0), rank(1)]}


def _with_launches(dest: Path, corrupt: int | None = None, keep_tables: bool = False) -> Path:
    """The fixture run with a launch folder per launch (its tables removed unless keep_tables)."""
    shutil.copytree(RUN, dest)
    run = json.loads((dest / "run.json").read_text())
    sizes = [s["bytes"] for s in run["spec"]["sizes"]]
    for l in run["launches"]:
        folder = results.launch_dir(dest, l["index"])
        folder.mkdir(parents=True)
        text = json.dumps(_result({s: [10.0 + l["index"], 11.0, 12.0] for s in sizes}))
        (folder / "result.json").write_text(text[:40] if l["index"] == corrupt else text)
    if not keep_tables:
        (dest / "samples.csv").unlink()
        (dest / "summary.csv").unlink()
    return dest


def test_launch_folders_are_read_in_memory_and_nothing_is_written(tmp_path):
    run = _with_launches(tmp_path / "run")
    before = _tree(run)
    data = results.load_run(run)
    assert len(data.samples) == 6 * 4 * 3 * 1 and set(data.summary["launches"]) == {3}
    assert _tree(run) == before


def test_a_corrupt_result_is_refused_not_dropped(tmp_path):
    run = _with_launches(tmp_path / "run", corrupt=2)
    before = _tree(run)
    with pytest.raises(CommdiagError, match=r"launches/0002/result.json: cannot read"):
        results.load_run(run)
    assert _tree(run) == before


def test_the_sweep_still_writes_its_tables(tmp_path):
    run = _with_launches(tmp_path / "run")
    samples, summary = results.assemble(run, json.loads((run / "run.json").read_text()))
    assert (run / "samples.csv").exists() and (run / "summary.csv").exists() and len(samples) == 72


def test_no_launches_and_no_summary_derives_in_memory(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    (run / "summary.csv").unlink()
    before = _tree(run)
    data = results.load_run(run)
    assert len(data.samples) == 720 and not data.summary.empty
    assert _tree(run) == before  # samples.csv not rewritten to its header


def test_only_gzipped_samples_are_read_and_no_empty_samples_csv_appears(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    raw = (run / "samples.csv").read_bytes()
    (run / "samples.csv.gz").write_bytes(gzip.compress(raw))
    (run / "samples.csv").unlink()
    before = _tree(run)
    assert len(results.load_run(run).samples) == 720
    (run / "summary.csv").unlink()
    before = _tree(run)
    assert len(results.load_run(run).samples) == 720
    assert _tree(run) == before and not (run / "samples.csv").exists()


@pytest.mark.parametrize("damage", ["no_data", "corrupt_samples", "truncated_gz", "wrong_columns"])
def test_missing_or_damaged_data_is_one_error(tmp_path, damage):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    if damage == "no_data":
        (run / "samples.csv").unlink()
        (run / "summary.csv").unlink()
    elif damage == "corrupt_samples":
        (run / "samples.csv").write_bytes(b'"unterminated\n\x00\x01')
    elif damage == "truncated_gz":
        data = gzip.compress((run / "samples.csv").read_bytes())
        (run / "samples.csv").unlink()
        (run / "samples.csv.gz").write_bytes(data[: len(data) // 2])
    else:
        (run / "samples.csv").write_text("a,b\n1,2\n")
    before = _tree(run)
    with pytest.raises(CommdiagError):
        results.load_run(run)
    assert _tree(run) == before


@pytest.mark.parametrize("cmd", ["report", "compare"])
def test_report_and_compare_of_a_folder_without_data_write_nothing(tmp_path, cmd):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    (run / "samples.csv").unlink()
    (run / "summary.csv").unlink()
    before = _tree(run)
    r = run_cli(cmd, run, *([run] if cmd == "compare" else []), timeout=120)
    assert r.returncode == 2 and "no measured data" in one_message(r.stderr), r.stderr
    assert _tree(run) == before


# --------------------------------------------------------------------------- corrupted run folders

def _j(run: Path, change):
    data = json.loads((run / "run.json").read_text())
    change(data)
    (run / "run.json").write_text(json.dumps(data))


CORRUPTIONS = {
    "truncated": lambda run: (run / "run.json").write_text((run / "run.json").read_text()[:200]),
    "empty": lambda run: (run / "run.json").write_text(""),
    "not_utf8": lambda run: (run / "run.json").write_bytes(b"\xff\xfe{}"),
    "list": lambda run: (run / "run.json").write_text("[]"),
    "deep": lambda run: (run / "run.json").write_text("[" * 100_000 + "]" * 100_000),
    "version_str": lambda run: _j(run, lambda d: d.update(version="1")),
    "version_new": lambda run: _j(run, lambda d: d.update(version=99)),
    "launches_dict": lambda run: _j(run, lambda d: d.update(launches={"a": 1})),
    "launch_not_dict": lambda run: _j(run, lambda d: d["launches"].append(5)),
    "launch_no_status": lambda run: _j(run, lambda d: d["launches"][0].pop("status")),
    "launch_bad_status": lambda run: _j(run, lambda d: d["launches"][0].update(status="exploded")),
    "launch_index_str": lambda run: _j(run, lambda d: d["launches"][0].update(index="../../x")),
    "config_unknown": lambda run: _j(run, lambda d: d["launches"][0].update(config="nope")),
    "configs_not_list": lambda run: _j(run, lambda d: d.update(configs={"x": 1})),
    "config_no_env": lambda run: _j(run, lambda d: d["configs"][0].pop("env")),
    "config_escape": lambda run: _j(run, lambda d: d["configs"][1].update(name="a\x1b]0;pwned\x07")),
    "sizes_missing": lambda run: _j(run, lambda d: d["spec"].pop("sizes")),
    "size_bad": lambda run: _j(run, lambda d: d["spec"].update(sizes=[{"bytes": "x"}])),
    "world_size_str": lambda run: _j(run, lambda d: d.update(world_size="two")),
    "samples_garbage": lambda run: (run / "samples.csv").write_bytes(b"\x00" * 100),
    "summary_columns": lambda run: (run / "summary.csv").write_text("x\n1\n"),
    "samples_is_dir": lambda run: ((run / "samples.csv").unlink(), (run / "samples.csv").mkdir()),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_corrupted_run_folders_are_one_error_and_untouched(tmp_path, name):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    CORRUPTIONS[name](run)
    before = _tree(run)
    calls = [("report", run, "--out", tmp_path / "r.html")]
    if name in ("truncated", "launch_bad_status", "samples_garbage"):  # the same loader: a few suffice
        calls.append(("compare", RUN, run))
    for args in calls:
        r = run_cli(*args, timeout=120)
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith("commdiag: error:") and one_message(r.stderr), r.stderr
        assert "Traceback" not in r.stderr and "failed:" not in r.stderr, r.stderr  # named, not generic
    assert _tree(run) == before and not (tmp_path / "r.html").exists()
