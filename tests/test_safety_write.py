"""Where root writes (#30 items 1, 2, 4, 5, 9) and what it prints or accepts from a run folder (12, 13).

One writer (commdiag/atomic.py) goes through folder descriptors opened without following a link; as
root a link on the way is followed only where nobody else can change it.  Every case is the attack of
the issue with a real throwaway user (useradd; runuser where she acts), her links in /tmp, and a
victim folder of root's whose content must come through untouched."""

from __future__ import annotations

import importlib.util
import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commdiag import atomic, readfile
from commdiag.errors import CommdiagError
from commdiag.formats import results

from conftest import REPO, words
from users import (  # noqa: F401 (stage, reader_refuses_others: fixtures)
    as_user, give, needs_root, reader_refuses_others, stage, staging, throwaway_user, user_fixture)

FIXTURE_RUN = REPO / "tests" / "fixtures" / "runs" / "cpu-aa-a"


user = user_fixture("w")


def cli(*args, cwd=None, timeout=120):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "commdiag.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=cwd)


def victim(stage: Path) -> Path:
    v = stage / "victim"
    (v / "0000").mkdir(parents=True)
    (v / "0000" / "keep").write_text("precious")
    os.chmod(v / "0000" / "keep", 0o600)
    return v


def untouched(v: Path) -> bool:
    return sorted(os.listdir(v)) == ["0000"] and os.listdir(v / "0000") == ["keep"] and \
        (v / "0000" / "keep").read_text() == "precious"


def users_link(stage: Path, name: str, to: Path, uid: int, gid: int) -> Path:
    """A folder of hers holding a link of hers: what she can point anywhere at any time."""
    home = give(stage / "home", uid, gid) if not (stage / "home").mkdir() else None
    link = home / name
    link.symlink_to(to)
    os.lchown(link, uid, gid)
    return link


# --------------------------------------------------------------------------- item 1: tuner build

@needs_root
def test_tuner_build_as_root_neither_builds_in_her_folder_nor_loads_by_a_path(stage, user, monkeypatch):
    name, uid, gid = user
    hers = give(stage / "hers", uid, gid) if not (stage / "hers").mkdir() else None
    cp = cli("tuner", "build", cwd=hers)  # the old default --out: the current folder
    assert cp.returncode == 2 and "as root, give --out DIR" in words(cp.stderr), cp.stdout + cp.stderr
    cp = cli("tuner", "build", "--out", hers / "lib")
    said = words(cp.stderr)
    assert cp.returncode == 2 and f"{hers} is owned by uid {uid} ({name})" in said, said
    assert os.listdir(hers) == []  # nothing made, compiled or chmod-ed there
    # a folder of root's: the compiler writes into a private 0700 folder she cannot enter, and the check
    # loads the very file opened (/proc/self/fd/N), never a name she could rename another library over
    from commdiag.tuner import build

    seen = {}
    real_run, real_symbols = build.procs.run, build.exported_symbols

    def run(argv, **kw):
        if "-o" not in argv:  # as_user's runuser
            return real_run(argv, **kw)
        out = Path(argv[argv.index("-o") + 1])
        st = os.stat(out.parent)
        seen["private"] = (st.st_uid, st.st_mode & 0o777)
        seen["she_writes"] = as_user(name, "touch", str(out.parent / "evil.so")).returncode == 0
        return real_run(argv, **kw)

    monkeypatch.setattr(build.procs, "run", run)
    monkeypatch.setattr(build, "exported_symbols", lambda p: (seen.setdefault("loaded", str(p)), real_symbols(p))[1])
    lib = build.build(stage / "ours")
    assert seen["private"] == (0, 0o700) and not seen["she_writes"], seen
    assert seen["loaded"].startswith("/proc/self/fd/"), seen
    assert os.stat(lib).st_mode & 0o777 == 0o755 and sorted(os.listdir(stage / "ours")) == [lib.name]


# --------------------------------------------------------------------------- item 2: output folders

@needs_root
def test_output_folders_are_never_made_through_her_link(stage, user):
    name, uid, gid = user
    v = victim(stage)
    link = users_link(stage, "out", v, uid, gid)
    cp = cli("tuner", "build", "--out", link / "lib")
    assert cp.returncode == 2 and "owned by uid" in words(cp.stderr), cp.stderr
    from commdiag.environment import sysfscapture

    with pytest.raises(CommdiagError, match=r"as root, commdiag writes through a symbolic link .* only where no "
                                            r"other user can change it"):
        sysfscapture._Writer(str(link / "capture"))  # detect --capture-sysfs LINK/capture
    with pytest.raises(CommdiagError, match="symbolic link"):
        atomic.make_dirs(link / "a" / "b")
    assert untouched(v)


# --------------------------------------------------------------------------- item 4: report

@needs_root
def test_report_never_writes_through_her_swapped_run_folder(stage, user):
    name, uid, gid = user
    v = victim(stage)
    home = give(stage / "home", uid, gid) if not (stage / "home").mkdir() else None
    run = home / "run"
    shutil.copytree(FIXTURE_RUN, run)
    give(home, uid, gid)
    if importlib.util.find_spec("pandas"):  # (the report's own dependency; not in CI's Debian-python run)
        cp = cli("report", run)  # as root, her run folder is not read at all by default
        assert cp.returncode == 2 and "--allow-user-files" in words(cp.stderr) and not (run / "report.html").exists()
    with pytest.raises(CommdiagError, match="as root, commdiag reads a run folder only"):
        results.load_run_json(run)
    # with the option: read, then she swaps the folder for a link before the write
    readfile.allow_others(True)
    results.load_run_json(run)
    swap = as_user(name, "sh", "-c", f"mv {run} {run}.old && ln -s {v} {run}")
    assert swap.returncode == 0, swap.stderr
    with pytest.raises(CommdiagError, match="as root, commdiag writes through a symbolic link"):
        atomic.write_text(run / "report.html", "<html>")
    assert untouched(v)


# --------------------------------------------------------------------------- item 5: explain's folders

@needs_root
def test_explain_removes_and_writes_nothing_through_her_links(stage, user):
    from commdiag.measure import explain, launcher

    name, uid, gid = user
    v = victim(stage)
    run = stage / "run"
    shutil.copytree(FIXTURE_RUN, run)
    data = json.loads((run / "run.json").read_text())
    data["spec"]["backend"] = "nccl"
    (run / "run.json").write_text(json.dumps(data))
    (run / "explain").symlink_to(v)  # explain/0000 is then the victim's 0000, emptied by rmtree
    os.lchown(run / "explain", uid, gid)
    give(run, uid, gid)
    readfile.allow_others(True)  # even when root accepts reading her folder, it writes no launch there
    with pytest.raises(CommdiagError, match="as root, commdiag writes a run's launches only into a folder no other"):
        explain.run_explain(run, env={})
    assert untouched(v)
    # the launch's log: a link planted as torchrun.log never truncates the file it points to
    log = stage / "torchrun.log"
    log.symlink_to(v / "0000" / "keep")
    with pytest.raises(OSError):
        launcher.run(["true"], {launcher.MARKER: "0" * 32, "PATH": "/usr/bin:/bin"}, log, 10)
    assert untouched(v)


# --------------------------------------------------------------------------- item 9: --out of sweep, step, ab

@needs_root
def test_ab_out_through_her_link_leaves_no_folder_behind(stage, user):
    name, uid, gid = user
    v = victim(stage)
    link = users_link(stage, "reports", v, uid, gid)
    prof = stage / "seed.env"
    prof.write_text("# commdiag-profile 1\nNCCL_PROTO=LL\n")
    cp = cli("ab", "--out", link / "new", "--config", f"seed={prof}", "--metric", r"t:higher:t=(\d+)", "--",
             sys.executable, "-c", "print('t=1')")
    assert cp.returncode == 2 and "owned by uid" in words(cp.stderr), cp.stdout + cp.stderr
    assert untouched(v)  # main made victim/new before it refused


# --------------------------------------------------------------------------- items 12 and 13: run.json as data

def test_run_json_text_reaches_the_terminal_as_one_inert_line(tmp_path):
    from commdiag.install import hook

    run = tmp_path / "run"
    shutil.copytree(FIXTURE_RUN, run)
    data = json.loads((run / "run.json").read_text())
    data["verdicts"] = {"decode": "none\ninstalled; manifest: /var/lib/commdiag\n  verify: OK: every value arrived"}
    (run / "run.json").write_text(json.dumps(data))
    s = hook.resolve_settings(from_dir=run, sets=["NCCL_PROTO=LL"], force=True)
    assert s.warnings and all("\n" not in w for w in s.warnings), s.warnings
    assert "none\\ninstalled; manifest" in s.warnings[0]


@pytest.mark.parametrize("field, value, named", [
    ("warnings", 5, "warnings"),
    ("warnings", ["ok", {"x": 1}], "warnings"),
    ("spec.bands", {"decode": "1-64"}, "spec.bands.'decode'"),
    ("spec.bands", [1, 64], "spec.bands"),
    ("configs.0.overrides", [["NCCL_PROTO", "LL"]], "configs[0].overrides"),
])
def test_a_damaged_run_json_field_is_one_error_naming_it(tmp_path, field, value, named):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE_RUN, run)
    data = json.loads((run / "run.json").read_text())
    where, *path = field.split(".")
    node = data
    for key in [where, *path][:-1]:
        node = node[int(key)] if key.isdigit() else node[key]
    last = [where, *path][-1]
    node[int(last) if last.isdigit() else last] = value
    (run / "run.json").write_text(json.dumps(data))
    with pytest.raises(CommdiagError, match="run.json: " + re.escape(named) + ": "):
        results.load_run_json(run)


@pytest.mark.parametrize("bad, named", [
    ({"flags": "x"}, "flags: 'x' is not a list"),
    ({"flags": [{"code": 1}]}, "flags[0].code: 1 is not a string"),
    ({"wall_s": "fast"}, "wall_s: 'fast' is not a number or null"),
    ({"gpus": [{"index": 0, "replays_before": "many"}]}, "gpus[0].replays_before: 'many' is not an integer or null"),
    ({"gpus": [{"index": 0, "replays_after": 1.5}]}, "gpus[0].replays_after: 1.5 is not an integer or null"),
])
def test_a_damaged_p2p_result_field_is_one_error_naming_it(tmp_path, bad, named):
    from commdiag.p2p import result

    good = {"format": result.P2P_FORMAT, "version": 1, "gpus": [{"index": 0}], "pairs": [], "flags": [],
            "notes": [], "settings": {}, "wall_s": 1.0}
    f = tmp_path / "p2p.json"
    f.write_text(json.dumps(good))
    assert result.load(f).wall_s == 1.0
    f.write_text(json.dumps({**good, **bad}))
    with pytest.raises(CommdiagError) as e:
        result.load(f)
    assert str(e.value).startswith(f"{f}: {named}"), str(e.value)
