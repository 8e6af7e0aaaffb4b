#!/usr/bin/env bash
# ab's Ctrl-C test 16 times at once on a GPU machine, where NVML is read around every launch: Ctrl-C
# during a launch's first reading once crashed `commdiag ab` with SIGSEGV (nvmlShutdown while the
# reading thread was inside NVML; 5 of 16 runs on the 1x H200, 2026-12-02).  Run from the checkout:
#   OUT=/tmp/out bash benchmarks/gpu_ab_ctrl_c.sh
# Prints how many of the 16 passed and how many ended in SIGSEGV (returncode -11); leaves each log.
set -u
source "$(dirname "$0")/gpu_env.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for i in $(seq 16); do
  python3 -m pytest -p no:cacheprovider -n 0 -q -o addopts="" tests/test_ab.py -k ctrl_c > "$OUT/ab-ctrl-c-$i.txt" 2>&1 &
done
wait
echo "ab Ctrl-C: $(grep -l '^1 passed' "$OUT"/ab-ctrl-c-*.txt | wc -l) of 16 passed;" \
     "SIGSEGV in $(grep -l 'assert -11 == 130' "$OUT"/ab-ctrl-c-*.txt | wc -l)"
