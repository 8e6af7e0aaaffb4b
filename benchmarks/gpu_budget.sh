#!/usr/bin/env bash
# #31 on one GPU: time-budgeted sizes against fixed counts, on two NCCL ranks of GPU 0 (socket transport):
#   BUDGET_S=480 bash benchmarks/gpu_budget.sh        # 1x H100/H200: about 5-6 min
# Runs benchmarks/net1-budget.yaml (default + its twin aa, graph and eager, 4 sizes 14 KB-29 MB, 3 trials,
# screening only) alternately with `--set time_per_size_ms=null` (fixed) and the default budget, twice,
# then `commdiag compare` fixed-1 vs budget-1, fixed-2 vs budget-2, and the two A/As (fixed-1 vs fixed-2,
# budget-1 vs budget-2); per run, each launch's start-up and measuring seconds.  Leaves $OUT/gpu-budget.tgz.
set -u
. "$(dirname "$0")/gpu_env.sh"  # multicast off, carried wheels, this checkout first
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
G=/tmp/gpu-budget; mkdir -p $G
. "$(dirname "$0")/gpu_steps.sh" 480  # DEADLINE, left, step
finish() { tar czf "$OUT/gpu-budget.tgz" -C /tmp gpu-budget; ls -la "$OUT"; }
trap finish EXIT
{ nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'; } > $G/versions.txt 2>&1
cat $G/versions.txt
for rep in 1 2; do
  step fixed-$rep 150 env COMMDIAG_SHARE_GPU=1 python3 -m commdiag.cli sweep benchmarks/net1-budget.yaml \
    --no-confirm --set time_per_size_ms=null --out $G/fixed-$rep
  step budget-$rep 45 env COMMDIAG_SHARE_GPU=1 python3 -m commdiag.cli sweep benchmarks/net1-budget.yaml \
    --no-confirm --out $G/budget-$rep
done
for pair in "fixed-1 budget-1" "fixed-2 budget-2" "fixed-1 fixed-2" "budget-1 budget-2"; do
  set -- $pair
  [ -f $G/$1/run.json ] && [ -f $G/$2/run.json ] && step compare-$1-$2 30 python3 -m commdiag.cli compare $G/$1 $G/$2
done
python3 - $G <<'PY' | tee $G/launches.txt
import json, statistics, sys
from pathlib import Path
for run in sorted(Path(sys.argv[1]).glob("*/run.json")):
    ls = [l for l in json.loads(run.read_text())["launches"] if l.get("overhead_s") is not None]
    if ls:
        o, m = [l["overhead_s"] for l in ls], [l["measure_s"] for l in ls]
        print(f"{run.parent.name:9s} {len(ls)} launches: start-up median {statistics.median(o):.2f} s "
              f"[{min(o):.2f}-{max(o):.2f}], measuring median {statistics.median(m):.2f} s [{min(m):.2f}-{max(m):.2f}]")
PY
echo "left $(left)s"; cat $G/skipped.txt 2>/dev/null
