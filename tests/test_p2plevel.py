"""doctor on PCIe boxes with GPUs under different host bridges: NCCL's default (>= 2.23.4) keeps those
pairs off P2P; NCCL_P2P_LEVEL moves them.  NVML topologies constructed from the 2x H200 recording's
layout (tests/fixtures/h200x2-nvlink/nvml-readings.json), as test_detect.py does."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

from commdiag.environment import detect, doctor, envcheck, p2plevel, topology
from commdiag.formats.spec import load_spec
from conftest import REPO

FIX = Path(__file__).parent / "fixtures" / "h200x2-nvlink"
READINGS = json.loads((FIX / "nvml-readings.json").read_text())
PIX, NODE, SYS = 10, 40, 50  # nvmlGpuTopologyLevel_t


def pcie8(p2p_ok: bool = True) -> dict:
    """8 PCIe GPUs: pairs under one switch (0-1, 2-3 on CPU 0; 4-5, 6-7 on CPU 1): PIX within a switch,
    NODE across switches of one CPU, SYS across CPUs."""
    r = copy.deepcopy(READINGS)
    base = r["gpus"][0]
    r["gpus"] = []
    for i in range(8):
        g = copy.deepcopy(base)
        g.update(index=i, bus=f"00000000:{0x18 + 0x10 * i:02x}:00.0",
                 nvlinks=[[0, "err: NVMLError_NotSupported: Not Supported"]])
        r["gpus"].append(g)
    r["pairs"] = []
    for i in range(8):
        for j in range(8):
            if i != j:
                anc = PIX if i // 2 == j // 2 else NODE if i // 4 == j // 4 else SYS
                ok = 0 if p2p_ok else 5
                r["pairs"].append({"i": i, "j": j, "ancestor": anc, "READ": ok, "WRITE": ok, "NVLINK": 5,
                                   "ATOMICS": 5, "PROP": ok, "PCI": ok})
    return r


def two_gpus(ancestor: int) -> dict:
    r = pcie8()
    r["gpus"] = r["gpus"][:2]
    r["pairs"] = [dict(p, ancestor=ancestor) for p in r["pairs"] if p["i"] < 2 and p["j"] < 2]
    return r


def test_far_pairs_by_nvml_path():
    t = topology.analyze(pcie8())
    far = p2plevel.far_pairs(t)
    assert far["NODE"] == [(0, 2), (0, 3), (1, 2), (1, 3), (4, 6), (4, 7), (5, 6), (5, 7)]
    assert len(far["SYS"]) == 16 and far["SYS"][0] == (0, 4)
    assert p2plevel.far_pairs(topology.analyze(pcie8(p2p_ok=False))) == {}  # no P2P at all: another finding


def test_default_of_new_nccl_names_the_pairs_and_how_to_measure():
    t = topology.analyze(pcie8())
    ((sev, check, title, evidence, action),) = p2plevel.advice(t, ["2.28.9"], {})
    assert sev == "info" and check == "P2P across host bridges"
    assert title.startswith("NCCL 2.28.9 moves data through host memory (SHM), not P2P, between 24 GPU pair(s)")
    assert "0-2, 0-3, 0-4" in title and "and 12 more" in title
    assert "NODE: 0-2, 0-3, 1-2, 1-3, 4-6" in evidence and "SYS: 0-4" in evidence and "PXB" in evidence
    assert "sweeps/pcie8.yaml" in action and "p2p-sys" in action and "commdiag explain" in action
    assert "AMD" not in title  # 8 GPUs: NCCL's AMD exception (<= 2 GPUs) does not apply


def test_nccl_p2p_level_settings_move_the_pairs():
    t = topology.analyze(pcie8())
    ((sev, _, title, _, _),) = p2plevel.advice(t, ["2.28.9"], {"NCCL_P2P_LEVEL": ("SYS", "this environment")})
    assert sev == "ok" and "NCCL_P2P_LEVEL=SYS from this environment" in title and "all 24 pair(s)" in title
    ((sev, _, title, _, _),) = p2plevel.advice(t, ["2.28.9"], {"NCCL_P2P_LEVEL": ("PHB", "/etc/nccl.conf")})
    assert sev == "info" and "between 16 GPU pair(s): 0-4, 0-5" in title  # NODE pairs are NCCL's PHB
    ((_, _, title, _, _),) = p2plevel.advice(t, ["2.28.9"], {"NCCL_P2P_LEVEL": ("3", "x")})  # old number: PHB
    assert "between 16 GPU pair(s)" in title
    ((_, _, title, _, _),) = p2plevel.advice(t, ["2.28.9"], {"NCCL_P2P_DISABLE": ("1", "x")})
    assert "between 24 GPU pair(s)" in title
    assert p2plevel.user_level({"NCCL_P2P_LEVEL": "BOGUS"}) is None  # NCCL ignores an unknown name
    assert p2plevel.user_level({"NCCL_P2P_DISABLE": "0", "NCCL_P2P_LEVEL": "PXB"}) == "PXB"
    assert p2plevel.user_level({"NCCL_P2P_LEVEL": "12"}) == "SYS"


def test_older_and_unknown_nccl_versions():
    t = topology.analyze(pcie8())
    ((_, _, title, _, action),) = p2plevel.advice(t, ["2.21.5"], {})
    assert "NCCL 2.21.5 uses P2P between all 24 pair(s)" in title and "2.23.4 and newer does not" in title
    assert action.startswith("after an NCCL upgrade")
    ((_, _, title, _, _),) = p2plevel.advice(t, [None], {})
    assert title.startswith("NCCL 2.23.4 and newer (NCCL version not found here) moves data through host memory")
    ((_, _, title, _, _),) = p2plevel.advice(t, ["2.21.5", "2.28.9+cuda13.0"], {})
    assert title.startswith("NCCL 2.23.4 and newer (found 2.21.5, 2.28.9)")


def test_two_gpus_mention_the_amd_exception_and_close_pairs_need_nothing():
    ((_, _, title, _, _),) = p2plevel.advice(topology.analyze(two_gpus(SYS)), ["2.28.9"], {})
    assert "an AMD CPU with at most 2 GPUs keeps P2P" in title and ": 0-1" in title
    assert p2plevel.advice(topology.analyze(two_gpus(PIX)), ["2.28.9"], {}) == []
    assert p2plevel.advice(topology.analyze(READINGS), ["2.28.9"], {}) == []  # NVLink pair


def test_doctor_says_it_on_a_pcie8_box(tmp_path):
    det = detect.detect(current=False, nvml_readings=pcie8(), with_torch=False)
    env = envcheck.EnvCheck(1, "py", "none", [])
    (f,) = [f for f in doctor.findings(det, env) if f.check == "P2P across host bridges"]
    assert f.severity == "info" and "between 24 GPU pair(s)" in f.title  # NCCL's own default: not a fault
    rec = tmp_path / "pcie8.json"
    rec.write_text(json.dumps(pcie8()))
    full = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    full.update(NCCL_P2P_LEVEL="SYS", PYTHONPATH=str(REPO))
    cp = subprocess.run([sys.executable, "-m", "commdiag.cli", "doctor", "--nvml-replay", str(rec)],
                        capture_output=True, text=True, env=full, timeout=300)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "NCCL_P2P_LEVEL=SYS from this environment: NCCL may use P2P between all 24 pair(s)" in " ".join(
        cp.stdout.split())
    assert all(len(l) <= 100 for l in cp.stdout.splitlines())


def test_pcie8_spec_has_p2p_sys_alone_and_confirms_it():
    spec = load_spec(REPO / "sweeps" / "pcie8.yaml")
    (cfg,) = [c for c in spec.configs if c.name == "p2p-sys"]
    assert cfg.overrides == {"NCCL_P2P_LEVEL": "SYS"}
    assert "p2p-sys" in spec.confirm_configs
