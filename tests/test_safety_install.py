"""install-hook with a venv inside --root : the venv is a real interpreter, so
its real sitecustomize is what counts, verification runs, and a file a block could never run in is
refused before anything is written.  Venvs are throwaway, inside tmp_path."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, one_message, words
from pythons import plain_python

DEBIAN_PY = "/usr/bin/python3.11"
DEBIAN_SC = "/usr/lib/python3.11/sitecustomize.py"


def cli(*args):
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("NCCL_PROTO", None)
    return subprocess.run([sys.executable, "-m", "commdiag.cli", "install-hook", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=180)


def venv(python: str, dest: Path) -> Path:
    subprocess.run([python, "-m", "venv", "--without-pip", str(dest)], check=True, timeout=120)
    (sp,) = dest.glob("lib/python3.*/site-packages")
    return sp


def tree(root: Path) -> dict:
    return {str(p): (p.is_symlink(), hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def test_a_sitecustomize_that_does_not_compile_is_refused_before_writing(tmp_path):
    root = tmp_path / "root"
    sp = venv(plain_python(), root / "venv")
    (sp / "sitecustomize.py").write_text("x = (\n")
    before = tree(root)
    cp = cli("--root", root, "--python", root / "venv/bin/python", "--method", "sitecustomize",
             "--set", "NCCL_PROTO=LL")
    assert cp.returncode == 2 and "does not compile (line 1)" in words(cp.stderr) and "Traceback" not in words(cp.stderr)
    assert tree(root) == before


def test_a_venv_inside_root_is_verified_for_real(tmp_path):
    root = tmp_path / "root"
    sp = venv(plain_python(), root / "venv")
    (sp / "sitecustomize.py").write_text("import os\n")
    cp = cli("--root", root, "--python", root / "venv/bin/python", "--method", "sitecustomize",
             "--set", "NCCL_PROTO=LL")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "symlink" not in words(cp.stdout) and "not started" not in words(cp.stdout)
    assert "verify: OK: a fresh" in words(cp.stdout)
    assert cli("--uninstall", "--root", root, "--python", root / "venv/bin/python").returncode == 0
    assert (sp / "sitecustomize.py").read_text() == "import os\n"


@pytest.mark.skipif(not (os.path.islink(DEBIAN_SC) and os.path.exists(DEBIAN_PY)),
                    reason="needs Debian's python3.11 with its symlinked sitecustomize.py")
def test_debian_venv_inside_root_never_gets_a_shadowed_sitecustomize(tmp_path):
    root = tmp_path / "root"
    sp = venv(DEBIAN_PY, root / "venv")
    (sp / "sitecustomize.py").write_text("import os\n")
    cp = cli("--root", root, "--python", root / "venv/bin/python", "--method", "sitecustomize",
             "--set", "NCCL_PROTO=LL")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "is shadowed by /usr/lib/python3.11/sitecustomize.py" in words(cp.stdout)
    assert (sp / "commdiag-nccl.pth").exists() and (sp / "sitecustomize.py").read_text() == "import os\n"
    assert "verify: OK: a fresh" in words(cp.stdout)


def test_uninstall_leaves_no_pycache_that_python_made_for_the_hook(tmp_path):
    root = tmp_path / "root"
    sp = venv(plain_python(), root / "venv")
    py = root / "venv/bin/python"
    before = tree(root)
    assert cli("--root", root, "--python", py, "--set", "NCCL_PROTO=LL").returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([str(py), "-c", "pass"], check=True, env=env, timeout=60)  # compiles the hook module
    assert list((sp / "__pycache__").glob("commdiag_nccl_hook.*.pyc"))
    cp = cli("--uninstall", "--root", root, "--python", py)
    assert cp.returncode == 0, cp.stderr
    assert tree(root) == before and not (sp / "__pycache__").exists()


def test_status_for_an_interpreter_without_an_install_says_so(tmp_path):
    root = tmp_path / "root"
    venv(plain_python(), root / "a")
    venv(plain_python(), root / "b")
    assert cli("--root", root, "--python", root / "a/bin/python", "--set", "NCCL_PROTO=LL").returncode == 0
    cp = cli("--status", "--root", root, "--python", root / "b/bin/python")
    assert cp.returncode == 1
    assert words(cp.stdout).replace(' \\ ', ' ').startswith(f"python {root / 'b/bin/python'}: nothing installed for this interpreter")
    assert str(root / "a/bin/python") not in words(cp.stdout)


def test_a_world_writable_ancestor_of_site_packages_is_refused(tmp_path):
    root = tmp_path / "root"
    opt = root / "opt"
    opt.mkdir(parents=True)
    venv(plain_python(), opt / "venv")
    opt.chmod(0o777)
    before = tree(root)
    cp = cli("--root", root, "--python", opt / "venv/bin/python", "--set", "NCCL_PROTO=LL")
    # as root the interpreter below it is not even started (trust.py); otherwise the plan refuses
    assert cp.returncode == 2 and ("/opt: directory is world-writable (above" in words(cp.stderr)
                                   or f"{opt}: world-writable (mode 0777)" in words(cp.stderr)), cp.stderr
    assert tree(root) == before


def test_a_fifo_where_the_hook_goes_is_named_plainly(tmp_path):
    root = tmp_path / "root"
    sp = venv(plain_python(), root / "venv")
    os.mkfifo(sp / "commdiag_nccl_hook.py")  # (a FIFO .pth would hang every start of Python itself)
    cp = cli("--root", root, "--python", root / "venv/bin/python", "--set", "NCCL_PROTO=LL")
    assert cp.returncode == 2 and "is a device, FIFO or socket, not a regular file" in words(cp.stderr), cp.stderr
