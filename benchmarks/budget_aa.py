"""Time-budgeted sizes against fixed counts (#31): are the values the same within noise?

    .venv/bin/python benchmarks/budget_aa.py SPEC OUT [--reps 2] [--budget-s 480] [--env K=V ...]

Runs SPEC's screening (``--no-confirm``) alternately with ``--set time_per_size_ms=null`` (fixed: warmup
and iters samples everywhere, the counts before 2026-12-04) and with the spec's budget (the default),
``--reps`` times each, then per cell (config x mode x size) ``commdiag compare``'s Hodges-Lehmann ratio of
budget to fixed, next to the same ratio between the two fixed runs and the two budget runs (each method's
own A/A): "the same within noise" means the budget-vs-fixed ratios spread no wider than the A/As do.
Per run it prints each launch's start-up and measuring, and for the budget runs the call-count model's
measuring (measure/eta.py, fed the launch's own mean call times) against the measured.

CPU: ``benchmarks/budget-cpu.yaml``.  One GPU: ``benchmarks/gpu_budget.sh`` (net1-budget.yaml, two NCCL
ranks on GPU 0 with COMMDIAG_SHARE_GPU=1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from commdiag.analyse import compare  # noqa: E402
from commdiag.formats.spec import load_spec  # noqa: E402
from commdiag.measure import eta  # noqa: E402


def sweep(spec: Path, out: Path, sets: list[str], env: dict, left_s: float) -> float | None:
    cmd = [sys.executable, "-m", "commdiag.cli", "sweep", str(spec), "--no-confirm", "--out", str(out)]
    cmd += [x for s in sets for x in ("--set", s)]
    t0 = time.monotonic()
    with open(out.parent / f"{out.name}.log", "w") as log:
        try:
            rc = subprocess.run(cmd, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                                timeout=max(1.0, left_s)).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.monotonic() - t0
    print(f"  {out.name}: rc {rc}, wall {wall:.1f} s", flush=True)
    return wall if rc == 0 else None


def launches(run_dir: Path) -> list[dict]:
    return [l for l in json.loads((run_dir / "run.json").read_text())["launches"] if l.get("measure_s") is not None]


def model_check(spec_file: Path, run_dir: Path) -> list[float]:
    """Per launch: eta's call-count measuring from the launch's own mean per-call times / measured."""
    spec = load_spec(spec_file)
    out = []
    for l in launches(run_dir):
        res = json.loads((run_dir / "launches" / f"{l['index']:04d}" / "result.json").read_text())
        rank = res["ranks"][0]
        pred = 0.0
        for via, modes in rank["samples"].items():
            for mode, sizes in modes.items():
                for size, xs in sizes.items():
                    if xs:
                        pred += eta.size_s(spec, statistics.fmean(xs), modes=[mode], vias=[via])
        out.append(pred / l["measure_s"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting runs past this many seconds")
    ap.add_argument("--env", action="append", default=[], help="K=V for the sweeps' environment")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    env = dict(kv.split("=", 1) for kv in a.env)
    t0 = time.monotonic()
    print(f"# benchmarks/budget_aa.py {a.spec} --reps {a.reps}, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    done = []
    for rep in range(1, a.reps + 1):
        for name, sets in (("fixed", ["time_per_size_ms=null"]), ("budget", [])):
            left = a.budget_s - (time.monotonic() - t0)
            if left < 30:
                print(f"  {name}-{rep}: skipped, {left:.0f} s left", flush=True)
                continue
            if sweep(a.spec, a.out / f"{name}-{rep}", sets, env, left) is not None:
                done.append(f"{name}-{rep}")
    for name in done:
        ls = launches(a.out / name)
        o, m = [l["overhead_s"] for l in ls], [l["measure_s"] for l in ls]
        line = (f"{name:9s} {len(ls)} launches: start-up median {statistics.median(o):.2f} s [{min(o):.2f}-{max(o):.2f}], "
                f"measuring median {statistics.median(m):.2f} s [{min(m):.2f}-{max(m):.2f}]")
        if name.startswith("budget"):
            r = model_check(a.spec, a.out / name)
            line += f"; eta's call-count model / measured {min(r):.2f}-{max(r):.2f}"
        print(line, flush=True)
    pairs = [(f"fixed-{r}", f"budget-{r}") for r in range(1, a.reps + 1)]
    pairs += [("fixed-1", f"fixed-{r}") for r in range(2, a.reps + 1)] + [("budget-1", f"budget-{r}") for r in range(2, a.reps + 1)]
    for x, y in pairs:
        if x not in done or y not in done:
            continue
        res = compare.run(a.out / x, a.out / y)
        (a.out / f"compare-{x}-{y}.txt").write_text(compare.render_text(res) + "\n")
        rs = [c.ratio for c in res.changes if c.ratio is not None]
        dev = sorted(abs(r - 1) for r in rs)
        cert = [c for c in res.changes if c.verdict in (compare.FASTER, compare.SLOWER)]
        print(f"{y} / {x}: {len(rs)} cells, ratio {min(rs):.3f}-{max(rs):.3f}, median |ratio-1| "
              f"{statistics.median(dev):.3f}, within 2%: {sum(d <= 0.02 for d in dev)}, within 3%: "
              f"{sum(d <= 0.03 for d in dev)}; certified faster/slower: {len(cert)}", flush=True)


if __name__ == "__main__":
    main()
