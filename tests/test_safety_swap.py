"""Uninstall through a directory that was swapped since the install.

Staged under ``--root``: a "system" interpreter (a venv at ROOT/usr, whose site-packages plays the
system's dist-packages) with commdiag's hook installed, and a user's venv with bytecode of its own
planted where commdiag's module's goes.  After the install into the user's venv, its
site-packages is replaced by a link to the system's (or by another directory).  Uninstall must
then write and remove nothing there, leave the system install and its record intact, and say what
it refused (exit 1).  Bytecode is never recorded or put back.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, one_message, words
from pythons import plain_python

SETS = ["--set", "NCCL_PROTO=LL"]


def cli(*args, timeout=180):
    e = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), e.get("PYTHONPATH", "")) if p)
    e.pop("NCCL_PROTO", None)
    return subprocess.run([sys.executable, "-m", "commdiag.cli", "install-hook", *map(str, args)],
                          capture_output=True, text=True, env=e, timeout=timeout)


def tree(folder: Path) -> dict:
    out = {}
    for dirpath, dirs, files in os.walk(folder):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            data = open(p, "rb").read() if stat.S_ISREG(st.st_mode) else None
            out[p] = (stat.S_IFMT(st.st_mode), st.st_uid, data and hashlib.sha256(data).hexdigest())
    return out


_venvs: dict[str, Path] = {}


def venv(dest: Path, tmp_path_factory) -> Path:
    """A throwaway venv (copied from a template: making one is the slow part); its site-packages."""
    if "t" not in _venvs:
        t = tmp_path_factory.mktemp("venv-template") / "v"
        subprocess.run([plain_python(), "-m", "venv", "--without-pip", str(t)], check=True, timeout=120)
        _venvs["t"] = t
    shutil.copytree(_venvs["t"], dest, symlinks=True)
    (sp,) = dest.glob("lib/python3.*/site-packages")
    return sp


@pytest.fixture
def staged(tmp_path, tmp_path_factory):
    root = tmp_path / "root"
    system_sp = venv(root / "usr", tmp_path_factory)
    cp = cli("--root", root, "--python", root / "usr/bin/python", *SETS)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([str(root / "usr/bin/python"), "-c", "pass"], check=True, env=env, timeout=60)
    assert list((system_sp / "__pycache__").glob("commdiag_nccl_hook.*.pyc"))  # root's own bytecode
    user_sp = venv(root / "home/user/venv", tmp_path_factory)
    cache = user_sp / "__pycache__"
    cache.mkdir()
    tag = sys.implementation.cache_tag
    (cache / f"commdiag_nccl_hook.{tag}.pyc").write_bytes(b"the user's own bytecode")
    return root, system_sp, user_sp


def manifest(root: Path) -> dict:
    return json.loads((root / "var/lib/commdiag/installs.json").read_text())


def test_uninstall_through_a_site_packages_swapped_for_a_link(staged):
    root, system_sp, user_sp = staged
    user_py = root / "home/user/venv/bin/python"
    cp = cli("--root", root, "--python", user_py, *SETS)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert not list((user_sp / "__pycache__").glob("*.pyc"))  # stale for commdiag's module: removed
    system_before = tree(system_sp)
    records_before = [r["key"] for r in manifest(root)["installs"]]
    # the user swaps their site-packages for a link to the system's
    user_sp.rename(user_sp.with_name("site-packages.away"))
    user_sp.symlink_to(system_sp)
    cp = cli("--uninstall", "--root", root, "--python", user_py)
    assert tree(system_sp) == system_before  # nothing written or removed there
    assert [r["key"] for r in manifest(root)["installs"]] == records_before  # both records kept
    assert cp.returncode == 1, cp.stdout + cp.stderr
    said = " ".join(cp.stdout.split())  # lines are wrapped at 100 columns
    assert f"refused: {user_sp / 'commdiag-nccl.pth'}: not changed: its directory {user_sp} is a symbolic link" \
        in said, cp.stdout
    assert all(len(line) <= 100 or " " not in line.strip() for line in cp.stdout.splitlines()
               if line.startswith("  refused") or line.startswith("    ")), cp.stdout
    assert "__pycache__" not in json.dumps(manifest(root))  # bytecode is never recorded
    status = cli("--status", "--root", root, "--python", root / "usr/bin/python")
    assert words(status.stdout).count(": as installed") == 2, status.stdout
    # the user puts their directory back: the uninstall completes
    user_sp.unlink()
    user_sp.with_name("site-packages.away").rename(user_sp)
    cp = cli("--uninstall", "--root", root, "--python", user_py)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert not (user_sp / "commdiag-nccl.pth").exists() and tree(system_sp) == system_before


def test_uninstall_into_another_directory_of_the_same_name_is_refused(staged):
    root, system_sp, user_sp = staged
    user_py = root / "home/user/venv/bin/python"
    assert cli("--root", root, "--python", user_py, *SETS).returncode == 0
    user_sp.rename(user_sp.with_name("site-packages.away"))
    shutil.copytree(system_sp, user_sp, symlinks=True)  # the same names, another directory
    copy_before = tree(user_sp)
    cp = cli("--uninstall", "--root", root, "--python", user_py)
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert "is another directory than the one commdiag installed into" in " ".join(cp.stdout.split()), cp.stdout
    assert tree(user_sp) == copy_before


def _as_version_1(root: Path) -> None:
    """Rewrite the manifest as commdiag's first format wrote it: originals inline, no identities."""
    path = root / "var/lib/commdiag/installs.json"
    m = json.loads(path.read_text())
    m["version"] = 1
    for r in m["installs"]:
        for f in r["files"]:
            f.pop("dir_id", None)
            f.pop("import_dir_id", None)
            b = f["before"]
            if b["kind"] == "file" and "data_b64" not in b:
                b["data_b64"] = base64.b64encode((root / "var/lib/commdiag/saved" / b["sha256"]).read_bytes()).decode()
    path.write_text(json.dumps(m))


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_version_1_manifest_uninstalls_only_where_no_one_else_could_swap(staged):
    root, system_sp, user_sp = staged
    user_py = root / "home/user/venv/bin/python"
    assert cli("--root", root, "--python", user_py, *SETS).returncode == 0
    _as_version_1(root)
    os.chown(root / "home/user", 65534, 65534)  # a directory above the user's venv is theirs
    cp = cli("--uninstall", "--root", root, "--python", user_py)
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert "recorded by an older commdiag without the identity" in " ".join(cp.stdout.split()), cp.stdout
    assert (user_sp / "commdiag-nccl.pth").exists()
    os.chown(root / "home/user", 0, 0)
    cp = cli("--uninstall", "--root", root, "--python", user_py)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert not (user_sp / "commdiag-nccl.pth").exists()
    assert manifest(root)["version"] == 2  # rewritten in the current format
    cp = cli("--uninstall", "--root", root, "--all")
    assert cp.returncode == 0 and not (root / "var/lib/commdiag").exists(), cp.stdout + cp.stderr
