"""Run the ACS/IOMMU audit on a GPU machine and check it against lspci and NVML, for the record.

    sudo python3 benchmarks/pcie_audit.py OUT_DIR      # from the repository root, with commdiag importable

Writes under OUT_DIR (a new folder): ``detect.json`` and ``detect.txt`` (``commdiag detect``),
``doctor.txt``, ``sysfs/`` (``--capture-sysfs``: the tree the audit read, a fixture candidate),
``lspci-vvv.txt`` when lspci is installed, and ``check.txt``: per bridge on a GPU path, commdiag's
ACSCtl line beside lspci's; per GPU, sysfs's link beside NVML's; the audit's own time (median and
spread of 20 runs).  Read-only on the machine: it changes no setting.  About 10-30 s.
"""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

ENV = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")


def run(args, out=None):
    r = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=300)
    if out:
        with open(out, "w") as f:
            f.write(r.stdout + (f"\n[stderr]\n{r.stderr}" if r.stderr.strip() else ""))
    return r


def lspci_acs(text):
    """BDF (short form) -> the ACSCtl line, from `lspci -vvv`."""
    out, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"^([0-9a-f]{4}:)?([0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ", line)
        if m:
            cur = m.group(2)
        elif cur and "ACSCtl:" in line:
            out[cur] = line.strip()
    return out


def main(out):
    os.makedirs(out)
    cli = [sys.executable, "-m", "commdiag.cli"]
    r = run(cli + ["detect", "--json", "--capture-sysfs", os.path.join(out, "sysfs")], os.path.join(out, "detect.json"))
    run(cli + ["detect"], os.path.join(out, "detect.txt"))
    run(cli + ["doctor"], os.path.join(out, "doctor.txt"))
    det = json.loads(r.stdout)
    audit = det["pcie"]
    lines = [f"euid {os.geteuid()}; audit available: {audit['available']}; IOMMU {audit['iommu'] and audit['iommu']['mode']}"]
    lspci = shutil.which("lspci")
    if lspci:
        text = run([lspci, "-vvv"], os.path.join(out, "lspci-vvv.txt")).stdout
        theirs = lspci_acs(text)
        for g in audit["gpus"]:
            for h in g["hops"][:-1]:
                ours = h["acs"]["lspci"] if h["acs"] else f"({h['acs_state']})"
                short = h["bdf"][5:]
                same = "same" if theirs.get(short) == ours else "DIFFERENT"
                lines.append(f"{h['bdf']} {h['kind']}: commdiag {ours!r} lspci {theirs.get(short)!r}: {same}")
    else:
        lines.append("lspci not installed: no ACSCtl comparison")
    nv = {g["bus"]: g for g in (det.get("nvml_readings") or {}).get("gpus", [])}
    for g in audit["gpus"]:
        link = g["hops"][-1]["link"] if g["hops"] else {}
        n = next((v for k, v in nv.items() if k.lower().endswith(g["bdf"][5:])), None)
        lines.append(f"GPU {g['bdf']}: sysfs gen{link.get('gen')} x{link.get('width')} (max gen{link.get('max_gen')} "
                     f"x{link.get('max_width')}); NVML " + (f"gen{n['pcie_gen']} x{n['pcie_width']} (max "
                                                            f"gen{n['pcie_gen_max']} x{n['pcie_width_max']})"
                                                            if n else "not read"))
    sys.path.insert(0, os.getcwd())
    from commdiag.environment import pcie
    times = []
    for _ in range(20):
        t = time.perf_counter()
        pcie.audit("/")
        times.append((time.perf_counter() - t) * 1e3)
    q = statistics.quantiles(times, n=10)
    lines.append(f"audit time: median {statistics.median(times):.2f} ms, p10 {q[0]:.2f}, p90 {q[-1]:.2f} "
                 f"(20 runs, after the CLI runs above)")
    with open(os.path.join(out, "check.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1])
