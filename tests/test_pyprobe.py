"""pyprobe on real interpreters and real venvs: what loads, what is shadowed, and that probing runs no hook."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from commdiag.errors import CommdiagError
from commdiag.environment.pyprobe import probe

from pythons import plain_python

DEBIAN_PY = "/usr/bin/python3.11"
DEBIAN_SITECUSTOMIZE = "/usr/lib/python3.11/sitecustomize.py"
PY38 = "/root/.pyenv/versions/3.8.18/bin/python3.8"
needs_debian = pytest.mark.skipif(not (os.path.exists(DEBIAN_PY) and os.path.exists(DEBIAN_SITECUSTOMIZE)),
                                  reason="needs Debian's python3.11 with its stdlib sitecustomize")


def make_venv(python: str, where: Path, marker: Path) -> Path:
    """A venv with its own sitecustomize.py and an import-line .pth, both of which touch ``marker`` files."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    sp = Path(subprocess.run([str(where / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip())
    (sp / "sitecustomize.py").write_text(f"open({str(marker) + '.site'!r}, 'a').write('ran\\n')\n")
    (sp / "zz_hook.pth").write_text(f"import os; open({str(marker) + '.pth'!r}, 'a').write('ran\\n')\n")
    return where / "bin" / "python"


@pytest.fixture(scope="module")
def debian_venv(tmp_path_factory):
    if not os.path.exists(DEBIAN_PY):
        pytest.skip("no /usr/bin/python3.11")
    d = tmp_path_factory.mktemp("debvenv")
    return make_venv(DEBIAN_PY, d / "v", d / "marker"), d / "marker"


@pytest.fixture(scope="module")
def own_venv(tmp_path_factory):
    d = tmp_path_factory.mktemp("ownvenv")
    return make_venv(plain_python(), d / "v", d / "marker"), d / "marker"


@needs_debian
def test_debian_venv_sitecustomize_is_shadowed_by_the_system_one(debian_venv):
    py, marker = debian_venv
    h = probe(str(py), cross_check=False)
    assert h.in_venv and h.version.startswith("3.11")
    assert h.sitecustomize == DEBIAN_SITECUSTOMIZE
    assert h.sitecustomize_target == os.path.realpath(DEBIAN_SITECUSTOMIZE)  # the /etc/python3.11 file
    venv_site = [p for p in h.shadowed_sitecustomize if p.startswith(str(py.parent.parent))]
    assert len(venv_site) == 1 and venv_site[0].endswith("site-packages/sitecustomize.py")
    # probing ran neither the venv's sitecustomize nor its .pth code
    assert not Path(str(marker) + ".site").exists() and not Path(str(marker) + ".pth").exists()
    pth = [e for e in h.pth_exec if e[0].endswith("zz_hook.pth")]
    assert pth == [(pth[0][0], 1, pth[0][2])] and pth[0][2].startswith("import os;")
    assert h.pth_reads[pth[0][0]] == 2  # site.py reads a venv's .pth files twice per start


@needs_debian
def test_cross_check_agrees_with_a_real_start(debian_venv):
    py, marker = debian_venv
    h = probe(str(py), cross_check=True)
    assert h.cross_check == "agrees"
    assert h.loaded_sitecustomize == DEBIAN_SITECUSTOMIZE
    # the normal start did run the .pth line (twice: venv), but the shadowed sitecustomize never ran
    assert Path(str(marker) + ".pth").read_text() == "ran\nran\n"
    assert not Path(str(marker) + ".site").exists()


def test_project_python_venv_loads_its_own_sitecustomize(own_venv):
    py, marker = own_venv
    h = probe(str(py), cross_check=False)
    assert h.sitecustomize and h.sitecustomize.startswith(str(py.parent.parent))
    assert h.shadowed_sitecustomize == []
    assert not Path(str(marker) + ".site").exists()
    assert h.site_packages and all(p.startswith(str(py.parent.parent)) for p in h.site_packages)
    assert h.user_site_enabled is False and any("venv" in d for d in h.disabled_by)
    h2 = probe(str(py))
    assert h2.cross_check == "agrees" and Path(str(marker) + ".site").read_text() == "ran\n"


def test_flags_and_environment_change_the_answer(own_venv, tmp_path):
    py, _ = own_venv
    assert probe(str(py), flags=["-S"], cross_check=False).sitecustomize is None
    assert "-S" in probe(str(py), flags=["-S"], cross_check=False).disabled_by
    assert "-I" in probe(str(py), flags=["-I"], cross_check=False).disabled_by
    # a sitecustomize on PYTHONPATH comes before site-packages: it wins, the venv's is shadowed
    (tmp_path / "sitecustomize.py").write_text("")
    h = probe(str(py), env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert h.sitecustomize == str(tmp_path / "sitecustomize.py")
    assert any(p.startswith(str(py.parent.parent)) for p in h.shadowed_sitecustomize)
    assert h.cross_check == "agrees"
    # -E ignores PYTHONPATH: the venv's own is back
    h = probe(str(py), flags=["-E"], env={**os.environ, "PYTHONPATH": str(tmp_path)}, cross_check=False)
    assert h.sitecustomize.startswith(str(py.parent.parent)) and "-E" in h.disabled_by


@needs_debian
def test_pythonnousersite_is_reported():
    h = probe(DEBIAN_PY, env={**os.environ, "PYTHONNOUSERSITE": "1"}, cross_check=False)
    assert "PYTHONNOUSERSITE" in h.disabled_by and h.user_site_enabled is False
    assert probe(DEBIAN_PY, env={k: v for k, v in os.environ.items() if k != "PYTHONNOUSERSITE"},
                 cross_check=False).user_site_enabled is True


@pytest.mark.skipif(not os.path.exists(PY38), reason="no Python 3.8 here")
def test_probe_script_runs_on_python_3_8():
    h = probe(PY38)
    assert h.version.startswith("3.8.") and h.cross_check == "agrees"
    assert isinstance(h.to_json()["pth_exec"], list)


def test_missing_interpreter_is_a_user_error(tmp_path):
    with pytest.raises(CommdiagError, match="no such interpreter"):
        probe(str(tmp_path / "nope" / "python"))
