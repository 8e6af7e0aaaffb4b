#!/usr/bin/env bash
# #31 on one GPU: time-budgeted sizes against fixed counts, on two NCCL ranks of GPU 0 (socket transport):
#   BUDGET_S=480 bash benchmarks/gpu_budget.sh        # 1x H100/H200: about 5-6 min
# benchmarks/budget_aa.py on benchmarks/net1-budget.yaml (default + its twin aa, graph and eager, 4 sizes
# 14 KB-29 MB, 3 trials, screening only): fixed counts and the default budget alternated, twice, then the
# per-cell ratios against each method's own A/A.  Leaves $OUT/gpu-budget.tgz.
set -u
. "$(dirname "$0")/gpu_env.sh"  # multicast off, carried wheels, this checkout first
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
G=/tmp/gpu-budget; mkdir -p $G
trap 'tar czf "$OUT/gpu-budget.tgz" -C /tmp gpu-budget; ls -la "$OUT"' EXIT
{ nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'; } > $G/versions.txt 2>&1
cat $G/versions.txt
python3 benchmarks/budget_aa.py benchmarks/net1-budget.yaml $G --reps 2 --budget-s ${BUDGET_S:-480} \
  --env COMMDIAG_SHARE_GPU=1 2>&1 | tee $G/budget_aa.txt
