#!/usr/bin/env bash
# The GPU run recorded in benchmarks/, as run on a 2-GPU machine:
#   BUDGET_S=555 bash benchmarks/gpu_run.sh all   # everything under one deadline; call again to continue
# It leaves $OUT/gpu.tgz: every run folder and log under /tmp/gpu.  Earlier steps (validation,
# explain, overhead, fidelity, diagnostics) are in git history; `all` now runs the two 2026-11-30 sweeps.
# NVLink multicast stays off everywhere: never sweep NVLS on shared machines.
set -u
. "$(dirname "$0")/gpu_env.sh"  # multicast off, carried wheels, this checkout first
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
versions() { nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())'; }
case "${1:-}" in
  all)  # everything, in order of value, under one deadline; re-running on the same (warm) machine continues
    # Stages mark themselves done in /tmp/gpu; a sweep cut by the deadline is resumed (--resume) next call.
    DEADLINE=$(( $(date +%s) + ${BUDGET_S:-560} )); G=/tmp/gpu; mkdir -p $G
    left() { echo $(( DEADLINE - $(date +%s) )); }
    finish() { tar czf "$OUT/gpu.tgz" -C /tmp gpu; ls -la "$OUT"; }
    trap finish EXIT
    [ -f $G/versions.txt ] || versions > $G/versions.txt 2>&1; cat $G/versions.txt
    sweep_stage() {  # NAME SPEC [--set ...]: new run or resume, cut by SIGINT before the deadline
      local name=$1 spec=$2; shift 2; [ -f $G/done-$name ] && return 0
      local t=$(( $(left) - 25 )); [ $t -lt 60 ] && { echo "skip $name: ${t}s left" | tee -a $G/skipped.txt; return 1; }
      local s=$(date +%s) args
      if [ -f $G/$name/run.json ]; then args=(--resume $G/$name); else args=("$spec" --out $G/$name "$@"); fi
      timeout -s INT -k 20 $t python3 -m commdiag.cli sweep "${args[@]}" >> $G/$name-console.txt 2>> $G/$name-progress.txt
      local rc=$?; echo "$name rc=$rc wall=$(( $(date +%s) - s ))s" | tee -a $G/$name-console.txt $G/rc.txt
      tail -3 $G/$name-progress.txt
      [ $rc -ne 130 ] && [ $rc -ne 124 ] && [ $rc -ne 2 ] && touch $G/done-$name; return $rc
    }
    # Certified verdicts (2026-11-30): both sweeps end to end with stage 2, A/A first (it carries
    # the two acceptance checks: aa never certified, seed certified slower in prefill), then nvlink2.
    sweep_stage aa sweeps/nvlink2-aa.yaml; tail -20 $G/aa-console.txt
    sweep_stage nvlink2 sweeps/nvlink2.yaml; tail -30 $G/nvlink2-console.txt
    for r in aa nvlink2; do
      [ -f $G/done-$r ] && python3 benchmarks/certify_cost.py $G/$r | tee $G/$r-cost.txt
    done
    echo "left $(left)s; done: $(cd $G && ls done-* | tr '\n' ' ')"; cat $G/skipped.txt 2>/dev/null
    ;;
  *) echo "usage: $0 all"; exit 2;;
esac
