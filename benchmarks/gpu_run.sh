#!/usr/bin/env bash
# The GPU run recorded in benchmarks/, as sent to a lent 2-GPU machine (device tool):
#   BUDGET_S=555 bash benchmarks/gpu_run.sh all   # everything under one deadline; call again to continue
# It leaves $OUT/gpu.tgz: every run folder and log under /tmp/gpu.  Session 1's one-off steps
# (sweep, rest, final) are in git history; `all` does what they did.
# NVLink multicast stays off everywhere: never sweep NVLS on shared machines.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if [ -d .whl ]; then  # plotly is not installed there: carried wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
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
    # 1. validation: both call paths, a Tree config (control traffic), 1 trial, 3 sizes
    if [ ! -f $G/done-validate ]; then
      sweep_stage validate sweeps/nvlink2.yaml --set trials=1 --set 'sizes.tokens=[1,64,8192]' \
        --set 'vias=[torch,nccl-direct]' --set timeout_s=60 --set 'grid.NCCL_PROTO=[Simple]' --set 'grid.NCCL_ALGO=[Tree]'
      [ $? -eq 0 ] || { echo "validation failed: stopping"; tail -40 $G/validate-console.txt; exit 1; }
      tail -25 $G/validate-console.txt
    fi
    # 2. nvlink2 as shipped (torch path), then what NCCL chose per config
    sweep_stage nvlink2 sweeps/nvlink2.yaml; tail -30 $G/nvlink2-console.txt
    if [ -f $G/done-nvlink2 ] && [ ! -f $G/done-explain ] && [ $(left) -gt 150 ]; then
      timeout -s INT $(( $(left) - 20 )) python3 -m commdiag.cli explain $G/nvlink2 > $G/explain.txt 2>&1 && touch $G/done-explain
      echo "explain rc=$?" | tee -a $G/rc.txt; python3 -m commdiag.cli report $G/nvlink2 >/dev/null 2>&1
    fi
    # 3. A/A + seed with both call paths
    sweep_stage aa sweeps/nvlink2-aa.yaml --set 'vias=[torch,nccl-direct]'; tail -30 $G/aa-console.txt
    # 4. launch overhead, fidelity (floors and default-stream penalty), diagnostics
    if [ ! -f $G/done-overhead ] && [ $(left) -gt 90 ]; then
      timeout 80 python3 benchmarks/launch_overhead.py --backend nccl --nproc 2 --repeat 3 --reuse 7 > $G/launch_overhead.txt 2>&1 && touch $G/done-overhead
      cat $G/launch_overhead.txt | tail -8
    fi
    if [ ! -f $G/done-fidelity ] && [ $(left) -gt 160 ]; then
      timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node=2 benchmarks/fidelity.py --out $G/fidelity.json > $G/fidelity.txt 2>&1 && touch $G/done-fidelity
      grep -v -i warn $G/fidelity.txt | tail -30
    fi
    if [ ! -f $G/done-diag ] && [ $(left) -gt 100 ]; then
      D=$G/diagnostics; mkdir -p $D
      {
        nvidia-smi topo -m > $D/diag-topo.txt
        python3 -m commdiag.cli detect --json > $D/detect.json; echo "detect rc=$?"
        python3 -m commdiag.cli detect > $D/detect.txt
        python3 -m commdiag.cli doctor > $D/doctor.txt; echo "doctor rc=$?" >> $D/doctor.txt
        NCCL_PROTO=LL NCCL_ALGO=Ring NCCL_MAX_NCHANNELS=16 timeout 60 python3 -m commdiag.cli check-env --nccl --expect NCCL_PROTO=LL --expect NCCL_ALGO=Ring --expect NCCL_MAX_NCHANNELS=16 > $D/check-env-nccl.txt; echo "check-env --nccl rc=$? (expect 0)"
        NCCL_PROTO=Simple timeout 60 python3 -m commdiag.cli check-env --nccl --expect NCCL_PROTO=LL > $D/check-env-nccl-mismatch.txt; echo "mismatch rc=$? (expect 1)"
        NCCL_PROTO=LL timeout 60 python3 -m commdiag.cli check-env --propagation --expect NCCL_PROTO=LL --json > $D/propagation.json; echo "propagation rc=$?"
      } > $D/diag-rc.txt 2>&1 && touch $G/done-diag
      cat $D/diag-rc.txt; cat $D/doctor.txt | head -40
    fi
    echo "left $(left)s; done: $(cd $G && ls done-* | tr '\n' ' ')"; cat $G/skipped.txt 2>/dev/null
    ;;
  *) echo "usage: $0 all"; exit 2;;
esac
