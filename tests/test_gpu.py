"""On a GPU machine (`pytest -m gpu`): the parts that read real GPUs, end to end through the CLI.

Skipped where no CUDA GPU is visible (conftest.py).  What each test checks is what CPU tests can only
replay from recordings: real NVML, real CUDA copies, the real libnccl torch loads, a real nccl sweep.
"""

from __future__ import annotations

import json

import pytest

from conftest import REPO, run_cli, write_spec

pytestmark = pytest.mark.gpu


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def test_p2p_measures_the_host_link_of_every_gpu():
    proc = run_cli("p2p", "--json", timeout=300)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert len(out["gpus"]) == _gpus()
    for g in out["gpus"]:
        assert g["status"] == "ok", g
    assert len(out["pairs"]) == _gpus() * (_gpus() - 1) // 2


def test_machine_state_reads_every_gpu_from_real_nvml():
    from commdiag.measure import machinestate

    s = machinestate.open_sampler("nccl")
    try:
        assert s.available, s.reason
        readings = s.read(machinestate.FULL)
        assert len(readings) == _gpus()
        assert all(r["sm_clock"] > 0 and r["temperature"] > 0 for r in readings), readings
    finally:
        s.close()


def test_detect_audits_the_real_pcie_tree_and_matches_nvml():
    proc = run_cli("detect", "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    pcie = out["pcie"]
    assert pcie["available"], pcie
    assert len(pcie["gpus"]) == _gpus()


def test_check_env_libs_finds_the_libnccl_torch_loads():
    import torch

    proc = run_cli("check-env", "--libs", "--json", timeout=180)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    torch_libs = [lib for lib in out["libs"] if lib["label"] == "torch"]
    want = ".".join(map(str, torch.cuda.nccl.version()))
    assert torch_libs and torch_libs[0]["version"] == want, out


def test_a_real_nccl_sweep_records_transports_and_machine_state(tmp_path):
    if _gpus() < 2:
        pytest.skip("an nccl all-reduce needs 2 GPUs; this machine has 1")
    spec = write_spec(tmp_path / "s.yaml", backend="nccl", nproc_per_node=2, dtype="bfloat16",
                      base_env={"NCCL_NVLS_ENABLE": "0"}, configs={"p2p-off": {"NCCL_P2P_DISABLE": "1"}})
    proc = run_cli("sweep", spec, "--out", tmp_path / "r", "--no-confirm", "--explain", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    assert all(l["machine_state"]["available"] for l in run["launches"])
    assert (REPO / "sweeps").is_dir()
