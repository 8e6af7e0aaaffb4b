"""Uninstall trusts nothing it reads back.

Installs go into a staged root (``--root``, nccl.conf and a systemd drop-in: no interpreter
start needed); the manifest is then damaged the ways seen in the adversarial pass.  Every case
ends in one line on stderr, exit 2, no traceback, and nothing written outside the root.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from commdiag.install import hooktext

from conftest import REPO, one_message, words as words_

SETS = ["--set", "NCCL_PROTO=LL", "--set", "NCCL_ALGO=Ring"]


def cli(*args, timeout=60):
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    for n in ("NCCL_PROTO", "NCCL_ALGO"):
        env.pop(n, None)
    return subprocess.run([sys.executable, "-m", "commdiag.cli", "install-hook", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=timeout)


def _files(folder) -> dict:
    out = {}
    for dirpath, dirs, files in os.walk(folder):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            out[p] = (stat.S_IFMT(st.st_mode), open(p, "rb").read() if stat.S_ISREG(st.st_mode) else None)
    return out


@pytest.fixture
def staged(tmp_path):
    """A root with an nccl.conf of the user's and commdiag's block plus a drop-in installed."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/nccl.conf").write_text("NCCL_DEBUG=WARN\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "nccl.conf").write_text("precious\n")
    cp = cli("--method", "none", "--root", root, *SETS, "--nccl-conf", "--systemd", "sglang")
    assert cp.returncode == 0, cp.stderr
    return root, root / "var/lib/commdiag/installs.json", outside


def _edit(manifest, change):
    m = json.loads(manifest.read_text())
    change(m)
    manifest.write_text(json.dumps(m))


def _refused(cp, words=""):
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert "Traceback" not in cp.stderr, cp.stderr
    assert words_(words) in one_message(cp.stderr), cp.stderr


def _set_path(path):
    def change(m):
        m["installs"][0]["files"][0]["path"] = str(path)
    return change


@pytest.mark.parametrize("damage, words", [
    (lambda o, r: _set_path(o / "nccl.conf"), "outside --root"),
    (lambda o, r: _set_path(r / "etc/passwd"), "not a file commdiag writes"),
    (lambda o, r: _set_path(str(r) + "/etc/../../outside/nccl.conf"), "not a normalized path"),
    (lambda o, r: _set_path("etc/nccl.conf"), "not an absolute path"),
    (lambda o, r: lambda m: m["installs"][0].update(dirs_created=["/"]), "not a directory above"),
    (lambda o, r: lambda m: m.update(state_dirs_created=[str(o)]), "state directory"),
    (lambda o, r: lambda m: m["installs"][0]["files"][0].update(role="evil"), "owned, block or cache"),
    (lambda o, r: lambda m: m["installs"][0]["files"][0].update(role="cache", module="nccl"), "in the cache role"),
    (lambda o, r: lambda m: m["installs"][0]["files"][0].update(before="x"), "file state"),
    (lambda o, r: lambda m: m["installs"][0]["files"][0]["before"].update(kind="file", data_b64="!!"),
     "file state"),
    (lambda o, r: lambda m: m["installs"][0].update(files={}), "is not a list"),
    (lambda o, r: lambda m: m.update(installs=[5]), "not an install record"),
    (lambda o, r: lambda m: m.update(installs="x"), "is not a list"),
    (lambda o, r: lambda m: m.update(version="1"), "is not a manifest version"),
    (lambda o, r: lambda m: m.update(version=True), "is not a manifest version"),
    (lambda o, r: lambda m: m.update(version=3), "newer than this commdiag"),
    (lambda o, r: lambda m: m["installs"][0]["files"][0].update(dir_id=[1]), "not a directory identity"),
    (lambda o, r: lambda m: m["installs"][0]["files"][0]["before"].update(kind="file", sha256="x"),
     "file state"),
    (lambda o, r: lambda m: m.pop("format"), "is not 'commdiag-hook-manifest'"),
])
def test_a_tampered_manifest_is_refused_and_nothing_is_written(staged, damage, words):
    root, manifest, outside = staged
    _edit(manifest, damage(outside, root))
    before = _files(root.parent)
    for args in (("--uninstall", "--all", "--root", root),
                 ("--method", "none", "--root", root, *SETS, "--nccl-conf"),
                 ("--status", "--root", root)):
        _refused(cli(*args), words)
    assert _files(root.parent) == before


@pytest.mark.parametrize("content", [b"[]", b"", b"\xff\xfe", b"{" * 100_000])
def test_a_manifest_that_is_not_json_is_one_error(staged, content):
    root, manifest, _ = staged
    manifest.write_bytes(content)
    _refused(cli("--uninstall", "--all", "--root", root))


def test_a_fifo_manifest_does_not_hang(staged):
    root, manifest, _ = staged
    manifest.unlink()
    os.mkfifo(manifest)
    for args in (("--uninstall", "--all", "--root", root), ("--status", "--root", root),
                 ("--method", "none", "--root", root, *SETS, "--nccl-conf")):
        _refused(cli(*args, timeout=30), "not a regular file")


def test_a_symlinked_manifest_is_refused(staged, tmp_path):
    root, manifest, _ = staged
    real = tmp_path / "elsewhere.json"
    real.write_bytes(manifest.read_bytes())
    manifest.unlink()
    manifest.symlink_to(real)
    _refused(cli("--uninstall", "--all", "--root", root), "symbolic link")


def test_a_manifest_writable_by_others_is_refused(staged):
    root, manifest, _ = staged
    manifest.chmod(0o666)
    _refused(cli("--uninstall", "--all", "--root", root), "writable by every user")
    manifest.chmod(0o644)
    assert cli("--uninstall", "--all", "--root", root).returncode == 0


# --------------------------------------------------------------------------- the user's own marker line

def test_uninstall_keeps_user_lines_after_a_users_own_marker(tmp_path):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    conf = root / "etc/nccl.conf"
    user = f"NCCL_DEBUG=WARN\n{hooktext.NCCL_BEGIN}\nNCCL_SOCKET_IFNAME=eth0\n# the user's own notes\n"
    conf.write_text(user)
    assert cli("--method", "none", "--root", root, *SETS, "--nccl-conf").returncode == 0
    conf.write_text(conf.read_text() + "NCCL_IB_DISABLE=1\n")  # edited since install: only the block goes
    cp = cli("--uninstall", "--method", "none", "--root", root, "--nccl-conf")
    assert cp.returncode == 0, cp.stderr
    assert conf.read_text() == user + "NCCL_IB_DISABLE=1\n"


@pytest.mark.parametrize("begin, end", [(hooktext.BEGIN, hooktext.END), (hooktext.NCCL_BEGIN, hooktext.NCCL_END)])
def test_block_removal_never_reaches_above_commdiags_own_begin(begin, end):
    user = f"import os\n{begin}\nuser_line = 1\n{begin} (a mention)\nother = 2\n"
    block = f"{begin}\n# commdiag\n{end}\n"
    text = hooktext.add_block(user, block)
    assert text == user + block
    assert hooktext.strip_blocks(text, begin, end) == user
    assert hooktext.strip_any_blocks(text) == user
