#!/usr/bin/env bash
# The three transports NCCL uses between 2 GPUs, recorded for real (P2P, SHM, NET), on a 2-GPU machine:
#   bash benchmarks/gpu_transports.sh          # about 4-6 minutes; leaves $OUT/transports.tgz + summary
# 1. logs: a tiny all-reduce (4 KB, 1 MB, 64 MB, float32) under torchrun, NCCL_DEBUG=INFO
#    NCCL_DEBUG_SUBSYS=INIT,ENV,GRAPH,TUNING, one NCCL_DEBUG_FILE per rank, for four configs:
#      default        NCCL's choice (P2P/CUMEM over NVLink on 2x H200)
#      p2p-disable    NCCL_P2P_DISABLE=1                       -> SHM expected
#      net            NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1    -> NET/Socket expected
#      p2p-level-loc  NCCL_P2P_LEVEL=LOC                       -> SHM expected
#    then `commdiag explain --log` (text and --json) on each config's files;
# 2. `commdiag check-env --nccl` (default settings): the matrix in check-env's own output;
# 3. a one-trial sweep of the same four configs with --explain --no-confirm: explain's per-config
#    matrices and what each moved against default, from the run's own explain launches.
# The logs under transports/logs/ are what tests/fixtures/transports/ should hold as real recordings.
# NVLink multicast stays off everywhere.
set -u
. "$(dirname "$0")/gpu_env.sh"  # multicast off, carried wheels, this checkout first
OUT=${OUT:-/tmp/out}; T=/tmp/transports; rm -rf $T; mkdir -p "$OUT" $T/logs $T/explain
NPROC=${NPROC:-2}
finish() {
  tar czf "$OUT/transports.tgz" -C /tmp transports
  cp $T/summary.txt "$OUT/transports-summary.txt" 2>/dev/null
  ls -la "$OUT"
}
trap finish EXIT
{ nvidia-smi -L; nvidia-smi topo -m;
  python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())'; } > $T/versions.txt 2>&1
cat $T/versions.txt

cat > $T/allreduce.py <<'PY'
import os, torch, torch.distributed as dist
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
for nbytes in (4096, 1 << 20, 64 << 20):
    t = torch.ones(nbytes // 4, device="cuda")
    for _ in range(3):
        dist.all_reduce(t)
    torch.cuda.synchronize()
dist.destroy_process_group()
PY

record() {  # NAME ENV...: one torchrun launch, its NCCL logs, explain --log of them
  local name=$1; shift
  mkdir -p $T/logs/$name
  env "$@" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,GRAPH,TUNING NCCL_DEBUG_FILE=$T/logs/$name/nccl.%h.%p.log \
    timeout 180 python3 -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=$NPROC --max-restarts=0 \
    $T/allreduce.py > $T/logs/$name/torchrun.txt 2>&1
  echo "$name rc=$? ($*)" | tee -a $T/rc.txt
  python3 -m commdiag.cli explain --log $T/logs/$name/nccl.*.log > $T/explain/$name.txt 2>&1
  python3 -m commdiag.cli explain --json --log $T/logs/$name/nccl.*.log > $T/explain/$name.json 2>&1
  { echo "== $name ($*)"; grep -h " via \|set by environment" $T/logs/$name/nccl.*.log \
      | sed -E 's/^.*NCCL INFO //; s/^Channel [0-9]+(\/[0-9]+)? : //' | sort | uniq -c | sort -rn | head -12
    sed -n '/^Transport per GPU pair/,/^Rings/p' $T/explain/$name.txt; } >> $T/summary.txt
}
record default
record p2p-disable NCCL_P2P_DISABLE=1
record net NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
record p2p-level-loc NCCL_P2P_LEVEL=LOC

timeout 240 python3 -m commdiag.cli check-env --nccl --nproc $NPROC > $T/check-env-nccl.txt 2>&1
echo "check-env --nccl rc=$?" | tee -a $T/rc.txt
timeout 120 python3 -m commdiag.cli check-env --nccl --nproc $NPROC --json > $T/check-env-nccl.json 2>&1
{ echo "== check-env --nccl"; cat $T/check-env-nccl.txt; } >> $T/summary.txt

cat > $T/spec.yaml <<S
name: transports
backend: nccl
nproc_per_node: $NPROC
dtype: bfloat16
sizes: {hidden: 7168, tokens: [1, 64, 1024]}
trials: 1
warmup: 5
iters: 20
modes: [eager]
vias: [torch]
timeout_s: 120
base_env: {NCCL_NVLS_ENABLE: "0"}
configs:
  p2p-disable: {NCCL_P2P_DISABLE: "1"}
  net: {NCCL_P2P_DISABLE: "1", NCCL_SHM_DISABLE: "1"}
  p2p-level-loc: {NCCL_P2P_LEVEL: LOC}
S
timeout 300 python3 -m commdiag.cli sweep $T/spec.yaml --out $T/run --no-confirm --explain > $T/sweep.txt 2>&1
echo "sweep rc=$?" | tee -a $T/rc.txt
python3 -m commdiag.cli explain $T/run --no-run > $T/explain-run.txt 2>&1
rm -rf $T/run/launches/*/result.json
{ echo "== explain RUN_DIR --no-run"; cat $T/explain-run.txt; } >> $T/summary.txt
cat $T/rc.txt
awk 'length > 100 { n++ } END { print (n + 0) " printed lines over 100 columns" }' $T/explain/*.txt $T/check-env-nccl.txt $T/explain-run.txt | tee -a $T/summary.txt
