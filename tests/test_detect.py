"""detect and doctor: topology from recorded NVML readings, the real no-driver path, hooks of real venvs."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from commdiag.environment import doctor, envcheck, topology
from conftest import REPO, words

FIX = Path(__file__).parent / "fixtures" / "h200x2-nvlink"
READINGS = json.loads((FIX / "nvml-readings.json").read_text())
DEBIAN_PY = "/usr/bin/python3.11"


def cli(*args, env=None):
    full = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    full.update(env or {})
    full["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "commdiag.cli", *map(str, args)], capture_output=True, text=True,
                          env=full, timeout=300)


def pcie_readings(p2p_ok: bool, ancestor: int = 30, nvlink_pair=None) -> dict:
    """The recording, edited into a 3-GPU PCIe box: no NVLink, P2P as given, one common ancestor."""
    r = copy.deepcopy(READINGS)
    g = copy.deepcopy(r["gpus"][0])
    g.update(index=2, bus="00000000:00:08.0")
    r["gpus"].append(g)
    for gpu in r["gpus"]:
        gpu["nvlinks"] = [[0, "err: NVMLError_NotSupported: Not Supported"]]
    r["pairs"] = []
    for i in range(3):
        for j in range(3):
            if i != j:
                nv = nvlink_pair is not None and {i, j} == set(nvlink_pair)
                r["pairs"].append({"i": i, "j": j, "ancestor": ancestor, "READ": 0 if p2p_ok or nv else 5,
                                   "WRITE": 0 if p2p_ok or nv else 5, "NVLINK": 0 if nv else 5, "ATOMICS": 5,
                                   "PROP": 0 if p2p_ok else 5, "PCI": 0 if p2p_ok else 5})
    return r


def test_recorded_h200_pair_is_nvlink_like_nvidia_smi():
    t = topology.analyze(READINGS)
    assert t.available and t.classification == topology.NVLINK
    assert (t.driver, t.cuda_driver) == ("580.159.04", "13.0")
    assert [(g.name, g.bus_id, g.pcie_gen, g.pcie_width, g.pcie_gen_max, g.numa, g.active_links) for g in t.gpus] == [
        ("NVIDIA H200", "00000000:00:06.0", 5, 16, 5, None, 18), ("NVIDIA H200", "00000000:00:07.0", 5, 16, 5, None, 18)]
    p = t.pair(0, 1)
    assert p.path == "PHB" and p.nvlinks == 18 and p.label == "NV18"
    assert p.p2p["WRITE"] == "OK" and p.p2p["PCI"] == "NOT_SUPPORTED" and p.p2p["READ"].startswith("err")
    # the same cells as the recorded `nvidia-smi topo -m`
    smi = (FIX / "nvidia-smi-topo-m.txt").read_text()
    smi_rows = {l.split("\t")[0]: [c.strip() for c in l.split("\t")[1:3]] for l in smi.splitlines() if l.startswith("GPU")}
    ours = {l.split("\t")[0]: [c.strip() for c in l.split("\t")[1:3]] for l in t.matrix().splitlines() if l.startswith("GPU")}
    assert ours == smi_rows == {"GPU0": ["X", "NV18"], "GPU1": ["NV18", "X"]}
    assert "does not change the path" in t.advice[0]


def test_pcie_classifications_and_p2p_level_advice():
    t = topology.analyze(pcie_readings(True, ancestor=30))
    assert t.classification == topology.PCIE_P2P and t.pair(0, 2).label == "PHB"
    assert any("NCCL_P2P_LEVEL=SYS" in a for a in t.advice)
    t = topology.analyze(pcie_readings(True, ancestor=20))
    assert t.classification == topology.PCIE_P2P and not any("NCCL_P2P_LEVEL=SYS" in a for a in t.advice)
    t = topology.analyze(pcie_readings(False, ancestor=50))
    assert t.classification == topology.PCIE_NO_P2P and t.pair(1, 2).label == "SYS"
    assert "has no effect" in t.advice[0]
    t = topology.analyze(pcie_readings(False, ancestor=40, nvlink_pair=(0, 1)))
    assert t.classification == topology.MIXED and t.has_nvlink
    assert "Mixed topology" in t.advice[0] and "0-1 NV" in t.advice[0] and "0-2 NODE" in t.advice[0]


def test_no_driver_path_for_real():
    """This CI machine has no NVIDIA driver: topology is one line, the rest of detect works."""
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has an NVIDIA driver")
    cp = cli("detect")
    assert cp.returncode == 0, cp.stderr
    lines = [l for l in cp.stdout.splitlines() if l.startswith("Topology")]
    assert len(lines) == 1 and lines[0].startswith("Topology: unavailable: NVML")
    assert "Python hooks" in cp.stdout and "python 3." in cp.stdout
    out = json.loads(cli("detect", "--json").stdout)
    assert out["format"] == "commdiag-detect" and out["topology"]["available"] is False
    assert out["pythons"][0]["hooks"]["executable"] and out["nvml_readings"] is None


def test_detect_exits_1_when_an_interpreter_cannot_be_probed(tmp_path):
    # README "Exit codes": detect exits 1 when a check ran and found a problem (doctor already did)
    cp = cli("detect", "--python", tmp_path / "no-such-python")
    assert cp.returncode == 1, cp.stdout
    assert f"{tmp_path / 'no-such-python'}: no such interpreter" in words(cp.stdout)  # wrapped at 100 columns
    cp = cli("detect", "--json", "--python", tmp_path / "no-such-python")
    assert cp.returncode == 1 and json.loads(cp.stdout)["pythons"][1]["error"]


@pytest.mark.skipif(not os.path.exists(DEBIAN_PY), reason="needs Debian's python3.11")
def test_detect_and_doctor_report_a_shadowed_venv_sitecustomize(tmp_path):
    subprocess.run([DEBIAN_PY, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True, timeout=120)
    mine = tmp_path / "v" / "lib" / "python3.11" / "site-packages" / "sitecustomize.py"
    mine.write_text("import os\nos.environ.setdefault('NCCL_PROTO', 'LL')\n")
    py = tmp_path / "v" / "bin" / "python"
    out = json.loads(cli("detect", "--json", "--python", py).stdout)
    hooks = {p["python"]: p["hooks"] for p in out["pythons"]}[str(py)]
    assert hooks["sitecustomize"] == "/usr/lib/python3.11/sitecustomize.py"
    assert hooks["shadowed_sitecustomize"] == [str(mine)]
    text = cli("detect", "--python", py).stdout
    assert f"SHADOWED (will not load): {mine}" in words(text) and "-> /etc/python3.11/sitecustomize.py" in text
    cp = cli("doctor", "--json", "--python", py, "--nvml-replay", FIX / "nvml-readings.json")
    rep = json.loads(cp.stdout)
    assert cp.returncode == 1 and rep["healthy"] is False
    f = [f for f in rep["findings"] if f["check"] == f"hooks {py}"][0]
    assert f["severity"] == "warning" and "shadowed by /usr/lib/python3.11/sitecustomize.py" in f["title"]
    assert f"commdiag install-hook --python {py}" in f["action"]


def test_doctor_ll128_on_pcie_is_critical_and_ranked_first(tmp_path):
    rec = tmp_path / "pcie.json"
    rec.write_text(json.dumps(pcie_readings(True)))
    cp = cli("doctor", "--json", "--nvml-replay", rec, "--expect", "NCCL_PROTO=LL128", env={"NCCL_PROTO": "LL128"})
    rep = json.loads(cp.stdout)
    assert cp.returncode == 1
    first = rep["findings"][0]
    assert first["severity"] == "critical" and first["check"] == "NCCL_PROTO vs topology"
    assert "NCCL_PROTO=LL128 on a PCIe topology: NCCL documents possible data corruption" == first["title"]
    sev = [doctor.SEVERITY[f["severity"]] for f in rep["findings"]]
    assert sev == sorted(sev, reverse=True)
    # the ^ exclusion form does not ask for LL128
    cp = cli("doctor", "--json", "--nvml-replay", rec, env={"NCCL_PROTO": "^LL128"})
    assert not any(f["check"] == "NCCL_PROTO vs topology" for f in json.loads(cp.stdout)["findings"])


def test_doctor_nvls_without_nvlink_and_healthy_nvlink_machine(tmp_path):
    rec = tmp_path / "pcie.json"
    rec.write_text(json.dumps(pcie_readings(False)))
    rep = json.loads(cli("doctor", "--json", "--nvml-replay", rec, env={"NCCL_ALGO": "NVLS,Ring"}).stdout)
    f = [f for f in rep["findings"] if f["check"] == "NCCL_ALGO vs topology"]
    assert f and f[0]["severity"] == "warning" and "without NVLink" in f[0]["title"]
    # the recorded NVLink machine with the settings arriving: healthy, exit 0, every check recorded
    cp = cli("doctor", "--nvml-replay", FIX / "nvml-readings.json", "--expect", "NCCL_PROTO=LL",
             "--expect", "NCCL_ALGO=NVLS", env={"NCCL_PROTO": "LL", "NCCL_ALGO": "NVLS"})
    assert cp.returncode == 0, cp.stdout
    assert re.search(r"\[OK\s*\] env NCCL_PROTO: NCCL_PROTO=LL as expected", cp.stdout)
    assert "[OK      ] topology: 2 GPU(s): nvlink" in cp.stdout and cp.stdout.rstrip().splitlines()[-1].startswith("healthy")


def test_detect_json_is_itself_a_replayable_recording(tmp_path):
    first = cli("detect", "--json", "--nvml-replay", FIX / "nvml-readings.json")
    d = json.loads(first.stdout)
    assert d["topology"]["classification"] == "nvlink" and d["versions"]["driver"] == "580.159.04"
    (tmp_path / "detect.json").write_text(first.stdout)
    again = json.loads(cli("detect", "--json", "--nvml-replay", tmp_path / "detect.json").stdout)
    assert again["topology"] == d["topology"]


def test_findings_from_a_missing_expected_variable():
    det = __import__("commdiag.environment.detect", fromlist=["detect"]).detect(current=False, nvml_readings=READINGS,
                                                                       with_torch=False)
    env = envcheck.EnvCheck(1, "py", "--expect", [envcheck.VarCheck("NCCL_ALGO", "Ring", None, None, "missing", "x")])
    f = doctor.findings(det, env)
    assert f[0].severity == "critical" and f[0].check == "env NCCL_ALGO" and "install-hook" in f[0].action


def test_detect_recorded_live_on_a_real_h200_replays():
    """The live NVML reader's output on real hardware (1x H200) replays to the same topology."""
    rec = Path(__file__).parent / "fixtures" / "h200x1" / "detect.json"
    recorded = json.loads(rec.read_text())
    assert recorded["nvml_readings"]["gpus"][0]["name"] == "NVIDIA H200"
    again = json.loads(cli("detect", "--json", "--nvml-replay", rec).stdout)
    topo = again["topology"]
    assert topo["classification"] == "single-gpu" and topo["pairs"] == []
    gpu = topo["gpus"][0]
    assert (gpu["bus_id"], gpu["pcie_gen"], gpu["pcie_width"]) == ("00000000:00:06.0", 5, 16)
    assert topo == recorded["topology"]
    # that machine's venv loads Debian's system sitecustomize, through its /etc symlink
    hooks = recorded["pythons"][0]["hooks"]
    assert hooks["sitecustomize"] == "/usr/lib/python3.12/sitecustomize.py"
    assert hooks["sitecustomize_target"] == "/etc/python3.12/sitecustomize.py"


def test_detect_recorded_live_on_two_nvlink_h200s_replays():
    """Live NVML on 2x H200 (NV18): classified nvlink, and the advice says P2P_LEVEL changes nothing."""
    rec = FIX / "detect-live.json"
    recorded = json.loads(rec.read_text())
    again = json.loads(cli("detect", "--json", "--nvml-replay", rec).stdout)["topology"]
    assert again == recorded["topology"]
    assert again["classification"] == "nvlink" and len(again["gpus"]) == 2
    assert {p["label"] for p in again["pairs"]} == {"NV18"}
    assert any("NCCL_P2P_DISABLE=1" in a for a in again["advice"])


def test_torch_build_reads_torch_version_py_without_importing_torch(tmp_path):
    """detect and doctor learn a CPU torch's version from torch/version.py (importing torch to find it has
    no NCCL takes seconds); a CUDA build is still imported to ask its NCCL; anything unexpected: None."""
    import torch

    from commdiag.environment import detect

    assert detect.torch_build() == (torch.__version__, torch.version.cuda)  # this interpreter's real torch
    cases = {
        "from typing import Optional\n__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\n": ("2.11.0+cu130",
                                                                                                       "13.0"),
        "__version__ = '2.13.0+cpu'\ncuda = None\n": ("2.13.0+cpu", None),
        "__version__ = '2.13.0'\n": None,  # no cuda line: unknown, so torch is imported as before
        "__version__ = '2.13.0'\ncuda = get()\n": None,
        "__version__ = (\n": None,
    }
    for n, (text, expected) in enumerate(cases.items()):
        folder = tmp_path / f"t{n}"
        folder.mkdir()
        (folder / "version.py").write_text(text)
        assert detect.torch_build(str(folder)) == expected, text
    assert detect.torch_build(str(tmp_path / "missing")) is None
    # and the versions detect reports in a fresh interpreter, where torch is not imported yet, are torch's own
    proc = subprocess.run([sys.executable, "-c", "import sys, json; from commdiag.environment import detect, "
                           "topology; v = detect.collect_versions(topology.unavailable('t')); "
                           "print(json.dumps([v['torch'], v['torch_cuda'], 'torch' in sys.modules]))"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    version, cuda, imported = json.loads(proc.stdout)
    assert (version, cuda) == (torch.__version__, torch.version.cuda)
    assert imported == bool(torch.version.cuda)  # only a CUDA build is imported (to ask for its NCCL)
