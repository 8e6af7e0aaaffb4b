"""Every Python interpreter commdiag starts imports nothing from the folder it was started in.

The folder holds a json.py, os.py, runpy.py, torch.py, multiprocessing.py ... that each append a
line to a marker file.  Each case starts commdiag's real children from there (probe, cross-check,
install verification and status, uninstall, propagation's fork/spawn/forkserver/subprocess
children, a sweep launch: torchrun and its worker) and asserts the marker stays empty; the two
other torchrun starts (propagation's, check-env --nccl's) are the same module_argv, checked by
their command and working folder.  As root, PYTHONPATH inherited from the caller (sudo -E) is
not passed on either.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from commdiag import procs
from commdiag.environment import envcheck, propagation, pyprobe
from commdiag.measure import launcher

from conftest import REPO
from pythons import plain_python

PY38 = "/root/.pyenv/versions/3.8.18/bin/python3.8"
PY310 = "/root/.pyenv/versions/3.10.13/bin/python3.10"
MODULES = ("json", "os", "re", "sys", "site", "sitecustomize", "usercustomize", "runpy", "importlib",
           "multiprocessing", "ctypes", "subprocess", "tempfile", "pathlib", "typing", "argparse", "torch",
           "selectors", "signal", "struct", "encodings", "codecs", "io", "abc", "collections")


def plant(folder: Path) -> Path:
    """A folder full of modules that record that they ran; returns the marker file."""
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / "RAN"
    for name in MODULES:
        (folder / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name + chr(10)!r})\n")
    return marker


def ran(marker: Path) -> str:
    return marker.read_text() if marker.exists() else ""


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    marker = plant(tmp_path / "cwd")
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path / "cwd", marker


def commdiag_cli(*args, cwd, env=None, timeout=180):
    """The CLI as a real child started in ``cwd`` (the starter itself uses -I: it is not under test)."""
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); from commdiag.cli import main; main()"
    e = {**os.environ, **(env or {})}
    e.pop("NCCL_PROTO", None)
    return subprocess.run([sys.executable, "-I", "-c", code, *map(str, args)], capture_output=True, text=True,
                          env=e, cwd=cwd, timeout=timeout)


def test_the_probe_and_its_cross_check(hostile):
    _, marker = hostile
    h = pyprobe.probe(sys.executable, cross_check=True)
    assert h.cross_check == "agrees" and h.site_packages
    assert ran(marker) == ""


@pytest.mark.skipif(not os.path.exists(PY38), reason="no Python 3.8 here")
def test_the_probe_guard_holds_on_python_3_8(hostile):
    _, marker = hostile
    assert pyprobe.probe(PY38, cross_check=True).cross_check == "agrees"
    assert ran(marker) == ""


def test_install_hook_dry_run_from_a_hostile_folder(hostile, tmp_path):
    cwd, marker = hostile
    cp = commdiag_cli("install-hook", "--set", "NCCL_DEBUG=WARN", "--root", tmp_path / "stage", "--dry-run",
                      cwd=cwd)
    assert cp.returncode == 0, cp.stderr
    assert ran(marker) == ""


def test_install_verify_status_and_uninstall_from_a_hostile_folder(hostile, tmp_path):
    cwd, marker = hostile
    root = tmp_path / "root"
    subprocess.run([plain_python(), "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120,
                   cwd=tmp_path)
    py = root / "venv/bin/python"
    cp = commdiag_cli("install-hook", "--root", root, "--python", py, "--set", "NCCL_PROTO=LL", cwd=cwd)
    assert cp.returncode == 0 and "verify: OK" in cp.stdout, cp.stdout + cp.stderr
    cp = commdiag_cli("install-hook", "--status", "--root", root, "--python", py, cwd=cwd)
    assert "loads at start: yes" in cp.stdout, cp.stdout + cp.stderr
    cp = commdiag_cli("install-hook", "--uninstall", "--root", root, "--python", py, cwd=cwd)
    assert cp.returncode == 0, cp.stderr
    assert ran(marker) == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="the PYTHON* variables are dropped for root only")
def test_as_root_an_inherited_pythonpath_is_not_passed_on(tmp_path):
    marker = plant(tmp_path / "lib")
    (tmp_path / "lib" / "sitecustomize.py").unlink()  # the CLI's own start would run that one
    cp = commdiag_cli("install-hook", "--set", "NCCL_DEBUG=WARN", "--root", tmp_path / "stage", "--dry-run",
                      cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "lib")})
    assert cp.returncode == 0, cp.stderr
    assert ran(marker) == ""


class _Started(Exception):
    pass


def _capture_popen(monkeypatch) -> list:
    """subprocess.Popen that records (argv, cwd) and starts nothing; the argv procs's exec wrapper
    (parent-death signal, marker) would exec."""
    calls = []

    def fake(argv, *a, **kw):
        argv = list(argv)
        if procs._DIE_WITH_PARENT in argv:
            argv = argv[argv.index(procs._DIE_WITH_PARENT) + 5:]
        calls.append((argv, kw.get("cwd")))
        raise _Started()

    monkeypatch.setattr(subprocess, "Popen", fake)
    return calls


def test_propagation_children_every_way(hostile, monkeypatch):
    _, marker = hostile
    r = propagation.check_propagation({}, torchrun=False)  # fork, spawn, forkserver, two subprocess paths
    assert [p.path for p in r.paths if p.error] == [], [(p.path, p.error) for p in r.paths]
    assert ran(marker) == ""
    assert os.getcwd() == str(hostile[0])  # the working folder is given back
    # the torchrun path: the agent as module_argv starts it (the real start: the sweep launch test),
    # in the private folder that holds its worker script (the worker's path begins there)
    from commdiag import childpython

    calls = _capture_popen(monkeypatch)
    propagation.check_propagation({}, torchrun=True)
    argv, cwd = calls[-1]
    assert argv[:4] == childpython.module_argv("torch.distributed.run")[:4]
    assert argv[argv.index("--max-restarts=0") + 1] == str(Path(cwd, "torchrun_worker.py"))


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="a sweep launch needs torch (torchrun)")
def test_a_sweep_launch_agent_and_worker(hostile, tmp_path):
    cwd, marker = hostile
    (tmp_path / "launch").mkdir()
    plan = tmp_path / "launch" / "plan.json"
    plan.write_text("{}")  # not a plan: the worker starts, imports, and fails on it
    argv = launcher.torchrun_argv(1, 1, None, "t", 60, plan)
    env = launcher.launch_env(dict(os.environ), {}, {launcher.MARKER: launcher.new_marker()})
    out = launcher.run(argv, env, tmp_path / "launch" / "torchrun.log", 120)
    log = (tmp_path / "launch" / "torchrun.log").read_text()
    assert out.exit_code not in (0, None) and "commdiag/measure/worker.py" in log, log[-2000:]
    assert ran(marker) == ""


def test_check_env_nccl_torchrun(hostile, monkeypatch):
    from commdiag import childpython

    calls = _capture_popen(monkeypatch)
    with pytest.raises(_Started):
        envcheck.check_nccl({}, nproc=1)
    argv, cwd = calls[0]
    assert argv[:4] == childpython.module_argv("torch.distributed.run")[:4]
    assert argv[argv.index("--max-restarts=0") + 1] == str(Path(cwd, "nccl_worker.py"))


@pytest.mark.parametrize("python, flag", [(sys.executable, True), (PY310, False)])
def test_module_argv_either_way(hostile, python, flag):
    if not os.path.exists(python):
        pytest.skip(f"no {python} here")
    from commdiag import childpython

    _, marker = hostile
    cp = subprocess.run(childpython.module_argv("json.tool", ["--sort-keys"], python=python, safe_path_flag=flag),
                        input='{"b": 1, "a": 2}', capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0 and cp.stdout.split() == ["{", '"a":', "2,", '"b":', "1", "}"], cp.stderr
    assert ran(marker) == ""


def test_ab_server_and_command_start_in_the_launch_folder(hostile, tmp_path):
    # issue 30 item 7: the shipped specs run `python -m ...`, which puts the working folder first on the
    # path: started in commdiag's own folder, the server and the command imported its json.py
    from commdiag.ab import runner, spec as ab_spec

    cwd, marker = hostile
    toy = ["{python}", "-m", "commdiag.ab.toy"]
    s = ab_spec.resolve({"name": "f", "rounds": 8,
                         "command": [*toy, "client", "--port", "{port}", "--requests", "2",
                                     "--output-file", "{launch_dir}/result.jsonl"],
                         "server": {"command": [*toy, "server", "--port", "{port}"], "ready_timeout_s": 20,
                                    "ready_url": "http://127.0.0.1:{port}/health", "stop_timeout_s": 5},
                         "metrics": [{"preset": "sglang.bench_serving", "field": "output_throughput"}],
                         "configs": {"x": {"TOY_RATE": "900"}}})
    run = runner.new_run(s)
    (tmp_path / "run").mkdir()
    launch = run["launches"][0]
    config = next(c for c in run["configs"] if c["name"] == launch["config"])
    # this checkout on the children's path, as an installed commdiag is (CI's Debian-python step has none)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    runner.one_launch(s, run, tmp_path / "run", launch, config, env)
    assert ran(marker) == ""
    assert launch["status"] == "ok", launch.get("error")
