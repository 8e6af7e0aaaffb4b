"""Which libnccl an interpreter's processes load: torch's and PyNccl's (SGLANG_NCCL_SO_PATH /
VLLM_NCCL_SO_PATH, else libnccl.so.2).  No GPU here, so the libraries are real shared objects compiled
in the test with cc, exporting ncclGetVersion with chosen versions, loaded by a real child interpreter."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commdiag.environment import doctor, ncclib
from conftest import REPO, words

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")

NOBODY = 65534


def _lib(folder: Path, code: int | None, name: str = "libnccl.so.2") -> Path:
    """A shared library named ``name`` (soname libnccl.so.2) whose ncclGetVersion says ``code``."""
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "nccl.c"
    body = (f"int ncclGetVersion(int* v) {{ *v = {code}; return 0; }}\n" if code is not None
            else "int ncclSomethingElse(void) { return 0; }\n")
    src.write_text(body)
    out = folder / name
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", str(out), str(src)], check=True)
    return out


@functools.lru_cache(maxsize=None)
def _python() -> str:
    """An interpreter without torch when there is one (the probe then skips a slow import)."""
    base = getattr(sys, "_base_executable", sys.executable)
    for py in (base, "/usr/bin/python3", sys.executable):
        if py and os.path.exists(py) and subprocess.run([py, "-I", "-c", "import torch"],
                                                        capture_output=True).returncode != 0:
            return py
    return sys.executable


@functools.lru_cache(maxsize=None)
def _torch_nccl() -> tuple[str, str | None] | None:
    """(version, path) of the NCCL that torch brings in this test's own interpreter (a CUDA build, as on a
    GPU box; path None where it is linked into torch), else None (a CPU build: no NCCL of its own).  With
    it, torch is the reference every other library is compared with, and a bare libnccl.so.2 resolves
    to torch's already loaded library (the same soname)."""
    try:
        import torch

        if not torch.version.cuda:
            return None
    except Exception:  # noqa: BLE001 - no usable torch here: no torch NCCL
        return None
    r = ncclib.probe(sys.executable, _env())
    if r.torch_lib is not None:
        return r.torch_lib.version, r.torch_lib.path
    return (r.torch_nccl, None) if r.torch_nccl else None


@functools.lru_cache(maxsize=None)
def _system_libnccl() -> str | None:
    """Where a bare libnccl.so.2 resolves for _python() with no LD_LIBRARY_PATH (the loader cache: a GPU
    box with NCCL installed system-wide has one), else None."""
    r = ncclib.probe(_python(), _env())
    bare = next((l for l in r.libs if l.label == ncclib.BARE), None)
    return bare.path if bare is not None and bare.ok else None


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "SGLANG_NCCL_SO_PATH",
                                                             "VLLM_NCCL_SO_PATH", "LD_PRELOAD")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ncclibs")
    return {"a": _lib(root / "a", 22809), "b": _lib(root / "b", 22703), "copy": _lib(root / "copy", 22809),
            "notnccl": _lib(root / "c", None), "root": root}


def test_version_codes_and_tuner_abis():
    assert ncclib.version_text(22809) == "2.28.9" and ncclib.version_text(2804) == "2.8.4"
    assert ncclib.version_text(None) is None and ncclib.version_text(0) is None
    assert ncclib.tuner_abis("2.28.9+cuda13.0") == (2, 3, 4, 5) and ncclib.tuner_abis("2.27.3") == (2, 3, 4)
    assert ncclib.tuner_abis("2.20.5") == (1,) and ncclib.tuner_abis("2.18.6") == () and ncclib.tuner_abis(None) == ()


def test_a_real_mismatch_between_libnccl_so_2_and_sglang_nccl_so_path(libs):
    env = _env(LD_LIBRARY_PATH=str(libs["a"].parent), SGLANG_NCCL_SO_PATH=str(libs["b"]))
    r = ncclib.probe(_python(), env)
    assert r.error is None, r.error
    got = {l.label: (l.version, l.path) for l in r.libs}
    assert got["libnccl.so.2"] == ("2.28.9", str(libs["a"]))
    assert got["SGLANG_NCCL_SO_PATH"] == ("2.27.3", str(libs["b"]))
    assert [who for who, _ in r.pynccl()] == ["SGLang's PyNccl (SGLANG_NCCL_SO_PATH)", "vLLM's PyNccl (libnccl.so.2)"]
    (m,) = r.mismatches()
    assert m.startswith(f"libnccl.so.2 uses NCCL 2.28.9 ({libs['a']}) but SGLang's PyNccl (SGLANG_NCCL_SO_PATH) "
                        f"loads NCCL 2.27.3 ({libs['b']}): two NCCLs in one server process")
    assert "same NCCL_* variables" in m and "2.28.9: v2-v5, 2.27.3: v2-v4" in m and "takes v4" in m
    lines = ncclib.render(r)
    assert any(l.startswith("    MISMATCH: libnccl.so.2 uses NCCL 2.28.9") for l in lines)
    assert all(len(l) <= 100 for l in lines)


def test_same_library_twice_is_no_mismatch_and_a_second_copy_is_said(libs):
    env = _env(LD_LIBRARY_PATH=str(libs["a"].parent), VLLM_NCCL_SO_PATH=str(libs["a"]))
    r = ncclib.probe(_python(), env)
    assert r.mismatches() == []
    env = _env(LD_LIBRARY_PATH=str(libs["a"].parent), VLLM_NCCL_SO_PATH=str(libs["copy"]))
    (m,) = ncclib.probe(_python(), env).mismatches()
    assert "second copy of NCCL 2.28.9" in m and "two NCCLs" not in m


def test_missing_and_non_nccl_libraries_say_why(libs):
    r = ncclib.probe(_python(), _env(SGLANG_NCCL_SO_PATH=str(libs["notnccl"]), LD_LIBRARY_PATH=str(libs["root"])))
    got = {l.label: l.error for l in r.libs}
    assert "not an NCCL library" in got["SGLANG_NCCL_SO_PATH"]
    system = _system_libnccl()
    if system is None:
        assert "cannot open shared object file" in got["libnccl.so.2"]
    else:  # NCCL is installed system-wide here: no folder on LD_LIBRARY_PATH has one, so the cache's is found
        bare = next(l for l in r.libs if l.label == "libnccl.so.2")
        assert got["libnccl.so.2"] is None and bare.path == system and str(libs["root"]) not in system
    assert r.mismatches() == []


def test_the_child_runs_isolated_from_the_current_folder(libs, tmp_path, monkeypatch):
    for mod in ("json", "ctypes", "re", "os", "ast", "importlib"):
        (tmp_path / f"{mod}.py").write_text(f"open({str(tmp_path / 'RAN')!r}, 'a').write('{mod}')\n")
    monkeypatch.chdir(tmp_path)
    r = ncclib.probe(_python(), _env(LD_LIBRARY_PATH=str(libs["a"].parent)))
    assert r.error is None and not (tmp_path / "RAN").exists()


def _chown_away(path: Path) -> None:
    """Make ``path`` another user's: as root chown it to nobody; as anyone else it already is not root's."""
    if os.geteuid() == 0:
        os.lchown(path, NOBODY, NOBODY)


def test_as_root_nothing_another_user_owns_is_run_or_loaded(libs, tmp_path):
    theirs = _lib(tmp_path / "theirs", 22905)
    _chown_away(theirs)
    # euid=0: the decision as root, whoever runs the test (files not owned by root are refused either way)
    load, skipped = ncclib.plan(_env(SGLANG_NCCL_SO_PATH=str(theirs)), euid=0)
    assert ["SGLANG_NCCL_SO_PATH", str(theirs)] not in load and "not root" in skipped["SGLANG_NCCL_SO_PATH"]
    folder = tmp_path / "ldpath"
    folder.mkdir()
    _chown_away(folder)
    r = ncclib.probe(_python(), _env(LD_LIBRARY_PATH=f"{libs['a'].parent}:{folder}"), euid=0)
    assert r.error.startswith("not run as root:") and "not root" in r.error  # it changes what python loads
    for entry, why in [(f":{libs['a'].parent}", "relative"), (str(tmp_path / "missing"), "not an existing folder")]:
        r = ncclib.probe(_python(), _env(LD_LIBRARY_PATH=entry), euid=0)  # an empty entry: the current folder
        assert why in r.error
    link = tmp_path / "python"
    link.symlink_to(_python())
    _chown_away(link)
    r = ncclib.probe(str(link), _env(), euid=0)
    assert r.error.startswith("not run as root:") and "not root" in r.error and r.libs == []
    r = ncclib.probe(_python(), _env(LD_PRELOAD=str(theirs)), euid=0)
    assert r.error and "not run as root" in r.error
    # a user running as themselves probes their own interpreter
    if os.geteuid() != 0:
        assert ncclib.probe(_python(), _env(SGLANG_NCCL_SO_PATH=str(theirs))).libs


@pytest.mark.skipif(os.geteuid() != 0, reason="as root only: the child then loads root's libraries and skips others")
def test_as_root_a_skipped_library_is_reported_not_loaded(libs, tmp_path):
    theirs = _lib(tmp_path / "t", 22905)
    _chown_away(theirs)
    r = ncclib.probe(_python(), _env(LD_LIBRARY_PATH=str(libs["a"].parent), SGLANG_NCCL_SO_PATH=str(theirs)))
    got = {l.label: l for l in r.libs}
    assert got["libnccl.so.2"].version == "2.28.9"  # root's own library is loaded
    assert got["SGLANG_NCCL_SO_PATH"].version is None and "is not loaded" in got["SGLANG_NCCL_SO_PATH"].error
    assert any("SGLang's PyNccl (SGLANG_NCCL_SO_PATH)" in l and "not loaded" in l for l in ncclib.render(r))


def test_doctor_flags_the_mismatch_per_interpreter(libs):
    env = _env(LD_LIBRARY_PATH=str(libs["a"].parent), SGLANG_NCCL_SO_PATH=str(libs["b"]))
    r = ncclib.probe(_python(), env)
    (f,) = doctor.library_findings([r])
    assert f.severity == "warning" and f.check == f"NCCL libraries {r.python}"
    assert "torch none" in f.title and "SGLang's PyNccl (SGLANG_NCCL_SO_PATH) 2.27.3" in f.title
    assert "SGLANG_NCCL_SO_PATH" in f.action
    ok = ncclib.probe(_python(), _env(LD_LIBRARY_PATH=str(libs["a"].parent)))
    assert [x.severity for x in doctor.library_findings([ok])] == ["ok"]


def test_check_env_libs_cli_on_this_interpreter_with_torch(libs):
    env = _env(LD_LIBRARY_PATH=str(libs["a"].parent), SGLANG_NCCL_SO_PATH=str(libs["b"]),
               PYTHONPATH=str(REPO))
    cp = subprocess.run([sys.executable, "-m", "commdiag.cli", "check-env", "--libs"], capture_output=True,
                        text=True, env=env, timeout=300)
    assert cp.returncode == 1, cp.stdout + cp.stderr
    # the reference is torch's own NCCL where this torch is a CUDA build (a GPU box), else libnccl.so.2's
    torch_nccl = _torch_nccl()
    ref = f"torch uses NCCL {torch_nccl[0]}" if torch_nccl else "libnccl.so.2 uses NCCL 2.28.9"
    assert f"MISMATCH: {ref}" in words(cp.stdout) and "loads NCCL 2.27.3" in words(cp.stdout)
    assert all(len(l) <= 100 for l in cp.stdout.splitlines())
    # the same library as the reference: no mismatch (with torch's NCCL, torch's own file; a copy of the same
    # version elsewhere would be a second copy)
    same = (torch_nccl[1] or "libnccl.so.2") if torch_nccl else str(libs["a"])
    cp = subprocess.run([sys.executable, "-m", "commdiag.cli", "check-env", "--libs", "--json"], capture_output=True,
                        text=True, env={**env, "SGLANG_NCCL_SO_PATH": same}, timeout=300)
    data = json.loads(cp.stdout)
    assert cp.returncode == 0 and data["format"] == "commdiag-nccl-libraries" and data["mismatches"] == []
    assert data["torch"] is not None  # this interpreter's torch was found in the child
    cp = subprocess.run([sys.executable, "-m", "commdiag.cli", "check-env", "--libs", "--nccl"], capture_output=True,
                        text=True, env=env, timeout=60)
    assert cp.returncode == 2 and "check of its own" in cp.stderr


def test_doctor_python_reports_each_interpreter_and_flags_the_mismatch(libs):
    env = _env(LD_LIBRARY_PATH=str(libs["a"].parent), SGLANG_NCCL_SO_PATH=str(libs["b"]), PYTHONPATH=str(REPO))
    env = {k: v for k, v in env.items() if not k.startswith("NCCL_")}
    readings = REPO / "tests" / "fixtures" / "h200x2-nvlink" / "nvml-readings.json"
    cp = subprocess.run([sys.executable, "-m", "commdiag.cli", "doctor", "--json", "--python", _python(),
                         "--nvml-replay", str(readings)], capture_output=True, text=True, env=env, timeout=300)
    assert cp.returncode == 1, cp.stderr
    rep = json.loads(cp.stdout)
    by_python = {l["python"]: l for l in rep["nccl_libraries"]}
    assert len(by_python) == 2  # this interpreter and --python
    torch_nccl = _torch_nccl()
    for lib in by_python.values():
        expected = {"libnccl.so.2": "2.28.9", "SGLANG_NCCL_SO_PATH": "2.27.3"}
        if torch_nccl and lib["torch_cuda"]:  # this interpreter (_python() is one without torch)
            # a CUDA torch maps its own libnccl.so.2: the bare name resolves to it (the same soname)
            expected["libnccl.so.2"] = torch_nccl[0]
            if torch_nccl[1]:
                expected["torch"] = torch_nccl[0]
        assert {l["label"]: l["version"] for l in lib["libs"]} == expected
        assert len(lib["mismatches"]) == 1
    flagged = [f for f in rep["findings"] if f["check"].startswith("NCCL libraries ")]
    assert [f["severity"] for f in flagged] == ["warning", "warning"]


def test_a_cpu_torch_is_read_not_imported_and_a_cuda_torch_is_imported_for_its_nccl(tmp_path):
    """The child learns that a CPU torch has no NCCL from its torch/version.py (importing torch takes
    seconds); a CUDA build is imported, as a server does, to map its libnccl and ask its version.  Two
    stand-in torch packages in a real venv, each leaving a file when imported."""
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    torch = site / "torch"
    torch.mkdir()
    imported = tmp_path / "imported"
    (torch / "__init__.py").write_text(
        f"open({str(imported)!r}, 'w').close()\n"
        "from . import version\n__version__ = version.__version__\n"
        "class cuda:\n    class nccl:\n        @staticmethod\n        def version():\n            return (2, 28, 9)\n")
    (torch / "version.py").write_text("from typing import Optional\n__version__ = '9.9.9+cpu'\n"
                                      "cuda: Optional[str] = None\nhip: Optional[str] = None\n")
    r = ncclib.probe(py, _env())
    assert r.error is None and r.torch == "9.9.9+cpu" and r.torch_cuda is None and r.torch_nccl is None
    assert not imported.exists() and any("is a CPU build: it has no NCCL" in n for n in r.notes)
    (torch / "version.py").write_text("__version__ = '9.9.9+cu130'\ncuda = '13.0'\n")
    r = ncclib.probe(py, _env())
    assert r.error is None and (r.torch, r.torch_cuda, r.torch_nccl) == ("9.9.9+cu130", "13.0", "2.28.9")
    assert imported.exists()
