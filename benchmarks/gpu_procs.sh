#!/usr/bin/env bash
# Every GPU-side process start through commdiag/procs.py (issue 28, the one process supervisor), on 1 GPU:
#   bash benchmarks/gpu_procs.sh            # about 2-3 minutes on 1x H200
# 1. check-env --nccl: a real torchrun (agent + worker in its own session) started, drained and reaped by
#    procs.run; 2. p2p: a probe started through the exec wrapper (parent-death signal after exec);
# 3. a 1-rank nccl sweep (torchrun launches in their launch folders) and `explain RUN` on it (the run
#    folder's lock, explain_markers); 4. after each: no process carries a commdiag marker any more.
# Leaves in $OUT: versions.txt, checkenv.json, p2p.json, sweep.txt, explain.txt, leftovers.txt, rc.txt.
set -u
source benchmarks/gpu_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; T=/tmp/gpu-procs; rm -rf $T; mkdir -p $T
{ nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count())'; } \
  > $OUT/versions.txt 2>&1
leftovers() {  # processes still carrying a COMMDIAG_LAUNCH_ID (none expected)
  for p in /proc/[0-9]*; do { tr "\0" "\n" < $p/environ; } 2>/dev/null | grep -q '^COMMDIAG_LAUNCH_ID=' \
    && echo "$1: pid ${p#/proc/} $(tr '\0' ' ' < $p/cmdline)"; done; echo "$1: checked"; }
step() { local name=$1; shift; local s=$(date +%s.%N); "$@"; local rc=$?
  echo "$name rc=$rc wall=$(python3 -c "print(round($(date +%s.%N)-$s,1))")s" | tee -a $OUT/rc.txt; leftovers $name >> $OUT/leftovers.txt; }
step check-env timeout 300 python3 -m commdiag.cli check-env --nccl --json > $OUT/checkenv.json 2>$T/checkenv.err
step p2p timeout 300 python3 -m commdiag.cli p2p --json > $OUT/p2p.json 2>$T/p2p.err
cat > $T/spec.yaml <<'YAML'
name: procs-gpu
backend: nccl
nproc_per_node: 2            # both on GPU 0 (COMMDIAG_SHARE_GPU=1): a 1-rank sweep is refused
dtype: bfloat16
sizes: {bytes: [4096, 1048576]}
trials: 1
warmup: 5
iters: 20
timeout_s: 120
configs:
  ll: {NCCL_PROTO: LL}
YAML
step sweep timeout 600 env COMMDIAG_SHARE_GPU=1 NCCL_SOCKET_IFNAME=lo python3 -m commdiag.cli sweep $T/spec.yaml --out $T/run --no-confirm > $OUT/sweep.txt 2>&1
step explain timeout 600 env COMMDIAG_SHARE_GPU=1 NCCL_SOCKET_IFNAME=lo python3 -m commdiag.cli explain $T/run > $OUT/explain.txt 2>&1
python3 -c "import json; r = json.load(open('$T/run/run.json')); print('explain_markers left:', r.get('explain_markers'))" \
  >> $OUT/explain.txt 2>&1
cat $OUT/rc.txt $OUT/leftovers.txt
