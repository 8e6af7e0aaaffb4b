"""As root, a run folder another user can change is refused before any launch: its owner could plant
``launches`` as a link (commdiag ab and sweep remove a leftover launch folder and write each launch
below it), or whoever can write its parent could swap the folder.  Made in tmp and chowned to nobody;
skipped where the tests do not run as root."""

from __future__ import annotations

import os

import pytest
import yaml

from commdiag.errors import CommdiagError
from commdiag.measure import runlock

from conftest import run_cli, words

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the refusal is root's")
NOBODY = 65534


def _spec(tmp_path):
    spec = tmp_path / "ab.yaml"
    spec.write_text(yaml.safe_dump({"name": "own", "seed": 1, "rounds": 8,
                                    "command": ["{python}", "-c", "print('toks: 100')"],
                                    "metrics": [{"name": "toks", "regex": r"toks: (?P<value>\S+)",
                                                 "better": "higher"}],
                                    "configs": {"seed": {"X": "1"}}}))
    return spec


def test_a_launches_link_planted_in_another_users_folder_is_never_followed(tmp_path):
    victim = tmp_path / "victim"
    (victim / "0000").mkdir(parents=True)
    (victim / "0000" / "keep").write_text("precious")
    run_dir = tmp_path / "shared-run"
    run_dir.mkdir()
    (run_dir / "launches").symlink_to(victim)
    os.lchown(run_dir / "launches", NOBODY, NOBODY)
    os.chown(run_dir, NOBODY, NOBODY)
    proc = run_cli("ab", _spec(tmp_path), "--out", run_dir, timeout=120)
    said = words(proc.stderr)
    assert proc.returncode == 2 and f"{run_dir}: as root, commdiag writes a run's launches only" in said, said
    assert "owned by uid 65534" in said
    assert (victim / "0000" / "keep").read_text() == "precious" and os.listdir(victim) == ["0000"]
    assert not (run_dir / "run.json").exists()


def test_a_folder_in_a_world_writable_parent_is_refused_and_roots_own_is_not(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)  # no sticky bit: anyone may rename the run folder away and put a link there
    (open_dir / "run").mkdir()
    with pytest.raises(CommdiagError, match="world-writable"):
        with runlock.hold(open_dir / "run"):
            pass
    os.chmod(open_dir, 0o1777)  # sticky, as /tmp: only root may rename root's folder
    with runlock.hold(open_dir / "run"):
        pass
