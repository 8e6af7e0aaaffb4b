"""benchmarks/p2p_reference.py reads p2pBandwidthLatencyTest's output.  The output here is constructed
with the sample's own printf formats (Samples/5_Domain_Specific/p2pBandwidthLatencyTest/
p2pBandwidthLatencyTest.cu at NVIDIA/cuda-samples c94ff366: "%6d ", "%6.02f ", "   D\\D", "   GPU")."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _module():
    spec = importlib.util.spec_from_file_location("p2p_reference", REPO / "benchmarks" / "p2p_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sample_output(m: dict[str, list[list[float]]]) -> str:
    n = len(next(iter(m.values())))
    out = ["[p2pBandwidthLatencyTest]", "Device: 0, NVIDIA H200, pciBusID: 6, pciDeviceID: 0, pciDomainID:0",
           "P2P Connectivity Matrix", "     D\\D" + "".join(f"{j:6d}" for j in range(n))]
    out += [f"{i:6d}\t" + "".join(f"{1:6d}" for _ in range(n)) for i in range(n)]

    def block(title, key, head="   D\\D", cpu=False):
        out.append(title)
        out.append(head + "".join(f"{j:6d} " for j in range(n)))
        out.extend(f"{i:6d} " + "".join(f"{v:6.02f} " for v in m[key][i]) for i in range(n))
        if cpu:
            out.append("")
            out.append("   CPU" + "".join(f"{j:6d} " for j in range(n)))
            out.extend(f"{i:6d} " + "".join(f"{99.0:6.02f} " for _ in range(n)) for i in range(n))

    block("Unidirectional P2P=Disabled Bandwidth Matrix (GB/s)", "uni_off")
    block("Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)", "uni_on")
    block("Bidirectional P2P=Disabled Bandwidth Matrix (GB/s)", "bi_off")
    block("Bidirectional P2P=Enabled Bandwidth Matrix (GB/s)", "bi_on")
    block("P2P=Disabled Latency Matrix (us)", "lat_off", "   GPU", cpu=True)
    block("P2P=Enabled Latency (P2P Writes) Matrix (us)", "lat_on", "   GPU", cpu=True)
    out.append("\nNOTE: The CUDA Samples are not meant for performance measurements. Results may vary when GPU Boost "
               "is enabled.")
    return "\n".join(out) + "\n"


def test_parse_reads_every_matrix_and_only_the_gpu_timed_latency(tmp_path, capsys):
    mod = _module()
    m = {"uni_off": [[2000.0, 20.5], [21.5, 2001.0]], "uni_on": [[4300.12, 55.0], [54.0, 4299.0]],
         "bi_off": [[4000.0, 30.0], [31.0, 4001.0]], "bi_on": [[4100.0, 110.0], [111.0, 4101.0]],
         "lat_off": [[2.1, 14.0], [14.5, 2.2]], "lat_on": [[2.0, 0.4], [0.41, 2.0]]}
    parsed = mod.parse(sample_output(m))
    assert parsed == m
    res = {"gpus": [{"index": 0, "local": {"median": 4200.0, "lo": 4100.0, "hi": 4250.0, "n": 7}},
                    {"index": 1, "local": None}],
           "pairs": [{"a": 0, "b": 1, "p2p_ab": {"median": 50.0, "lo": 49.0, "hi": 51.0, "n": 7},
                      "p2p_ba": {"median": 54.5, "lo": 54.0, "hi": 55.0, "n": 7}}]}
    (tmp_path / "p2p.json").write_text(json.dumps(res))
    (tmp_path / "ref.txt").write_text(sample_output(m))
    assert mod.main(["x", str(tmp_path / "p2p.json"), str(tmp_path / "ref.txt")]) == 0
    out = capsys.readouterr().out
    assert "GPU0 local copy GB/s" in out and "0.977  yes" in out  # 4200 / 4300.12
    assert "0->1 p2p GB/s" in out and "0.909  yes" in out  # 50 / 55: 9.1% under
    assert "1->0 p2p GB/s" in out and "1.009  yes" in out
    assert "every gated value within 10%" in out
    assert max(len(l) for l in out.splitlines()) <= 100
