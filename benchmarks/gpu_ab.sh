#!/usr/bin/env bash
# commdiag ab on a GPU machine (1x H200 is enough): a real single-GPU decode loop
# (benchmarks/decode_loop.py, prints its own tokens/s) as the user's command, default vs the seed
# team's NCCL settings and an A/A twin, rounds auto (9 rounds x 3 arms = 27 launches, ~2-3 min).
# TP=1: the loop makes no NCCL call, so "seed" is expected EQUIVALENT to default (and so is aa);
# a better/worse here would be a false certification.  Writes under $OUT (default ./out-gpu-ab).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out-gpu-ab}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python3}
$PY -m pip install -q -e . >/dev/null 2>&1 || true
cat > "$OUT/gpu-decode.yaml" <<YAML
name: gpu-decode
command: ["{python}", benchmarks/decode_loop.py, --seconds, "1.5"]
metrics:
  - {name: decode_tok_s, regex: "decode tokens/s: (?P<value>[0-9.]+)", better: higher}
configs:
  seed: {NCCL_PROTO: LL, NCCL_ALGO: Ring, NCCL_P2P_LEVEL: SYS, NCCL_MAX_NCHANNELS: "16", NCCL_BUFFSIZE: "16777216", NCCL_NTHREADS: "512"}
  aa: {}
rounds: auto
min_effect: 0.03
timeout_s: 120
YAML
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1 || true
start=$(date +%s)
$PY -m commdiag.cli ab "$OUT/gpu-decode.yaml" --out "$OUT/run" | tee "$OUT/ab.txt" || true
$PY -m commdiag.cli ab --resume "$OUT/run" --json > "$OUT/ab.json" 2>/dev/null || true
echo "wall: $(( $(date +%s) - start )) s" | tee -a "$OUT/ab.txt"
cp "$OUT/run/run.json" "$OUT/run.json"
