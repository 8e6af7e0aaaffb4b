"""Capture what the PCIe half reads from a GPU machine, as fixtures: a sysfs tree of every PCI device
(attributes, config space, IOMMU group, the device path), /proc/cmdline, the IOMMU listing, NVML
readings per GPU, where libnccl lives and a 1-rank NCCL init log.  Read-only; writes only under OUT.

    python3 benchmarks/gpu_capture.py OUT_DIR
"""
import json
import os
import subprocess
import sys
import time

ATTRS = ("vendor", "device", "class", "subsystem_vendor", "subsystem_device", "revision",
         "current_link_speed", "current_link_width", "max_link_speed", "max_link_width",
         "numa_node", "local_cpulist", "enable", "ari_enabled")


def _read(path, binary=False):
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 16)
        return data if binary else data.decode(errors="replace")
    except OSError as e:
        return None if binary else f"<unreadable: {e.strerror}>"


def capture_sysfs(out):
    root = os.path.join(out, "sysroot")
    devs = "/sys/bus/pci/devices"
    seen = set()
    for bdf in sorted(os.listdir(devs)):
        real = os.path.realpath(os.path.join(devs, bdf))
        # every ancestor that is a PCI device too (bridges, root ports)
        chain = []
        p = real
        while p.startswith("/sys/devices/pci"):
            chain.append(p)
            p = os.path.dirname(p)
        for d in chain:
            if d in seen:
                continue
            seen.add(d)
            dst = root + d
            os.makedirs(dst, exist_ok=True)
            for a in ATTRS:
                v = _read(os.path.join(d, a))
                if v is not None and not v.startswith("<unreadable"):
                    open(os.path.join(dst, a), "w").write(v)
            cfg = _read(os.path.join(d, "config"), binary=True)
            if cfg is not None:
                open(os.path.join(dst, "config"), "wb").write(cfg)
            for link in ("iommu_group", "driver"):
                lp = os.path.join(d, link)
                if os.path.islink(lp):
                    tgt = os.path.realpath(lp)
                    os.symlink(os.path.relpath(root + tgt, dst), os.path.join(dst, link))
                    os.makedirs(root + tgt, exist_ok=True)
            t = _read(os.path.join(d, "iommu_group", "type"))
            if t and not t.startswith("<unreadable"):
                g = os.path.realpath(os.path.join(d, "iommu_group"))
                open(root + g + "/type", "w").write(t)
        os.makedirs(root + devs, exist_ok=True)
        os.symlink(os.path.relpath(root + real, root + devs), os.path.join(root + devs, bdf))
    for d in ("/sys/class/iommu", "/sys/kernel/iommu_groups"):
        try:
            names = os.listdir(d)
        except OSError:
            names = None
        os.makedirs(root + d, exist_ok=True)
        json.dump(names, open(os.path.join(out, d.strip("/").replace("/", "_") + ".json"), "w"))
    os.makedirs(root + "/proc", exist_ok=True)
    open(root + "/proc/cmdline", "w").write(_read("/proc/cmdline") or "")


def capture_nvml(out):
    try:
        import pynvml as n
        n.nvmlInit()
    except Exception as e:  # noqa: BLE001 - a capture records what it could not read
        json.dump({"error": repr(e)}, open(os.path.join(out, "nvml.json"), "w"))
        return
    def call(fn, *a):
        try:
            v = fn(*a)
            if isinstance(v, bytes):
                v = v.decode()
            return v
        except Exception as e:  # noqa: BLE001
            return {"error": repr(e)}
    res = {"driver": call(n.nvmlSystemGetDriverVersion), "nvml": call(n.nvmlSystemGetNVMLVersion),
           "cuda_driver": call(n.nvmlSystemGetCudaDriverVersion_v2), "gpus": []}
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        pci = call(n.nvmlDeviceGetPciInfo, h)
        g = {"index": i, "name": call(n.nvmlDeviceGetName, h), "uuid": call(n.nvmlDeviceGetUUID, h),
             "pci_bus_id": pci.busId.decode() if hasattr(pci, "busId") and isinstance(pci.busId, bytes) else getattr(pci, "busId", pci),
             "sm_clock": call(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
             "mem_clock": call(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM),
             "max_sm_clock": call(n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_SM),
             "clocks_event_reasons": call(getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", n.nvmlDeviceGetCurrentClocksThrottleReasons), h),
             "supported_clocks_event_reasons": call(getattr(n, "nvmlDeviceGetSupportedClocksEventReasons", n.nvmlDeviceGetSupportedClocksThrottleReasons), h),
             "temperature": call(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU),
             "power_mw": call(n.nvmlDeviceGetPowerUsage, h),
             "power_limit_mw": call(n.nvmlDeviceGetEnforcedPowerLimit, h),
             "pstate": call(n.nvmlDeviceGetPerformanceState, h),
             "pcie_gen": call(n.nvmlDeviceGetCurrPcieLinkGeneration, h),
             "pcie_width": call(n.nvmlDeviceGetCurrPcieLinkWidth, h),
             "pcie_max_gen": call(n.nvmlDeviceGetMaxPcieLinkGeneration, h),
             "pcie_max_width": call(n.nvmlDeviceGetMaxPcieLinkWidth, h),
             "pcie_gpu_max_gen": call(getattr(n, "nvmlDeviceGetGpuMaxPcieLinkGeneration", lambda h: None), h),
             "pcie_replay_counter": call(n.nvmlDeviceGetPcieReplayCounter, h),
             "pcie_tx_kbps": call(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_TX_BYTES),
             "utilization": call(lambda h: vars(n.nvmlDeviceGetUtilizationRates(h)) if False else
                                 {"gpu": n.nvmlDeviceGetUtilizationRates(h).gpu, "memory": n.nvmlDeviceGetUtilizationRates(h).memory}, h),
             "processes": call(lambda h: [{"pid": p.pid, "used_gpu_memory": p.usedGpuMemory}
                                          for p in n.nvmlDeviceGetComputeRunningProcesses(h)], h)}
        res["gpus"].append(g)
    json.dump(res, open(os.path.join(out, "nvml.json"), "w"), indent=1, default=str)
    return res


def capture_libnccl(out):
    lines = []
    for cmd in (["ldconfig", "-p"], ["lspci", "-vvv"], ["lspci", "-tv"], ["nvidia-smi", "topo", "-m"],
                ["nvidia-smi", "-q", "-d", "CLOCK,PERFORMANCE,TEMPERATURE,POWER"], ["dmesg"]):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            text = r.stdout + r.stderr
        except Exception as e:  # noqa: BLE001
            text = f"<{cmd[0]} failed: {e!r}>"
        name = "-".join(c.strip("-") for c in cmd) + ".txt"
        if cmd[0] == "ldconfig":
            text = "\n".join(l for l in text.splitlines() if "nccl" in l.lower() or "cuda" in l.lower())
        open(os.path.join(out, name), "w").write(text)
    probe = r'''
import ctypes, os, torch
print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())
torch.cuda.init(); torch.zeros(1, device="cuda")
import torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29591")
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
t = torch.ones(1 << 20, device="cuda"); dist.all_reduce(t); torch.cuda.synchronize()
for l in open("/proc/self/maps"):
    if "nccl" in l: print("MAPPED", l.split()[-1])
dist.destroy_process_group()
try:
    h = ctypes.CDLL("libnccl.so.2"); v = ctypes.c_int(); h.ncclGetVersion(ctypes.byref(v)); print("dlopen libnccl.so.2 version", v.value)
except OSError as e: print("dlopen libnccl.so.2 failed", e)
'''
    env = dict(os.environ, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,ENV,GRAPH,TUNING")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    open(os.path.join(out, "nccl-1rank-init.log"), "w").write(r.stdout + r.stderr)


if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    t = time.time()
    capture_sysfs(out)
    capture_nvml(out)
    capture_libnccl(out)
    t0 = time.perf_counter()
    for _ in range(20):
        capture_nvml(out)
    print(f"one full NVML reading of every GPU: {(time.perf_counter() - t0) / 20 * 1e3:.2f} ms (mean of 20)")
    print(f"captured in {time.time() - t:.1f} s under {out}")
