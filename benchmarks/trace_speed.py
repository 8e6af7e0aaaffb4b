"""How fast, and in how much memory, ``commdiag trace`` reads a large Kineto trace (issue #33's target:
a 500 MB trace in under a minute on 2 cores).

Synthesises one rank's trace in torch.profiler's shape (tests/kineto_synth.py: per kernel its launch,
CPU operators and flow events, as a real server trace carries), then reads and analyses it in a fresh
child process, ``--repeats`` times, and prints each read's wall and CPU time and the child's peak RSS.

    .venv/bin/python benchmarks/trace_speed.py                 # ~500 MB plain JSON in a temporary folder
    .venv/bin/python benchmarks/trace_speed.py --mb 100 --gz   # gzipped
    .venv/bin/python benchmarks/trace_speed.py --json-load     # also json.load's peak RSS, for comparison
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
import kineto_synth  # noqa: E402

CHILD = r"""
import json, resource, sys, time
t0, c0 = time.monotonic(), time.process_time()
if sys.argv[2] == "json.load":
    import gzip
    d = json.load(gzip.open(sys.argv[1], "rt") if sys.argv[1].endswith(".gz") else open(sys.argv[1]))
    out = {"events": len(d["traceEvents"])}
else:
    from commdiag.trace import analyse_paths
    rep = analyse_paths([sys.argv[1]])
    out = {"steps": len(rep.ranks[0].steps), "verdict": rep.verdict, "headline": rep.headline}
out.update(wall_s=round(time.monotonic() - t0, 2), cpu_s=round(time.process_time() - c0, 2),
           peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=500, help="approximate size of the trace (default 500)")
    ap.add_argument("--gz", action="store_true", help="write it gzipped (.json.gz)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json-load", action="store_true", help="also time json.load of the same file (memory!)")
    ap.add_argument("--keep", metavar="PATH", help="write the trace here and keep it")
    args = ap.parse_args()
    # one layer of 4 kernels with filler=2 is ~6.4 KB of JSON (measured on a small trace below)
    probe = Path(tempfile.mkdtemp()) / "probe.json"
    kineto_synth.write(probe, "eager", steps=2, layers=50, filler=2)
    per_layer = probe.stat().st_size / 100
    probe.unlink()
    steps = 50
    layers = max(1, int(args.mb * 1e6 / per_layer / steps))
    path = Path(args.keep) if args.keep else Path(tempfile.mkdtemp()) / ("trace.json.gz" if args.gz else "trace.json")
    t0 = time.monotonic()
    kineto_synth.write(path, "eager", steps=steps, layers=layers, filler=2, gz=args.gz)
    size = path.stat().st_size
    raw = size
    if args.gz:
        import gzip
        with gzip.open(path, "rb") as f:
            raw = sum(len(b) for b in iter(lambda: f.read(1 << 24), b""))
    print(f"trace: {path}: {size / 1e6:.0f} MB on disk ({raw / 1e6:.0f} MB of JSON), {steps} steps x {layers} "
          f"layers x 4 kernels = {steps * layers * 4} kernels; written in {time.monotonic() - t0:.0f} s")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start; python {sys.version.split()[0]}")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    kinds = ["commdiag"] + (["json.load"] if args.json_load else [])
    for kind in kinds:
        walls = []
        for i in range(args.repeats if kind == "commdiag" else 1):
            out = subprocess.run([sys.executable, "-c", CHILD, str(path), kind], capture_output=True, text=True, env=env)
            if out.returncode != 0:
                print(f"{kind}: failed: {out.stderr[-800:]}")
                break
            r = json.loads(out.stdout)
            walls.append(r["wall_s"])
            print(f"{kind} read {i + 1}: {json.dumps(r)}")
        if walls:
            print(f"{kind}: wall {min(walls):.1f}-{max(walls):.1f} s over {len(walls)} reads (median "
                  f"{sorted(walls)[len(walls) // 2]:.1f} s), {raw / 1e6 / min(walls):.0f} MB/s at best")
    if not args.keep:
        path.unlink()


if __name__ == "__main__":
    main()
