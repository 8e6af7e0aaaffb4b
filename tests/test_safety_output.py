"""The one output-path writer: regular files atomically, everything else refused.

Device nodes, FIFOs and sockets are made inside tmp_path (never the real /dev): ``report --out
/dev/null`` as root once replaced /dev/null with a 4.8 MB regular file.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import stat
from pathlib import Path

import pytest

from commdiag.atomic import write_json, write_text
from commdiag.errors import CommdiagError

from conftest import REPO, one_message, run_cli, words as words_

RUN = REPO / "tests" / "fixtures" / "runs" / "cpu-aa-a"


def _char_device(path: Path) -> Path:
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
    except PermissionError:
        pytest.skip("mknod needs root (CAP_MKNOD)")
    return path


def _socket(path: Path) -> Path:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    return path


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _symlink(path: Path) -> Path:
    target = path.parent / "target.html"
    target.write_text("keep")
    path.symlink_to(target)
    return path


def _dangling(path: Path) -> Path:
    path.symlink_to(path.parent / "nowhere")
    return path


def _directory(path: Path) -> Path:
    path.mkdir()
    return path


KINDS = {"fifo": (_fifo, "FIFO"), "socket": (_socket, "socket"), "chardev": (_char_device, "character device"),
         "symlink": (_symlink, "symbolic link"), "dangling": (_dangling, "symbolic link"),
         "directory": (_directory, "directory")}


def _state(folder: Path) -> dict:
    out = {}
    for p in sorted(folder.rglob("*")):
        st = os.lstat(p)
        out[str(p)] = (stat.S_IFMT(st.st_mode), st.st_ino, p.read_bytes() if stat.S_ISREG(st.st_mode) else None)
    return out


@pytest.mark.parametrize("kind", list(KINDS))
def test_writer_refuses_what_is_not_a_regular_file(tmp_path, kind):
    make, words = KINDS[kind]
    target = make(tmp_path / "out.html")
    before = _state(tmp_path)
    for write in (lambda: write_text(target, "x" * 1000), lambda: write_json(target, {"a": 1})):
        with pytest.raises(CommdiagError) as e:
            write()
        assert str(target) in str(e.value) and words in str(e.value)
    assert _state(tmp_path) == before  # nothing replaced, no temporary file left


@pytest.mark.parametrize("path, words", [("", "empty"), ("missing/dir/out.html", "does not exist"),
                                         ("file.txt/out.html", "is not a directory")])
def test_writer_needs_a_path_in_an_existing_directory(tmp_path, path, words):
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(CommdiagError, match=words):
        write_text(tmp_path / path if path else "", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


def test_writer_turns_os_errors_into_one_message(tmp_path):
    with pytest.raises(CommdiagError, match="cannot write"):
        write_text(tmp_path / ("n" * 300), "x")  # ENAMETOOLONG
    assert list(tmp_path.iterdir()) == []


def test_writer_replaces_a_regular_file_atomically(tmp_path):
    p = tmp_path / "a.json"
    p.write_text("old")
    write_json(p, {"new": True})
    assert p.read_text() == '{\n "new": true\n}\n' and [q.name for q in tmp_path.iterdir()] == ["a.json"]


@pytest.fixture
def run_copy(tmp_path):
    dest = tmp_path / "run"
    shutil.copytree(RUN, dest)
    return dest


@pytest.mark.parametrize("kind", ["fifo", "chardev", "symlink", "socket"])
def test_report_and_compare_refuse_special_outputs(tmp_path, run_copy, kind):
    make, words = KINDS[kind]
    target = make(tmp_path / "out.html")
    before = _state(tmp_path)
    for args in (("report", run_copy, "--out", target), ("compare", run_copy, run_copy, "--html", target)):
        r = run_cli(*args, timeout=60)
        assert r.returncode == 2, r.stderr
        assert words_(words) in one_message(r.stderr) and "Traceback" not in r.stderr
    assert _state(tmp_path) == before


@pytest.mark.parametrize("out", ["missing/report.html", ""])
def test_report_out_into_nowhere_is_one_error(tmp_path, run_copy, out):
    before = _state(tmp_path)
    r = run_cli("report", run_copy, "--out", tmp_path / out if out else "", timeout=60)
    assert r.returncode == 2 and one_message(r.stderr) and "Traceback" not in r.stderr
    assert _state(tmp_path) == before


# --------------------------------------------------------------------------- the top-level handler

@pytest.mark.parametrize("content", ['{"nvml_readings": 5}', "[1, 2]", '{"gpus": [5]}',
                                     '{"gpus": [{"index": "x"}], "pairs": []}'])
def test_an_nvml_recording_of_the_wrong_shape_is_one_error(tmp_path, content):
    bad = tmp_path / "nvml.json"
    bad.write_text(content)
    r = run_cli("detect", "--nvml-replay", bad, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("commdiag: error: --nvml-replay: "), r.stderr
    assert one_message(r.stderr) and "Traceback" not in r.stderr


def test_handler_names_the_file_of_an_os_error(tmp_path):
    from click.testing import CliRunner

    from commdiag import cli

    @cli.main.command("_boom", hidden=True)
    def _boom():
        raise OSError(28, "No space left on device", str(tmp_path / "run.json"))

    try:
        r = CliRunner().invoke(cli.main, ["_boom"])
        assert r.exit_code == 2
        assert one_message(r.output) == (f"commdiag: error: _boom failed: {tmp_path / 'run.json'}: No space left "
                                         "on device (run with --debug for the traceback)")
        r = CliRunner().invoke(cli.main, ["--debug", "_boom"])
        assert isinstance(r.exception, OSError)
    finally:
        cli.main.commands.pop("_boom")


def test_error_messages_are_terminal_safe():
    from click.testing import CliRunner

    from commdiag import cli
    from commdiag.errors import CommdiagError

    @cli.main.command("_esc", hidden=True)
    def _esc():
        raise CommdiagError("config a\x1b]0;pwned\x07\x1b[2J: bad")

    try:
        r = CliRunner().invoke(cli.main, ["_esc"])
        assert r.exit_code == 2 and "\x1b" not in r.output and "\\x1b]0;pwned\\x07" in r.output
    finally:
        cli.main.commands.pop("_esc")


@pytest.mark.skipif(importlib.util.find_spec("pandas") is None, reason="a sweep needs pandas")
@pytest.mark.parametrize("kind", ["fifo", "chardev", "socket"])
def test_sweep_out_at_a_special_file_is_one_error(tmp_path, kind):
    from conftest import write_spec

    make, _ = KINDS[kind]
    target = make(tmp_path / "out")
    spec = write_spec(tmp_path / "s.yaml")
    before = _state(tmp_path)
    r = run_cli("sweep", spec, "--out", target, timeout=120)
    assert r.returncode == 2 and one_message(r.stderr) and "Traceback" not in r.stderr, r.stderr
    assert str(target) in r.stderr
    assert _state(tmp_path) == before
