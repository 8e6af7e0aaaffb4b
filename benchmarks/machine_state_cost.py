"""Per-launch cost of reading the machine's state, against a launch's time, measured in the same run.

Runs a small real sweep (gloo, 2 ranks, ``--launches`` launches: the launch path every sweep
uses) with the machine-state sampler opened as for an nccl run: NVML where this machine has it
(every GPU read before, every second during, and after each launch), the no-NVML path elsewhere.
The cost a launch pays is what it waits for: the reading before it and the one after it, timed
around ``Sampler.watch``; the reading thread's CPU time while the launch runs is in each launch's
record (``cpu_s``).  Target: under 1% of a launch's wall time.

gloo launches are shorter than nccl ones (about 3 s here vs 8-30 s with NCCL on GPUs), so the
ratio is an upper bound.  Where NVML sees a GPU, a child process runs matmuls on GPU 0 during the
launches (``--no-gpu-load`` to skip), so NVML lists a compute process and the GPU is under load,
as in a real nccl launch.

    python3 benchmarks/machine_state_cost.py [--launches 3] [--out DIR]

``--replay RECORDING --gpus N`` reads a recording (tests/fixtures/h200x1/nvml-capture.json) as if it
were NVML, its GPU repeated N times: on a machine without GPUs this measures commdiag's own part of
the NVML path (thread, collectors, records) for N GPUs; the driver's share is not in it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from commdiag.formats import results  # noqa: E402
from commdiag.formats.spec import load_spec  # noqa: E402
from commdiag.measure import machinestate, nvmlreplay, sweep  # noqa: E402

TARGET = 0.01
LOAD = ("import time, torch\nx = torch.randn(4096, 4096, device='cuda:0')\nend = time.time() + {s}\n"
        "while time.time() < end:\n    y = x @ x; torch.cuda.synchronize()\n")


class TimedSampler:
    """A sampler whose watches time what the launch waits for (enter + exit)."""

    def __init__(self, inner: machinestate.Sampler):
        self.inner, self.waits = inner, []

    def describe(self) -> dict:
        return self.inner.describe()

    def watch(self, is_own):
        return _TimedWatch(self.inner.watch(is_own), self.waits)


class _TimedWatch:
    def __init__(self, watch, waits):
        self.watch, self.waits, self.t = watch, waits, 0.0

    def __enter__(self):
        t0 = time.perf_counter()
        self.watch.__enter__()
        self.t = time.perf_counter() - t0
        return self

    def __exit__(self, *exc):
        t0 = time.perf_counter()
        self.watch.__exit__(*exc)
        self.waits.append(self.t + time.perf_counter() - t0)
        return False

    def record(self) -> dict:
        return self.watch.record()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--out", type=Path, help="keep the run folder here (default: a temporary folder)")
    ap.add_argument("--no-gpu-load", action="store_true")
    ap.add_argument("--replay", type=Path, help="an NVML recording to read instead of NVML")
    ap.add_argument("--gpus", type=int, default=1, help="with --replay: repeat its first GPU this often")
    args = ap.parse_args()
    nvml = None
    if args.replay:
        rec = json.loads(args.replay.read_text())
        gpu = (rec.get("snapshots") or [rec])[0]["gpus"][0]
        nvml = nvmlreplay.ReplayNvml({"gpus": [dict(gpu, index=i) for i in range(args.gpus)]})
    t0 = time.perf_counter()
    inner = machinestate.open_sampler("nccl", nvml=nvml)
    open_s = time.perf_counter() - t0
    sampler = TimedSampler(inner)
    load = None
    if inner.available and not args.no_gpu_load and not args.replay:
        load = subprocess.Popen([sys.executable, "-c", LOAD.format(s=30 + 12 * args.launches)])
        time.sleep(4.0)  # torch's CUDA init in the child: let it reach the GPU before the first launch
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = Path(tmp) / "cost.yaml"
        spec_path.write_text(yaml.safe_dump({
            "name": "machine-state-cost", "backend": "gloo", "nproc_per_node": 2, "dtype": "float32",
            "sizes": {"bytes": [4096]}, "trials": args.launches, "warmup": 2, "iters": 20, "timeout_s": 120}))
        run_dir = args.out or Path(tmp) / "run"
        try:
            sweep.run_sweep(load_spec(str(spec_path)), run_dir=run_dir, confirm=False, sampler=sampler)
        finally:
            if load is not None:
                load.kill()
                load.wait()
            inner.close()
        run = results.load_run_json(run_dir)
    launches = [l for l in run["launches"] if l.get("wall_s")]
    state = run["machine_state"]
    what = (f"{'a replayed recording' if args.replay else 'NVML'}, {len(state['gpus'])} GPU(s) read, "
            f"a reading every {state['period_s']:g} s"
            if state["available"] else f"no NVML: {state['reason']}")
    print(f"machine-state cost: {len(launches)} gloo launches of 2 ranks")
    print(textwrap.fill(f"machine state: {what}", 100, subsequent_indent="  "))
    print(f"opening the sampler (once per run): {open_s * 1000:.1f} ms")
    print(f"{'launch':>6} {'wall s':>8} {'wait ms':>8} {'wait %':>7} {'readings':>8} {'thread CPU ms':>13}")
    for l, wait in zip(launches, sampler.waits):
        m = l.get("machine") or {}
        print(f"{l['index']:>6} {l['wall_s']:>8.3f} {wait * 1000:>8.3f} {wait / l['wall_s']:>7.3%} "
              f"{m.get('samples', '-'):>8} {(m['cpu_s'] * 1000 if 'cpu_s' in m else float('nan')):>13.2f}")
    walls = [l["wall_s"] for l in launches]
    waits = sampler.waits[:len(launches)]
    share = [w / x for w, x in zip(waits, walls)]
    print(f"wait per launch: median {statistics.median(waits) * 1000:.3f} ms [{min(waits) * 1000:.3f}-"
          f"{max(waits) * 1000:.3f}] over {len(waits)} launches")
    print(f"launch wall: median {statistics.median(walls):.2f} s [{min(walls):.2f}-{max(walls):.2f}]")
    print(f"cost: median {statistics.median(share):.3%} of a launch [{min(share):.3%}-{max(share):.3%}]; "
          f"target < {TARGET:.0%}: {'met' if statistics.median(share) < TARGET else 'NOT met'}"
          + ("" if max(share) < TARGET else f" (not by the worst launch, {max(share):.2%})"))
    cpu = [l["machine"]["cpu_s"] / l["wall_s"] for l in launches if (l.get("machine") or {}).get("cpu_s")]
    if cpu:
        print(f"reading thread while a launch runs: median {statistics.median(cpu):.3%} of one core "
              f"[{min(cpu):.3%}-{max(cpu):.3%}]")
    others = {(o["pid"], o["name"]) for l in launches for o in (l.get("machine") or {}).get("others", [])}
    if others:
        print("other compute processes seen: " + ", ".join(f"pid {p} ({n})" for p, n in sorted(others)))


if __name__ == "__main__":
    main()
