#!/usr/bin/env bash
# commdiag ab on a GPU machine, default vs the seed team's NCCL settings vs an A/A twin (3 arms,
# rounds auto: 11 rounds x 3 arms = 33 launches).  Writes under $OUT (default ./out-gpu-ab):
# the spec, ab.txt (what ab printed), ab.json, run.json, the run folder (report.html there: 4.8 MB,
# plotly embedded; commit run.json, ab.txt, ab.json, not the report).
#
# 2 or more GPUs visible: a tensor-parallel decode SERVER per launch (benchmarks/tp_decode_server.py
#   under torchrun, TP=2: two NCCL all-reduces per layer per token), started with the arm's
#   environment, ready at /health, one warmup request, then the measured request by
#   benchmarks/tp_decode_client.py, which prints the server's own tokens/s; require_nccl_proof: each
#   launch must show, in the server's NCCL log, both ranks applying every NCCL_* value of its arm.
#   About 8-12 s a launch, ~5-7 min; the run is stopped (Ctrl-C, resumable) at MAX_S (default 480 s).
# 1 GPU: the single-GPU decode loop (benchmarks/decode_loop.py, TP=1, no NCCL call) as the command;
#   seed must not come out better or worse there (~4 min).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out-gpu-ab}
MAX_S=${MAX_S:-480}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python3}
$PY -m pip install -q -e . >/dev/null 2>&1 || true
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
SEED='seed: {NCCL_PROTO: LL, NCCL_ALGO: Ring, NCCL_P2P_LEVEL: SYS, NCCL_MAX_NCHANNELS: "16", NCCL_BUFFSIZE: "16777216", NCCL_NTHREADS: "512"}'
if [ "${NGPU:-0}" -ge 2 ]; then
  SPEC="$OUT/tp2-decode.yaml"
  cat > "$SPEC" <<YAML
name: tp2-decode
description: TP=2 decode server per launch (torchrun, NCCL), default vs seed vs an A/A twin
command: ["{python}", benchmarks/tp_decode_client.py, --port, "{port}", --steps, "400"]
server:
  command: ["{python}", -m, torch.distributed.run, --standalone, --nproc-per-node, "2",
            benchmarks/tp_decode_server.py, --port, "{port}"]
  ready_url: "http://127.0.0.1:{port}/health"
  ready_timeout_s: 180
  warmup_runs: 1
  stop_timeout_s: 20
  require_nccl_proof: true
metrics:
  - {name: decode_tok_s, regex: "decode tokens/s: (?P<value>[0-9.]+)", better: higher}
base_env: {CUDA_VISIBLE_DEVICES: "0,1"}
configs:
  $SEED
  aa: {}
rounds: auto
min_effect: 0.03
timeout_s: 120
YAML
else
  SPEC="$OUT/gpu-decode.yaml"
  cat > "$SPEC" <<YAML
name: gpu-decode
command: ["{python}", benchmarks/decode_loop.py, --seconds, "1.5"]
metrics:
  - {name: decode_tok_s, regex: "decode tokens/s: (?P<value>[0-9.]+)", better: higher}
configs:
  $SEED
  aa: {}
rounds: auto
min_effect: 0.03
timeout_s: 120
YAML
fi
{ echo "GPUs visible: $NGPU"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv
  nvidia-smi topo -m; } > "$OUT/gpu.txt" 2>&1 || true
start=$(date +%s)
# SIGINT at MAX_S: ab leaves the run resumable (commdiag ab --resume "$OUT/run") and prints what it has
timeout -s INT "$MAX_S" $PY -m commdiag.cli ab "$SPEC" --out "$OUT/run" 2>"$OUT/ab.progress.txt" | tee "$OUT/ab.txt" || true
echo "wall: $(( $(date +%s) - start )) s" | tee -a "$OUT/ab.txt"
$PY -m commdiag.cli report "$OUT/run" --json > "$OUT/ab.json" 2>/dev/null || true
cp "$OUT/run/run.json" "$OUT/run.json"
# per launch: its NCCL proof (processes, ranks, each NCCL_* value applied by how many processes) and
# other_s = wall - server ready - measured command (the warmup request, the stop, commdiag's own work)
$PY - "$OUT/run.json" <<'PYEOF' | tee "$OUT/launches.txt"
import json, sys
run = json.load(open(sys.argv[1]))
for l in run["launches"]:
    p = l.get("nccl_proof") or {}
    own = None
    if l.get("wall_s") is not None and l.get("command_s") is not None:
        own = l["wall_s"] - (l.get("server_ready_s") or 0) - l["command_s"]
    print(l["index"], l["config"], l["round"] + 1, l["status"], l.get("values"), "ready", l.get("server_ready_s"),
          "proof", p.get("processes"), p.get("nranks"),
          {k: {v: len(pids) for v, pids in vals.items()} for k, vals in (p.get("applied") or {}).items()},
          "other_s", None if own is None else round(own, 2), l.get("error", "")[:200])
PYEOF
