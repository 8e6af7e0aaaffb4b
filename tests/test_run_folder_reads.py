"""A run folder another user owns is read, never waited on: run.json that is a FIFO (or a link to a
character device) is refused at once with what it is, by ``commdiag report`` (sweep and ab folders
alike) and ``commdiag ab --resume``.  FIFOs and device nodes are made inside tmp (mkfifo, mknod)."""

from __future__ import annotations

import os
import resource
import stat
import subprocess
import sys

import pytest

from commdiag import readfile

from conftest import REPO, run_cli, words


@pytest.mark.parametrize("command", [("report",), ("ab", "--resume")])
def test_a_fifo_planted_as_run_json_is_refused_not_waited_on(tmp_path, command):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / "run.json")
    proc = run_cli(*command, run_dir, timeout=60)
    said = words(proc.stderr)
    assert proc.returncode == 2 and f"{run_dir / 'run.json'}: cannot read: not a regular file" in said, said
    assert not (run_dir / "report.html").exists()


def test_a_link_to_a_character_device_is_refused_not_read_until_memory_runs_out(tmp_path):
    zero = tmp_path / "zero"
    try:
        os.mknod(zero, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # what /dev/zero is, made in tmp
    except PermissionError:
        pytest.skip("mknod needs root here")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").symlink_to(zero)

    def cap():  # were it read, the child would stop at 2 GiB, not take the machine's memory
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "commdiag.cli", "report", str(run_dir)], capture_output=True,
                          text=True, timeout=60, env=env, preexec_fn=cap)
    assert proc.returncode == 2 and "cannot read: not a regular file" in words(proc.stderr), proc.stderr[-500:]


def test_a_file_over_the_limit_is_refused(tmp_path):
    big = tmp_path / "run.json"
    big.write_text("x" * 2048)
    assert readfile.read_text(big, limit=2048) == "x" * 2048
    with pytest.raises(readfile.Refused, match="larger than"):
        readfile.read_text(big, limit=2047)
