"""check-env in real processes: os.environ vs getenv, expectations, nccl.conf, propagation paths, NCCL logs."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from commdiag.environment import envcheck, propagation
from commdiag.formats import profile
from conftest import REPO, one_message

FIX = Path(__file__).parent / "fixtures" / "h200x2-nvlink"
SEED = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_MAX_NCHANNELS": "16", "NCCL_BUFFSIZE": "16777216",
        "NCCL_NTHREADS": "512", "NCCL_P2P_LEVEL": "SYS"}


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(extra)
    return env


def cli(*args, env):
    full = dict(env)
    full["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "commdiag.cli", *args], capture_output=True, text=True, env=full,
                          timeout=300)


def test_expectation_met_missing_and_mismatched():
    env = clean_env(NCCL_PROTO="LL", NCCL_ALGO="Tree", NCCL_DEBUG="WARN")
    cp = cli("check-env", "--json", "--expect", "NCCL_PROTO=LL", "--expect", "NCCL_ALGO=Ring",
             "--expect", "NCCL_BUFFSIZE=4194304", env=env)
    assert cp.returncode == 1, cp.stderr
    out = json.loads(cp.stdout)
    assert out["format"] == "commdiag-check-env" and out["version"] == 1 and out["ok"] is False
    status = {v["name"]: v["status"] for v in out["vars"]}
    assert status == {"NCCL_PROTO": "ok", "NCCL_ALGO": "mismatch", "NCCL_BUFFSIZE": "missing", "NCCL_DEBUG": "info"}
    cp = cli("check-env", "--expect", "NCCL_PROTO=LL", env=env)
    assert cp.returncode == 0 and "OK         NCCL_PROTO" in cp.stdout


def test_profile_is_an_expectation(tmp_path):
    p = tmp_path / "profile.env"
    profile.save(p, profile.Profile({"NCCL_PROTO": "LL", "NCCL_NTHREADS": "512"}, {"source": "test"}))
    cp = cli("check-env", "--json", "--profile", str(p), env=clean_env(NCCL_PROTO="LL", NCCL_NTHREADS="512"))
    out = json.loads(cp.stdout)
    assert cp.returncode == 0 and out["source"] == f"profile {p}" and out["ok"]
    cp = cli("check-env", "--profile", str(p), env=clean_env(NCCL_PROTO="LL"))
    assert cp.returncode == 1 and "NCCL_NTHREADS" in cp.stdout


def test_unreadable_or_ambiguous_profile_is_one_usage_error(tmp_path):
    binary = tmp_path / "binary.env"
    binary.write_bytes(b"\xff\xfe# commdiag-profile 1\n")
    cp = cli("check-env", "--profile", str(binary), env=clean_env())
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    assert str(binary) in one_message(cp.stderr) and "UTF-8" in cp.stderr
    dup = tmp_path / "dup.env"
    dup.write_text("# commdiag-profile 1\nNCCL_PROTO=LL\nNCCL_PROTO=Simple\n")
    cp = cli("check-env", "--profile", str(dup), env=clean_env(NCCL_PROTO="Simple"))
    assert cp.returncode == 2 and f"{dup}: line 3: NCCL_PROTO" in one_message(cp.stderr) and "line 2" in cp.stderr, cp.stderr


def test_bad_expectation_is_a_usage_error():
    cp = cli("check-env", "--expect", "NCCL_PROTO=LX", env=clean_env())
    assert cp.returncode == 2 and "NCCL_PROTO=LX" in cp.stderr and "LL128" in cp.stderr


def test_putenv_divergence_and_c_only_variables_are_caught():
    code = ("import os, json, commdiag\n"
            "os.putenv('NCCL_PROTO', 'Simple')\n"  # C sees Simple, os.environ still says LL
            "os.putenv('NCCL_ALGO', 'Tree')\n"  # only in the C environment
            "r = commdiag.check_env({'NCCL_PROTO': 'LL'})\n"
            "print(json.dumps(r.to_json())); print(r)\n")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        env={**clean_env(NCCL_PROTO="LL"), "PYTHONPATH": str(REPO)}, timeout=60)
    out = json.loads(cp.stdout.splitlines()[0])
    v = {x["name"]: x for x in out["vars"]}
    assert v["NCCL_PROTO"]["status"] == "diverged" and v["NCCL_PROTO"]["getenv"] == "Simple"
    assert v["NCCL_ALGO"]["environ"] is None and v["NCCL_ALGO"]["getenv"] == "Tree"
    assert v["NCCL_ALGO"]["status"] == "diverged"
    assert cp.stdout.splitlines()[1].startswith(f"commdiag check-env pid {out['pid']}: FAIL NCCL_PROTO diverged")


def test_python_api_and_cli_import_neither_torch_nor_pandas():
    code = ("import sys, commdiag\n"
            "r = commdiag.check_env({'NCCL_PROTO': 'LL'})\n"
            "from commdiag.cli import main\n"
            "try:\n    main(['check-env'])\nexcept SystemExit:\n    pass\n"
            "print(r.ok, [m for m in ('torch', 'pandas', 'pynvml', 'plotly') if m in sys.modules])\n")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        env={**clean_env(NCCL_PROTO="LL"), "PYTHONPATH": str(REPO)}, timeout=60)
    assert cp.stdout.strip().splitlines()[-1] == "True []", cp.stdout + cp.stderr


def test_nccl_conf_files_order_and_precedence(tmp_path):
    home = pwd.getpwuid(os.getuid()).pw_dir
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "nccl.conf").write_text("# system\nNCCL_PROTO=Simple\nNCCL_ALGO=Tree\nNCCL_NTHREADS=256\n")
    user = tmp_path / home.lstrip("/") / ".nccl.conf"
    user.parent.mkdir(parents=True)
    user.write_text("NCCL_PROTO=LL\nNCCL_PROTO=LL128\n")  # NCCL's setenv(...,0): the first line wins
    files = envcheck.nccl_conf_files(env={}, root=str(tmp_path))
    assert [c.role for c in files] == ["~/.nccl.conf", "/etc/nccl.conf"] and all(c.exists for c in files)
    eff = envcheck.conf_effective(files)
    assert eff["NCCL_PROTO"] == ("LL", str(user)) and eff["NCCL_ALGO"][0] == "Tree"
    # NCCL_CONF_FILE replaces ~/.nccl.conf; /etc/nccl.conf is still read after it
    other = tmp_path / "mine.conf"
    other.write_text("NCCL_ALGO=Ring\n")
    files = envcheck.nccl_conf_files(env={"NCCL_CONF_FILE": str(other)}, root=str(tmp_path))
    assert [c.role for c in files] == ["NCCL_CONF_FILE", "/etc/nccl.conf"]
    assert envcheck.conf_effective(files)["NCCL_ALGO"] == ("Ring", str(other))
    # in a process: a variable missing from the environment that nccl.conf supplies counts as arriving
    cp = cli("check-env", "--json", "--conf-root", str(tmp_path), "--expect", "NCCL_NTHREADS=256",
             "--expect", "NCCL_ALGO=Ring", env=clean_env())
    v = {x["name"]: x for x in json.loads(cp.stdout)["vars"]}
    assert v["NCCL_NTHREADS"]["status"] == "from-conf"
    assert v["NCCL_ALGO"]["status"] == "missing" and "Tree" in v["NCCL_ALGO"]["detail"]
    assert cp.returncode == 1


def test_propagation_through_every_start_method():
    """Real children: fork, spawn, forkserver, subprocess env=None / env=copy, torchrun worker and grandchild."""
    cp = cli("check-env", "--propagation", "--json", "--expect", "NCCL_PROTO=LL", env=clean_env(NCCL_PROTO="LL"))
    out = json.loads(cp.stdout)
    assert out["format"] == "commdiag-check-env-propagation"
    paths = {p["path"]: p for p in out["paths"]}
    assert list(paths) == ["this process", "multiprocessing fork", "multiprocessing spawn", "multiprocessing forkserver",
                           "subprocess env=None", "subprocess env=os.environ.copy()", "torchrun worker",
                           "spawn grandchild of a torchrun worker"]
    assert all(p["error"] is None for p in paths.values()), [p["error"] for p in paths.values()]
    assert cp.returncode == 0 and all(p["ok"] for p in paths.values())
    pids = {p["pid"] for p in paths.values()}
    assert len(pids) == len(paths)  # every path really is its own process

    def seen(path, var, where="getenv"):
        return paths[path]["vars"][var][where]

    for p in paths:
        assert seen(p, "NCCL_PROTO") == "LL" and seen(p, propagation.EARLY_VAR) == "1"
    # the late change: set after each mechanism started
    late = {p: seen(p, propagation.LATE_VAR) for p in paths if p != "this process"}
    assert late == {"multiprocessing fork": "multiprocessing-fork", "multiprocessing spawn": "multiprocessing-spawn",
                    "multiprocessing forkserver": None, "subprocess env=None": "subprocess-env=None",
                    "subprocess env=os.environ.copy()": None, "torchrun worker": None,
                    "spawn grandchild of a torchrun worker": None}
    # os.putenv only: C environment travels through exec (spawn, env=None, torchrun) but not through a copy of
    # os.environ; a fork child's os.environ lacks it while its getenv has it
    assert seen("multiprocessing fork", propagation.PUTENV_VAR, "environ") is None
    assert seen("multiprocessing fork", propagation.PUTENV_VAR) == "1"
    assert seen("multiprocessing spawn", propagation.PUTENV_VAR, "environ") == "1"
    assert seen("subprocess env=os.environ.copy()", propagation.PUTENV_VAR) is None
    assert seen("spawn grandchild of a torchrun worker", propagation.PUTENV_VAR) == "1"


def test_propagation_reports_a_variable_the_parent_lacks():
    cp = cli("check-env", "--propagation", "--no-torchrun", "--expect", "NCCL_ALGO=Ring", env=clean_env())
    assert cp.returncode == 1
    assert "FAIL multiprocessing spawn" in cp.stdout and "NCCL_ALGO" in cp.stdout


def test_nccl_without_gpus_gives_one_clear_message():
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    cp = cli("check-env", "--nccl", env=clean_env())
    assert cp.returncode == 2 and cp.stdout == ""
    assert "needs CUDA GPUs" in one_message(cp.stderr) and "--propagation" in cp.stderr


def test_recorded_nccl_log_seed_settings_applied_on_both_ranks():
    text = (FIX / "nccl-debug-env-seed-settings.log").read_text()
    ranks = envcheck.compare_nccl(text, SEED)
    assert [(r.pid, r.device) for r in ranks] == [(1051, 0), (1052, 1)]
    for r in ranks:
        assert r.ok and r.version == "2.28.9+cuda13.0"
        status = {c.name: (c.status, c.getenv) for c in r.checks}
        assert status == {**{k: ("ok", v) for k, v in SEED.items()}, "NCCL_NVLS_ENABLE": ("info", "0")}
    wrong = envcheck.compare_nccl(text, {**SEED, "NCCL_PROTO": "Simple", "NCCL_IB_HCA": "mlx5"}, {1051: 0, 1052: 1})
    assert [r.rank for r in wrong] == [0, 1] and not any(r.ok for r in wrong)
    c = {x.name: x for x in wrong[0].checks}
    assert c["NCCL_PROTO"].status == "mismatch" and c["NCCL_PROTO"].getenv == "LL"
    assert c["NCCL_IB_HCA"].status == "unconfirmed"  # NCCL printed nothing for it: a warning, not a failure


def test_recorded_nccl_log_defaults():
    text = (FIX / "nccl-debug-init-env-tuning-defaults.log").read_text()
    ranks = envcheck.compare_nccl(text, {})
    assert len(ranks) == 2 and all(r.applied == {"NCCL_NVLS_ENABLE": "0"} for r in ranks)


def test_a_misspelled_nccl_variable_is_pointed_out():
    cp = cli("check-env", "--json", env=clean_env(NCCL_PROTOO="LL"))
    out = json.loads(cp.stdout)
    (check,) = [c for c in out["vars"] if c["name"] == "NCCL_PROTOO"]
    assert check["status"] == "info" and "did you mean NCCL_PROTO" in check["detail"]
