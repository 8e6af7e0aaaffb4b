#!/usr/bin/env bash
# Raw NVML readings of commdiag's machine-state sampler on a GPU machine, as a replayable recording:
#   bash benchmarks/gpu_machine_state.sh        # writes $OUT/nvml-machine-state.json (about 25 s)
# Snapshots: "idle"; "load-1".."load-3" while a child process (its pid in load_pids) runs matmuls on
# GPU 0, so NVML lists a compute process and the GPU is under load; "after" once the child exited.
# Each snapshot holds, per GPU, every field the sampler reads (measure/machinestate.py) plus every
# call nvmlreplay.CALLS knows (both clock-event APIs' raw bitmasks, the supported mask, max clock),
# failed calls as "err: TYPE: message", and each process's name.  read_ms: what one full and one
# quick reading of all GPUs cost, median of 20, idle and under load.  Reads only; changes nothing.
# Copy the file to tests/fixtures/h200x1/ (or the 2-GPU folder) to replay it in tests.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 120 python3 - "$OUT/nvml-machine-state.json" <<'PY'
import datetime as dt, json, statistics, subprocess, sys, time

import pynvml

from commdiag.measure import machinestate, nvmlreplay

LOAD_S = 12.0
s = machinestate.open_sampler("nccl")
if not s.available:
    sys.exit(f"no NVML here: {s.reason}")
t_start = time.monotonic()


def plain(v):
    return v.decode(errors="replace") if isinstance(v, bytes) else v


def snapshot(label):
    gpus = s.read(machinestate.FULL, record_errors=True)
    for g, h in zip(gpus, s.handles):
        for (fn, args), field in nvmlreplay.CALLS.items():
            if field in g:
                continue
            try:
                g[field] = plain(getattr(pynvml, fn)(h, *args))
            except Exception as e:
                g[field] = machinestate.error_text(e)
        g["pci_bus_id"] = s.gpus[g["index"]].get("pci_bus_id")
        for p in g.get("processes") if isinstance(g.get("processes"), list) else []:
            try:
                p["name"] = plain(pynvml.nvmlSystemGetProcessName(p["pid"]))
            except Exception as e:
                p["name"] = machinestate.error_text(e)
    return {"label": label, "t_s": round(time.monotonic() - t_start, 3), "gpus": gpus}


def read_ms(phase, n=20):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        s.read(phase)
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 3)


snaps = [snapshot("idle")]
cost = {"idle": {"full": read_ms(machinestate.FULL), "quick": read_ms(machinestate.QUICK)}}
load = subprocess.Popen([sys.executable, "-c",
                         "import time, torch\n"
                         "x = torch.randn(8192, 8192, device='cuda:0')\n"
                         f"end = time.time() + {LOAD_S}\n"
                         "while time.time() < end:\n"
                         "    y = x @ x; torch.cuda.synchronize()\n"])
deadline = time.monotonic() + 60
while time.monotonic() < deadline and load.poll() is None:  # until NVML lists the busy child on GPU 0
    g = s.read(machinestate.QUICK)[0]
    if any(p["pid"] == load.pid for p in g.get("processes", [])) and machinestate.loaded(g):
        break
    time.sleep(0.2)
for i in range(1, 4):
    time.sleep(1.0)
    snaps.append(snapshot(f"load-{i}"))
cost["load"] = {"full": read_ms(machinestate.FULL), "quick": read_ms(machinestate.QUICK)}
load.wait(timeout=60)
time.sleep(1.0)
snaps.append(snapshot("after"))
rec = {"format": "commdiag-nvml-recording", "version": 1,
       "recorded_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
       "driver": plain(pynvml.nvmlSystemGetDriverVersion()), "nvml": plain(pynvml.nvmlSystemGetNVMLVersion()),
       "cuda_driver": pynvml.nvmlSystemGetCudaDriverVersion(), "nvidia_ml_py": getattr(pynvml, "__version__", None),
       "gpus": s.gpus, "load_pids": [load.pid], "load_exit": load.returncode,
       "read_ms": cost, "snapshots": snaps}
s.close()
with open(sys.argv[1], "w") as f:
    json.dump(rec, f, indent=1)
print(f"wrote {sys.argv[1]}: {len(snaps)} snapshots of {len(s.gpus)} GPU(s)")
print(f"load pid {load.pid} (exit {load.returncode}); one reading of all GPUs, median of 20 (ms):")
print(f"  {json.dumps(cost)}")
for sn in snaps:
    g = sn["gpus"][0]
    util = g.get("utilization")
    print(f"  {sn['label']:<7} t={sn['t_s']:6.2f}s SM {g.get('sm_clock')} mem {g.get('mem_clock')} MHz "
          f"events {g.get('clocks_event_reasons')} {g.get('temperature')} C {g.get('power_mw')} mW "
          f"Gen{g.get('pcie_gen')} x{g.get('pcie_width')} util {util.get('gpu') if isinstance(util, dict) else util}"
          f" pids {[p.get('pid') for p in g.get('processes', []) if isinstance(p, dict)]}"[:100])
PY
echo "rc=$?"
