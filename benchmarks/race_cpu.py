"""#31's CPU benchmark: a pcie8-shaped gloo sweep under today's settings against the new defaults, one
pair of sweeps in one run, and the ratio of their wall times.

The spec is pcie8's shape scaled to gloo (27 configs: default + seed + debug-off + the same 3x2x2x2 NCCL
grid; 15 sizes, 1-8192 tokens of a small hidden; 3 trials; 2 ranks).  gloo never loads NCCL, so every
NCCL_* config is an A/A twin of default.  The hidden real effect: base_env sets
TORCH_DISTRIBUTED_DEBUG=DETAIL (torch wraps every collective in a consistency check, read at import: the
fork server starts a server group with it), and ``debug-off`` sets OFF.  confirm.configs names
debug-off (it must come out certified faster where the effect is real) and seed (an A/A twin: it must
never be certified).

    today:  --set time_per_size_ms=null --set racing=false   (every size iters samples, every launch)
    new:    the defaults (time_per_size_ms: 25, warmup within a tenth of it, racing: true)

Printed: each sweep's wall time, launches per status, the certified claims, and new/today.  Done when
new/today <= 0.35, the certified claims on debug-off are the same in both, and nothing is certified on
an A/A twin (#31).

    .venv/bin/python benchmarks/race_cpu.py [--hidden 64] [--iters 200] [--warmup 20] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

SPEC = """\
name: race-cpu
description: pcie8's shape on gloo (#31 benchmark); debug-off is the hidden real effect
backend: gloo
nproc_per_node: 2
dtype: float32
sizes:
  hidden: {hidden}
  tokens: [1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
trials: 3
warmup: {warmup}
iters: {iters}
timeout_s: 300
base_env: {{NCCL_NVLS_ENABLE: "0", TORCH_DISTRIBUTED_DEBUG: DETAIL}}
configs:
  seed: {{NCCL_PROTO: LL, NCCL_ALGO: Ring, NCCL_P2P_LEVEL: SYS, NCCL_MAX_NCHANNELS: 16, NCCL_BUFFSIZE: 16777216}}
  debug-off: {{TORCH_DISTRIBUTED_DEBUG: "OFF"}}
confirm:
  configs: [debug-off, seed]
grid:
  NCCL_PROTO: [LL, LL128, Simple]
  NCCL_ALGO: [Ring, Tree]
  NCCL_MAX_NCHANNELS: [8, 16]
  NCCL_BUFFSIZE: [4194304, 16777216]
"""

TWINS_EXCEPT = {"default", "debug-off"}  # every other config is identical to default under gloo


def one_sweep(spec_file: Path, out: Path, sets: list[str]) -> dict:
    from commdiag.analyse import verdict
    from commdiag.formats import results
    from commdiag.formats.spec import load_spec
    from commdiag.measure import sweep

    spec = load_spec(spec_file, sets)
    t0 = time.monotonic()
    res = sweep.run_sweep(spec, run_dir=out, on_plan=lambda p: [print("   ", l, flush=True) for l in p.lines])
    wall = time.monotonic() - t0
    v = verdict.evaluate_run(results.load_run(out))
    claims = sorted((c.claim.config, c.claim.where, c.result) for c in v.certifications if c.certified)
    run = results.load_run_json(out)
    return {"wall_s": wall, "counts": res.counts, "claims": claims,
            "racing": [d for lk in (run.get("racing") or {}).get("looks", []) for d in lk["dropped"]]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    root = a.out or Path(tempfile.mkdtemp(prefix="race-cpu-"))
    root.mkdir(parents=True, exist_ok=True)
    spec_file = root / "race-cpu.yaml"
    spec_file.write_text(SPEC.format(hidden=a.hidden, iters=a.iters, warmup=a.warmup))
    print(f"# benchmarks/race_cpu.py --hidden {a.hidden} --iters {a.iters} --warmup {a.warmup}, "
          f"{time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f} at start; folders under {root}", flush=True)
    got = {}
    for name, sets in (("today", ["time_per_size_ms=null", "racing=false"]), ("new", [])):
        print(f"{name}: commdiag sweep race-cpu.yaml {' '.join('--set ' + s for s in sets)}", flush=True)
        got[name] = r = one_sweep(spec_file, root / name, sets)
        print(f"  {name}: wall {r['wall_s']:.1f} s, launches {r['counts']}, load {os.getloadavg()[0]:.1f}", flush=True)
        print(f"  certified: {r['claims'] or 'nothing'}", flush=True)
        if r["racing"]:
            print(f"  racing dropped: {', '.join(d['config'] for d in r['racing'])}", flush=True)
    ratio = got["new"]["wall_s"] / got["today"]["wall_s"]
    hidden = {n: [c for c in r["claims"] if c[0] == "debug-off"] for n, r in got.items()}
    aa = {n: [c for c in r["claims"] if c[0] not in TWINS_EXCEPT] for n, r in got.items()}
    print(f"ratio new / today (wall): {ratio:.2f} ({'meets' if ratio <= 0.35 else 'misses'} the <= 0.35 target)")
    print(f"hidden effect, same certified claims: {hidden['today'] == hidden['new']} "
          f"(today {hidden['today'] or 'none'}; new {hidden['new'] or 'none'})")
    print(f"A/A twins certified: today {aa['today'] or 'none'}; new {aa['new'] or 'none'}")


if __name__ == "__main__":
    main()
