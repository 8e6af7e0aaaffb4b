"""As root, an interpreter whose files another user can change is never started as root.

Venvs made from Debian's /usr/bin/python3.11 (which ``nobody`` can run) are staged in a fresh
0755 folder under /tmp (pytest's own tmp folder is 0700 root: ``nobody`` could not reach a venv
there) and chowned to ``nobody``.  Each holds a .pth whose import line appends the effective uid
of every interpreter start that reads it to a log.  install-hook (install, --dry-run, --status),
detect and the verification must never leave a ``0`` there: refused without --allow-user-owned,
started as ``nobody`` with it, and root writes only inside the venv's own prefix.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from commdiag.environment import pyprobe

from conftest import REPO, one_message, words

DEBIAN_PY = "/usr/bin/python3.11"
NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(DEBIAN_PY),
                                reason="needs root (to chown to nobody) and Debian's python3.11")


def cli(*args, command="install-hook", timeout=180):
    e = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), e.get("PYTHONPATH", "")) if p)
    e.pop("NCCL_PROTO", None)
    return subprocess.run([sys.executable, "-m", "commdiag.cli", command, *map(str, args)],
                          capture_output=True, text=True, env=e, timeout=timeout)


def chown_tree(top: Path, uid: int) -> None:
    for dirpath, dirs, files in os.walk(top):
        for n in dirs + files:
            os.lchown(os.path.join(dirpath, n), uid, uid)
    os.lchown(top, uid, uid)


def tree(folder: Path) -> dict:
    out = {}
    for dirpath, dirs, files in os.walk(folder):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            out[p] = (st.st_mode, st.st_uid, open(p, "rb").read() if os.path.isfile(p) and not os.path.islink(p)
                      else None)
    return out


@pytest.fixture(scope="module")
def template():
    d = Path(tempfile.mkdtemp(prefix="commdiag-venv-", dir="/tmp"))
    subprocess.run([DEBIAN_PY, "-m", "venv", "--without-pip", str(d / "v")], check=True, timeout=120)
    yield d / "v"
    shutil.rmtree(d)


@pytest.fixture
def area(template):
    """ROOT (for --root) with a venv at ROOT/home/u/venv carrying the uid-logging .pth; the log."""
    d = Path(tempfile.mkdtemp(prefix="commdiag-owner-", dir="/tmp"))
    d.chmod(0o755)
    log = d / "uids"
    log.touch()
    log.chmod(0o666)
    root = d / "root"
    venv = root / "home/u/venv"
    shutil.copytree(template, venv, symlinks=True)
    (sp,) = venv.glob("lib/python3.*/site-packages")
    (sp / "uid-log.pth").write_text(f"import os; open({str(log)!r}, 'a').write('%d\\n' % os.geteuid())\n")
    yield root, venv, sp, log
    shutil.rmtree(d)


def uids(log: Path) -> set[str]:
    return set(log.read_text().split())


def test_a_venv_owned_by_another_user_is_refused_then_run_as_that_user(area):
    root, venv, sp, log = area
    chown_tree(root / "home/u", NOBODY)
    py = venv / "bin/python"
    before = tree(root)
    for extra in ((), ("--dry-run",), ("--status",)):
        cp = cli("--root", root, "--python", py, "--set", "NCCL_PROTO=LL", *extra)
        assert cp.returncode == 2, cp.stdout + cp.stderr
        assert f"{root}/home/u: owned by uid {NOBODY} (nobody)" in words(cp.stderr) and "--allow-user-owned" in words(cp.stderr)
        assert one_message(cp.stderr) and "Traceback" not in words(cp.stderr)
    assert tree(root) == before and uids(log) == set()  # nothing of the venv ran at all
    cp = cli("--root", root, "--python", py, "--set", "NCCL_PROTO=LL", "--allow-user-owned")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert f"verify: OK: a fresh {py} (started as uid {NOBODY})" in words(cp.stdout)
    assert uids(log) == {str(NOBODY)}  # the verification (and its spawn child) ran as nobody only
    cp = cli("--status", "--root", root, "--python", py, "--allow-user-owned")
    assert "loads at start: yes" in words(cp.stdout), cp.stdout + cp.stderr
    cp = cli("--python", py, "--json", command="detect")  # read-only: probed as the owner, always
    assert cp.returncode in (0, 1) and json.loads(cp.stdout), cp.stderr
    cp = cli("--uninstall", "--root", root, "--python", py)  # no start needed: by the recorded target
    assert cp.returncode == 0 and not (sp / "commdiag-nccl.pth").exists(), cp.stdout + cp.stderr
    assert uids(log) == {str(NOBODY)}


def test_a_pth_file_of_another_user_in_a_root_owned_venv(area):
    root, venv, sp, log = area
    os.chown(sp / "uid-log.pth", NOBODY, NOBODY)
    py = venv / "bin/python"
    cp = cli("--root", root, "--python", py, "--set", "NCCL_PROTO=LL")
    assert cp.returncode == 2 and f"{sp / 'uid-log.pth'}: owned by uid {NOBODY}" in words(cp.stderr), cp.stderr
    assert uids(log) == set()  # the probe named the file without running it
    cp = cli("--root", root, "--python", py, "--set", "NCCL_PROTO=LL", "--allow-user-owned")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert uids(log) == {str(NOBODY)}


def test_a_group_writable_venv_is_refused(area):
    root, venv, sp, log = area
    os.chown(venv, 0, NOBODY)
    venv.chmod(0o775)
    cp = cli("--root", root, "--python", venv / "bin/python", "--set", "NCCL_PROTO=LL", "--dry-run")
    assert cp.returncode == 2 and f"{venv}: writable by group {NOBODY}" in words(cp.stderr), cp.stderr
    assert uids(log) == set()


def test_root_writes_only_inside_the_user_venvs_prefix(area):
    root, venv, sp, log = area
    system = root / "usr/lib/python3/dist-packages"  # root's, outside the venv
    system.mkdir(parents=True)
    away = sp.with_name("site-packages.real")
    sp.rename(away)
    sp.symlink_to(os.path.relpath(system, sp.parent))  # the user points their site-packages at the system's
    chown_tree(root / "home/u", NOBODY)
    before = tree(system)
    cp = cli("--root", root, "--python", venv / "bin/python", "--set", "NCCL_PROTO=LL", "--allow-user-owned")
    assert cp.returncode == 2 and f"resolves to {system}/" in words(cp.stderr) and "outside" in words(cp.stderr), \
        cp.stdout + cp.stderr
    assert tree(system) == before


def test_a_forged_probe_reply_cannot_choose_where_root_writes(area):
    root, venv, sp, log = area
    system = root / "usr/lib/python3/dist-packages"
    system.mkdir(parents=True)
    reply = subprocess.run([DEBIAN_PY, "-S", "-c", pyprobe._PROBE], capture_output=True, text=True,
                           timeout=60).stdout.splitlines()[-1]
    data = json.loads(reply[len(pyprobe._MARK):])
    data.update(prefix=str(root / "usr"), base_prefix=str(root / "usr"), site_packages=[str(system)],
                sys_path=[str(system)], pth_files=[], pth_exec=[], sitecustomize=None, all_sitecustomize=[])
    (venv / "reply.txt").write_text(pyprobe._MARK + json.dumps(data) + "\n")
    fake = venv / "bin/python"
    fake.unlink()
    fake.write_text(f"#!/bin/sh\ncat {venv / 'reply.txt'}\n")
    fake.chmod(0o755)
    chown_tree(root / "home/u", NOBODY)
    before = tree(root / "usr")
    cp = cli("--root", root, "--python", fake, "--set", "NCCL_PROTO=LL", "--allow-user-owned")
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert f"its probe says its prefix is {root / 'usr'}, which is not where the interpreter lives" in words(cp.stderr)
    assert tree(root / "usr") == before
