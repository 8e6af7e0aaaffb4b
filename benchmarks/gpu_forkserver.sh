#!/usr/bin/env bash
# The GPU proof of launch: forkserver (docs/launch-methods.md), on 1 or 2 GPUs:
#   BUDGET_S=470 bash benchmarks/gpu_forkserver.sh all     # 1x H200: about 3-5 min; 2x H200: about 8 min
#   BUDGET_S=240 bash benchmarks/gpu_forkserver.sh net1    # 1x H200: proof 2 on two ranks of one GPU, ~3 min
# It leaves $OUT/gpu-forkserver.tgz (every folder and log under /tmp/gpu-fs) and prints:
#   1. proof 1: NCCL's ENV and INIT lines of a forked child against a fresh torchrun launch, for the
#      seed config's six NCCL_* variables, one rank (benchmarks/forkserver_nccl.py env; compare script:
#      benchmarks/compare_nccl_logs.py).  "PROOF 1: PASS" or the differing lines.
#   2. per-launch overhead (wall - measuring) per method, 1 rank, 6 launches each, alternated.
#   3. with 2+ GPUs only: an A/A between the methods: nvlink2-aa.yaml (graph mode, 2 trials, no
#      confirmation) once per method, then `commdiag compare` of the two runs, and both sweeps' walls.
# NVLink multicast stays off everywhere: never sweep NVLS on shared machines.
set -u
. "$(dirname "$0")/gpu_env.sh"  # multicast off, carried wheels, this checkout first
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
G=/tmp/gpu-fs; mkdir -p $G
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-470} ))
left() { echo $(( DEADLINE - $(date +%s) )); }
finish() { tar czf "$OUT/gpu-forkserver.tgz" -C /tmp gpu-fs; ls -la "$OUT"; }
step() {  # NAME SECONDS_NEEDED CMD...: run once (marks itself done), skipped when the budget is short
  local name=$1 need=$2; shift 2; [ -f $G/done-$name ] && { cat $G/$name.txt; return 0; }
  local t=$(( $(left) - 15 )); [ $t -lt $need ] && { echo "skip $name: ${t}s left, needs ${need}s" | tee -a $G/skipped.txt; return 1; }
  local s=$(date +%s)
  timeout -s INT -k 20 $t "$@" > $G/$name.txt 2>&1; local rc=$?
  echo "$name rc=$rc wall=$(( $(date +%s) - s ))s" | tee -a $G/$name.txt $G/rc.txt
  cat $G/$name.txt
  [ $rc -ne 124 ] && [ $rc -ne 130 ] && touch $G/done-$name; return $rc
}
case "${1:-}" in
  all)
    trap finish EXIT
    nvidia-smi -L > $G/versions.txt 2>&1
    python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())' >> $G/versions.txt 2>&1
    cat $G/versions.txt
    GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())')
    step env-proof 60 python3 benchmarks/forkserver_nccl.py env $G/env
    step overhead 90 python3 benchmarks/forkserver_nccl.py overhead $G/overhead 6
    if [ "${GPUS:-0}" -ge 2 ]; then
      for m in torchrun forkserver; do
        step aa-$m 150 bash -c "s=\$(date +%s); python3 -m commdiag.cli sweep sweeps/nvlink2-aa.yaml --no-confirm \
          --set launch=$m --set trials=2 --set 'modes=[graph]' --set nproc_per_node=2 --out $G/aa-$m; \
          rc=\$?; echo sweep wall \$(( \$(date +%s) - s ))s; exit \$rc"
      done
      [ -f $G/aa-torchrun/run.json ] && [ -f $G/aa-forkserver/run.json ] && \
        step compare 30 python3 -m commdiag.cli compare $G/aa-torchrun $G/aa-forkserver
      python3 - $G <<'EOF' | tee $G/aa-overhead.txt
import json, statistics, sys
from pathlib import Path
for m in ("torchrun", "forkserver"):
    p = Path(sys.argv[1]) / f"aa-{m}" / "run.json"
    if p.exists():
        ls = [l for l in json.loads(p.read_text())["launches"] if "overhead_s" in l]
        o = [l["overhead_s"] for l in ls]
        print(f"{m:10s} 2 ranks: overhead per launch median {statistics.median(o):.2f} s, "
              f"range {min(o):.2f}-{max(o):.2f}, n={len(o)} (first launch {o[0]:.2f} s)")
EOF
    else
      echo "1 GPU: proof 2 runs on two ranks of one GPU: bash $0 net1" | tee -a $G/skipped.txt
    fi
    echo "left $(left)s; done: $(cd $G && ls done-* 2>/dev/null | tr '\n' ' ')"; cat $G/skipped.txt 2>/dev/null
    ;;
  net1)
    # Proof 2 on one GPU: two ranks on GPU 0, each with its own NCCL_HOSTID (worker.SHARE_GPU_VAR), a real
    # 2-rank NCCL communicator over sockets; the A/A between the launch methods (benchmarks/net1-aa.yaml,
    # graph mode), alternated torchrun, forkserver, torchrun, forkserver; then `compare` of the runs.
    trap finish EXIT
    for rep in 1 2; do for m in torchrun forkserver; do
      step net1-$m-$rep 60 bash -c "s=\$(date +%s); COMMDIAG_SHARE_GPU=1 python3 -m commdiag.cli sweep \
        benchmarks/net1-aa.yaml --no-confirm --set launch=$m --out $G/net1-$m-$rep; \
        rc=\$?; echo sweep wall \$(( \$(date +%s) - s ))s; exit \$rc"
    done; done
    for rep in 1 2; do
      [ -f $G/net1-torchrun-$rep/run.json ] && [ -f $G/net1-forkserver-$rep/run.json ] && \
        step net1-compare-$rep 30 python3 -m commdiag.cli compare $G/net1-torchrun-$rep $G/net1-forkserver-$rep
    done
    [ -f $G/net1-torchrun-1/run.json ] && [ -f $G/net1-torchrun-2/run.json ] && \
      step net1-compare-tt 30 python3 -m commdiag.cli compare $G/net1-torchrun-1 $G/net1-torchrun-2
    [ -f $G/net1-forkserver-1/run.json ] && [ -f $G/net1-forkserver-2/run.json ] && \
      step net1-compare-ff 30 python3 -m commdiag.cli compare $G/net1-forkserver-1 $G/net1-forkserver-2
    echo "left $(left)s; done: $(cd $G && ls done-* 2>/dev/null | tr '\n' ' ')"
    ;;
  *) echo "usage: $0 all|net1"; exit 2;;
esac
