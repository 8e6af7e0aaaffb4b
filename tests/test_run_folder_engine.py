"""The one run-folder engine (measure/runner.py) and publishing from the library: ``run_sweep()`` called
from Python leaves the run folder the CLI leaves.  Real run folders, a real gloo sweep."""

from __future__ import annotations

import json
import shutil

import pytest

from commdiag.errors import CommdiagError
from commdiag.formats import results
from commdiag.measure import runner, sweep

from conftest import run_cli, write_spec


def published(run_dir):
    return sorted(p.name for p in run_dir.iterdir() if p.name == "report.html" or p.name.startswith("profile"))


def test_run_sweep_from_python_publishes_what_the_cli_publishes(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", trials=1, seed=7, configs={"ll": {"NCCL_PROTO": "LL"}})
    cli_dir = tmp_path / "cli"
    proc = run_cli("sweep", spec, "--out", cli_dir, "--no-confirm", "--json")
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    # the same measured folder, without what the CLI published; the library finishes it (nothing is pending)
    lib_dir = tmp_path / "lib"
    shutil.copytree(cli_dir, lib_dir, ignore=shutil.ignore_patterns("report.html", "profile*.env"))
    assert published(lib_dir) == []
    res = sweep.run_sweep(resume=lib_dir)
    assert res.state == "complete" and res.all_ok
    assert published(lib_dir) == published(cli_dir) == ["report.html"]
    assert res.published.report == lib_dir / "report.html" and shown["report"] == str(cli_dir / "report.html")
    # the same verdicts, but for the folder they name
    assert json.loads(json.dumps(res.published.verdicts.to_json()).replace(str(lib_dir), str(cli_dir))) \
        == shown["verdicts"]
    assert [str(lib_dir / p) for p in res.published.profiles] == [] == shown["profiles"]
    # an unpublished run is the library's choice too
    assert sweep.run_sweep(resume=lib_dir, publish=False).published is None


def new_folder(tmp_path, statuses):
    run = {"launches": [{"index": i, "config": "c", "status": s} for i, s in enumerate(statuses)],
           "warnings": []}
    saved = []

    def save(path, run):
        saved.append(json.loads(json.dumps(run)))
        (path / "run.json").write_text(json.dumps(run))

    return run, saved, save


def test_the_pending_loop_sends_the_launch_in_flight_back_to_pending_on_ctrl_c(tmp_path):
    run, saved, save = new_folder(tmp_path, ["ok", "pending", "pending", "pending"])
    seen, progress = [], []

    def one(batch):
        launch = batch[0]
        if launch["index"] == 2:
            launch.update(marker="0" * 32, half="written")
            raise KeyboardInterrupt
        seen.append(launch["index"])
        launch.update(status="ok", wall_s=2.0)
        return 2.0

    with runner.opened(tmp_path, load=lambda p: run, save=save) as folder:
        assert folder.run_pending(one, keys=("index", "config", "marker"), on_progress=progress.append) is True
        res = folder.finish()
    assert seen == [1]  # launch 0 was done, launch 3 never started
    assert run["launches"][2] == {"index": 2, "config": "c", "marker": "0" * 32, "status": "pending"}
    assert [(p.done, p.total, p.eta_s) for p in progress] == [(1, 3, 4.0)]
    assert res.state == "interrupted" and res.counts == {"ok": 2, "pending": 2} and not res.all_ok
    assert saved[-1]["state"] == "interrupted" and saved[-1]["finished_utc"] is None
    assert not (tmp_path / ".lock").exists()  # released


def test_a_new_run_is_refused_where_one_is_and_the_lock_is_held_for_the_with_block(tmp_path):
    run, _, save = new_folder(tmp_path, ["pending"])
    with runner.opened(tmp_path / "r", load=results.load_run_json, save=save, new=lambda: run) as folder:
        folder.save()
        with pytest.raises(CommdiagError, match="another commdiag process"):
            with runner.opened(tmp_path / "r", load=lambda p: run, save=save):
                pass
    with pytest.raises(CommdiagError, match="already holds a run; use --resume"):
        with runner.opened(tmp_path / "r", load=lambda p: run, save=save, new=lambda: run):
            pass
