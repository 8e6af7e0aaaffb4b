"""Hostile ``--python`` targets: every reply ends in one bounded error,
no child of the target outlives the probe, and nothing it prints reaches a terminal raw.

The "interpreters" are small executable scripts in tmp_path that answer the probe badly on purpose.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commdiag.environment import pyprobe
from commdiag.errors import CommdiagError
from commdiag.environment.pyprobe import probe

from conftest import run_cli

MARK = pyprobe._MARK


def script(tmp_path: Path, body: str, name: str = "python3") -> str:
    p = tmp_path / name
    p.write_text(body)
    p.chmod(0o755)
    return str(p)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie is dead, only not reaped
    except OSError:
        return True


@pytest.mark.parametrize("reply, words", [
    (f"{MARK}{{not json", "probe failed"),
    (f"{MARK}[1, 2]", "probe failed"),
    (f"{MARK}{{}}", "probe reply is not what"),
    (f'{MARK}{{"executable": 5}}', "probe reply is not what"),
    ("", r"probe failed \(exit 0\): no output"),
])
def test_bad_replies_are_one_error(tmp_path, reply, words):
    exe = script(tmp_path, f"#!/bin/sh\nprintf '%s\\n' '{reply}'\n")
    with pytest.raises(CommdiagError, match=words) as e:
        probe(exe, cross_check=False)
    assert len(str(e.value)) < 500


def test_a_reply_with_terminal_escapes_in_a_path_is_refused(tmp_path):
    real = subprocess.run([sys.executable, "-S", "-c", pyprobe._PROBE], capture_output=True, text=True,
                          timeout=60).stdout
    line = next(l for l in real.splitlines() if l.startswith(MARK))
    data = json.loads(line[len(MARK):])
    data["sys_path"].append("/opt/\x1b]0;pwned\x07")
    (tmp_path / "reply.txt").write_text(MARK + json.dumps(data) + "\n")
    exe = script(tmp_path, f"#!/bin/sh\ncat {tmp_path / 'reply.txt'}\n")
    with pytest.raises(CommdiagError, match="control characters in sys_path"):
        probe(exe, cross_check=False)


def test_no_shebang_and_missing_interpreter_are_named(tmp_path):
    with pytest.raises(CommdiagError, match="no #! line"):
        probe(script(tmp_path, "just text\n", "noshebang"), cross_check=False)
    with pytest.raises(CommdiagError, match="#! line"):
        probe(script(tmp_path, "#!/nonexistent/python\n", "missing"), cross_check=False)
    with pytest.raises(CommdiagError, match="no such interpreter"):
        probe(str(tmp_path / "absent"), cross_check=False)


def test_a_flood_of_output_is_capped(tmp_path):
    exe = script(tmp_path, "#!/bin/sh\nhead -c 50000000 /dev/zero | tr '\\0' x\necho\necho tail-line >&2\nexit 3\n")
    t0 = time.monotonic()
    with pytest.raises(CommdiagError) as e:
        probe(exe, cross_check=False)
    assert time.monotonic() - t0 < 20 and len(str(e.value)) < 500 and "exit 3" in str(e.value)


def test_no_child_outlives_a_hung_probe(tmp_path, monkeypatch):
    monkeypatch.setattr(pyprobe, "PROBE_TIMEOUT_S", 2.0)
    pidfile = tmp_path / "child.pid"
    exe = script(tmp_path, f"#!/bin/sh\nsleep 300 &\necho $! > {pidfile}\nexec sleep 300\n")
    with pytest.raises(CommdiagError, match="did not answer within 2s"):
        probe(exe, cross_check=False)
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child)


def test_no_child_outlives_a_probe_that_answered(tmp_path):
    pidfile = tmp_path / "child.pid"
    exe = script(tmp_path, f"#!/bin/sh\nsleep 300 &\necho $! > {pidfile}\necho nothing useful\n")
    with pytest.raises(CommdiagError):
        probe(exe, cross_check=False)
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child)


def test_hostile_stderr_never_reaches_the_terminal_raw(tmp_path):
    exe = script(tmp_path, "#!/bin/sh\nprintf '\\033]0;pwned\\007\\033[2J\\233evil\\n' >&2\nexit 1\n")
    r = run_cli("install-hook", "--python", exe, "--set", "NCCL_PROTO=LL", "--dry-run", timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "\x1b" not in r.stderr + r.stdout and "\x9b" not in r.stderr + r.stdout
    assert "\\x1b]0;pwned" in r.stderr
