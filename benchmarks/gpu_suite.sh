#!/usr/bin/env bash
# The whole test suite on a GPU machine (the slow ones too: -m ""), with as many xdist workers as cores
# (the deadlines in the tests must hold under that load), then the GPU tests alone (`-m gpu`, serially).
# Run from the checkout:
#   bash benchmarks/gpu_suite.sh        # about 3-4 min on 1x H200 (16 cores); OUT=/tmp/out by default
# Leaves $OUT/pytest-suite-gpu.txt (the summary and the 30 slowest tests) and $OUT/pytest-gpu-marker.txt.
# NVLink multicast stays off everywhere: never sweep NVLS on shared machines.
set -u
source "$(dirname "$0")/gpu_env.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())'; nproc; } 2>&1 | tee "$OUT/versions.txt"
start=$(date +%s)
python3 -m pytest -p no:cacheprovider -n "$(nproc)" -m "" --durations=30 2>&1 | tee "$OUT/pytest-suite-gpu.txt"
echo "rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - start ))s workers=$(nproc)" | tee -a "$OUT/pytest-suite-gpu.txt"
python3 -m pytest -p no:cacheprovider -n 0 -m gpu 2>&1 | tee "$OUT/pytest-gpu-marker.txt"
echo "rc=${PIPESTATUS[0]}" | tee -a "$OUT/pytest-gpu-marker.txt"
