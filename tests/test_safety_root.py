"""install-hook's smaller root-side hazards: a value that becomes code under a legacy coding
declaration, who can read the saved originals, the compiler that --tuner runs, the state lock.

Installs go into a staged root (``--root``) and throwaway venvs inside it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from commdiag.errors import CommdiagError
from commdiag.install import hookplan, hooktext

from conftest import REPO, one_message, words
from pythons import plain_python


def cli(*args, env=None, timeout=180):
    e = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), e.get("PYTHONPATH", "")) if p)
    for n in ("NCCL_PROTO", "FOO"):
        e.pop(n, None)
    return subprocess.run([sys.executable, "-m", "commdiag.cli", "install-hook", *map(str, args)],
                          capture_output=True, text=True, env=e, timeout=timeout)


def venv(dest: Path) -> Path:
    subprocess.run([plain_python(), "-m", "venv", "--without-pip", str(dest)], check=True, timeout=120)
    (sp,) = dest.glob("lib/python3.*/site-packages")
    return sp


# --------------------------------------------------------------------------- values under a coding declaration

def crafted(marker: Path) -> str:
    # U+00C1 is C3 81 in UTF-8; under cp932, 81 is a lead byte that takes repr's backslash before
    # the quote as its second byte: the quote then ends the string and the rest is code.
    return "\u00c1',0:__import__(\"os\").system(\"touch " + str(marker) + "\")}#"


def test_a_value_stays_a_value_in_a_cp932_sitecustomize(tmp_path):
    root = tmp_path / "root"
    sp = venv(root / "venv")
    own = "# -*- coding: cp932 -*-\nimport os\n"
    (sp / "sitecustomize.py").write_text(own)
    marker = tmp_path / "PWNED"
    value = crafted(marker)
    py = root / "venv/bin/python"
    cp = cli("--root", root, "--python", py, "--method", "sitecustomize", "--set", f"NCCL_SOCKET_IFNAME={value}")
    assert cp.returncode == 0 and "verify: OK" in words(cp.stdout), cp.stdout + cp.stderr
    seen = subprocess.run([str(py), "-c", "import os; print(ascii(os.environ.get('NCCL_SOCKET_IFNAME')))"],
                          capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"]})
    assert seen.stdout.strip() == ascii(value), seen.stdout + seen.stderr
    assert not marker.exists()
    assert (sp / "sitecustomize.py").read_bytes().isascii()
    assert cli("--uninstall", "--root", root, "--python", py).returncode == 0
    assert (sp / "sitecustomize.py").read_text() == own


def test_the_hook_block_is_ascii_and_reads_back():
    block = hooktext.hook_block({"FOO": "\u00e9\u8868'\"\\"}, override=False, meta={}, prefix="/opt/v\u00e9nv")
    assert block.isascii()
    assert hooktext.settings_in(block) == {"FOO": "\u00e9\u8868'\"\\"}


def test_a_block_that_would_read_differently_is_refused(tmp_path):
    # the second line of defence: the whole file is decoded as Python will, and the block must be there
    value = crafted(tmp_path / "x")
    block = "SETTINGS = {'FOO': %r}\n" % value  # what repr() used to write
    data = ("# -*- coding: cp932 -*-\n" + block).encode()
    with pytest.raises(CommdiagError, match=r"under its coding declaration \(cp932\)"):
        hookplan.check_compiles(data, "sitecustomize.py", block)
    with pytest.raises(CommdiagError, match="would not compile with commdiag's block"):
        hookplan.check_compiles(b"# -*- coding: cp932 -*-\nx = '\x81'\n", "sitecustomize.py", "")


# --------------------------------------------------------------------------- the compiler --tuner runs as root

RULES = (b"# commdiag-tuner-rules 1\n"
         b"coll=allreduce min_bytes=0 max_bytes=2097152 nranks=2 nnodes=1 algo=ring proto=ll\n")


def _spy(folder: Path, name: str, real: str, marker: Path) -> Path:
    p = folder / name
    p.write_text(f'#!/bin/sh\necho {name} >> {marker}\nexec {real} "$@"\n')
    p.chmod(0o755)
    return p


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/cc") or not os.path.exists("/usr/bin/as"),
                    reason="as root, with the system compiler in /usr/bin")
def test_as_root_tuner_compiles_with_the_system_compiler_only(tmp_path):
    user = tmp_path / "user-bin"  # what sudo -E brings along: the user's CC, PATH and compiler variables
    user.mkdir()
    marker = tmp_path / "RAN"
    cc = _spy(user, "cc", "/usr/bin/cc", marker)
    _spy(user, "as", "/usr/bin/as", marker)
    rules = tmp_path / "rules.txt"
    rules.write_bytes(RULES)
    env = {"CC": str(cc), "PATH": f"{user}:{os.environ['PATH']}", "COMPILER_PATH": str(user)}
    args = ("--method", "none", "--nccl-conf", "--root", tmp_path / "root", "--tuner", rules)
    cp = cli(*args, env=env)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "compiled here by /usr/bin/cc" in words(cp.stdout) and not marker.exists()
    # --cc is the way to choose another one; the compiler's environment stays clean
    cp = cli(*args, "--cc", cc, env=env)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert marker.read_text() == "cc\n"


# --------------------------------------------------------------------------- who can read the saved originals

def test_the_original_of_a_replaced_file_is_readable_by_its_installer_only(tmp_path):
    root = tmp_path / "root"
    home = root / "root"
    home.mkdir(parents=True)
    conf = home / ".nccl.conf"
    secret = b"NCCL_IB_HCA=mlx5\n# token: s3cr3t-t0ken\n"
    conf.write_bytes(secret)
    conf.chmod(0o600)
    cp = cli("--method", "none", "--nccl-conf", "user", "--root", root, "--set", "NCCL_PROTO=LL")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    state = root / "var/lib/commdiag"
    manifest = state / "installs.json"
    befores = [f["before"] for r in json.loads(manifest.read_text())["installs"] for f in r["files"]]
    assert b"s3cr3t" not in manifest.read_bytes() and not any("data_b64" in b for b in befores)
    assert stat.S_IMODE(manifest.stat().st_mode) == 0o644  # readable: --status needs no root
    holders = [p for p in state.rglob("*") if p.is_file() and secret in p.read_bytes()]
    assert holders and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in holders)
    assert all(stat.S_IMODE(p.parent.stat().st_mode) == 0o700 for p in holders)
    assert json.loads(manifest.read_text())["version"] == 2
    cp = cli("--uninstall", "--method", "none", "--nccl-conf", "user", "--root", root)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert conf.read_bytes() == secret and stat.S_IMODE(conf.stat().st_mode) == 0o600
    assert not state.exists()


# --------------------------------------------------------------------------- the state lock

def test_a_symlinked_lock_is_refused_and_not_followed(tmp_path):
    root = tmp_path / "root"
    state = root / "var/lib/commdiag"
    state.mkdir(parents=True)
    victim = tmp_path / "victim"
    (state / "lock").symlink_to(victim)
    cp = cli("--method", "none", "--nccl-conf", "--root", root, "--set", "NCCL_PROTO=LL")
    assert cp.returncode == 2 and "lock: is a symbolic link" in words(cp.stderr), cp.stdout + cp.stderr
    assert not victim.exists() and not (root / "etc/nccl.conf").exists()
    (state / "lock").unlink()
    os.mkfifo(state / "lock")
    cp = cli("--method", "none", "--nccl-conf", "--root", root, "--set", "NCCL_PROTO=LL", timeout=60)
    assert cp.returncode == 2 and "lock: is not a regular file" in words(cp.stderr), cp.stdout + cp.stderr


def test_without_its_saved_copy_an_original_is_neither_lost_nor_made_up():
    def target(proto):
        block = hooktext.hook_block({"NCCL_PROTO": proto}, override=False, meta={})
        return hookplan.Target("python:/p", "python", "sitecustomize",
                               (hookplan.Desired("/r/sc.py", "/r/sc.py", hookplan.BLOCK, block),), {})

    theirs = hookplan.FileState(hookplan.FILE, b"user = 1\n", 0o644)
    plan = hookplan.plan_install([target("LL")], {"/r/sc.py": theirs}, {}, force=False, meta={})
    record = json.loads(json.dumps(plan.records[0]))
    del record["files"][0]["before"]["data_b64"]  # STATE/saved/SHA is gone (or unreadable)
    now = plan.changes[0].after
    again = hookplan.plan_install([target("Simple")], {"/r/sc.py": now}, {"python:/p": record}, force=False,
                                  meta={})
    assert again.changes[0].after.data.startswith(b"user = 1\n")  # the file's own lines are kept
    undo = hookplan.plan_uninstall(list(again.records), {"/r/sc.py": again.changes[0].after}, force=False)
    assert undo.refused and "saved copy of its original" in undo.refused[0] and not undo.changes
