#!/usr/bin/env bash
# Real Kineto traces of the TP decode step (benchmarks/trace_record.py) on the 1x H200, for commdiag trace:
# TP=1 (one rank) and TP=2 with both ranks on the one GPU, each its own NCCL_HOSTID (NCCL's socket
# transport, as in benchmarks/gpu_transports_net1.sh), each eager and as a CUDA graph, with torch.profiler's
# ProfilerStep#N annotations.  Then commdiag trace (text and --json) on each set.  About 2 minutes.
#   OUT=/tmp/out bash benchmarks/gpu_traces.sh
# What comes back under $OUT/traces/: trace-tp*-{eager,graph}-rank*.json.gz, steps.jsonl (step times
# outside the profiler), trace-*.txt / .json / .html (what commdiag trace said; the page only where
# plotly is, e.g. from the carried .whl/), versions.txt.
set -u
source benchmarks/gpu_env.sh
OUT=${OUT:-/tmp/out}; T="$OUT/traces"; mkdir -p "$T"
{ nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'; } > "$T/versions.txt" 2>&1
run() {  # NPROC NAME ARGS...
  local n=$1 name=$2; shift 2
  timeout 300 python3 -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=$n --max-restarts=0 \
    benchmarks/trace_record.py "$T" "$@" >> "$T/steps.jsonl" 2> "$T/$name.stderr.txt"
  echo "$name rc=$?" | tee -a "$T/rc.txt"
}
export NCCL_SOCKET_IFNAME=lo  # the two "hosts" of the NCCL_HOSTID run talk over loopback
run 1 tp1
run 2 tp2-hostid --hostid
for set in tp1 tp2-hostid; do
  for mode in eager graph; do
    files=$(ls "$T"/trace-${set}-${mode}-rank*.json.gz 2>/dev/null)
    [ -n "$files" ] || continue
    python3 -m commdiag.cli trace $files > "$T/trace-$set-$mode.txt" 2>&1
    python3 -m commdiag.cli trace --json $files > "$T/trace-$set-$mode.json" 2>&1
    python3 -m commdiag.cli trace --html "$T/trace-$set-$mode.html" $files > /dev/null 2>> "$T/html-errors.txt"
    echo "== $set $mode"; head -3 "$T/trace-$set-$mode.txt"
  done
done
cat "$T/steps.jsonl"; cat "$T/rc.txt"
