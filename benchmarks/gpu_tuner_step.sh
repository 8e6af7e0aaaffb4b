#!/usr/bin/env bash
# The 2026-11-30 tuner and step GPU runs (benchmarks/h200x2-2026-11-30-tuner/), run on a 2-GPU machine, carrying
# .whl (plotly) and .nccl-tests (a snapshot of NVIDIA/nccl-tests, git-ignored):
#   BUDGET_S=560 bash benchmarks/gpu_tuner_step.sh STAGE...   # each stage once; call again to continue
# Stages mark themselves done in /tmp/gpu; a sweep cut by the deadline resumes (--resume) on the next
# call on the same warm machine.  Leaves $OUT/gpu.tgz (run folders trimmed of per-launch raw files
# except the NCCL logs the tuner proof needs).  NVLink multicast stays off everywhere.
#   reconcile  nccl-tests vs commdiag for the seed settings at 14.7 MB
#   step       commdiag step, seed-shaped MoE at TP=2, decode sizes, default vs seed
#   step-p2poff  the same with NCCL_P2P_DISABLE=1
#   reconcile-l2  benchmarks/reconcile_l2.py: in place vs out of place, 117 MB slice, L2 flush, random data
#   proof      check-env --nccl with the tuner plugin: loaded, missing library, bad rules (after tuner)
#   tuner      per-size certified PROTO x ALGO sweep -> tuner rules -> default vs tuned (certified per size),
#              with and without NCCL_P2P_DISABLE=1
set -u
. "$(dirname "$0")/gpu_env.sh"  # multicast off, carried wheels, this checkout first
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-560} )); G=/tmp/gpu; mkdir -p $G
left() { echo $(( DEADLINE - $(date +%s) )); }
finish() {
  tar czf "$OUT/gpu.tgz" -C /tmp --exclude='*.so' --exclude='gpu/*/launches/*/result.json' --exclude='nccl-tests-build' gpu
  ls -la "$OUT"
}
trap finish EXIT
SEED='{NCCL_PROTO: LL, NCCL_ALGO: Ring, NCCL_P2P_LEVEL: SYS, NCCL_MAX_NCHANNELS: 16, NCCL_BUFFSIZE: 16777216, NCCL_NTHREADS: 512}'
[ -f $G/versions.txt ] || { nvidia-smi -L; nvcc --version | tail -2;
  python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())'; } > $G/versions.txt 2>&1
cat $G/versions.txt

run_stage() {  # NAME COMMAND SPEC [args]: new run or resume, cut by SIGINT before the deadline
  local name=$1 cmd=$2 spec=$3; shift 3; [ -f $G/done-$name ] && return 0
  local t=$(( $(left) - 25 )); [ $t -lt 60 ] && { echo "skip $name: ${t}s left" | tee -a $G/skipped.txt; return 1; }
  local s=$(date +%s) args
  if [ -f $G/$name/run.json ]; then args=(--resume $G/$name); else args=("$spec" --out $G/$name "$@"); fi
  timeout -s INT -k 20 $t python3 -m commdiag.cli $cmd "${args[@]}" >> $G/$name-console.txt 2>> $G/$name-progress.txt
  local rc=$?; echo "$name rc=$rc wall=$(( $(date +%s) - s ))s" | tee -a $G/$name-console.txt $G/rc.txt
  tail -3 $G/$name-progress.txt
  [ $rc -ne 130 ] && [ $rc -ne 124 ] && [ $rc -ne 2 ] && touch $G/done-$name; return $rc
}

reconcile() {  # nccl-tests (built here from the carried snapshot) and commdiag, same machine and boot, seed settings
  [ -f $G/done-reconcile ] && return 0
  local R=$G/reconcile; mkdir -p $R
  local NH; NH=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])')
  mkdir -p /tmp/ncclhome/lib; ln -sfn $NH/include /tmp/ncclhome/include
  ln -sf $NH/lib/libnccl.so.2 /tmp/ncclhome/lib/libnccl.so
  local s=$(date +%s)
  make -j16 -C .nccl-tests/src MPI=0 BUILDDIR=/tmp/gpu/nccl-tests-build NCCL_HOME=/tmp/ncclhome \
    CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90 \
    /tmp/gpu/nccl-tests-build/all_reduce_perf > $R/build.txt 2>&1
  echo "nccl-tests build rc=$? in $(( $(date +%s) - s ))s" | tee -a $R/build.txt
  local P=/tmp/gpu/nccl-tests-build/all_reduce_perf
  export LD_LIBRARY_PATH=$NH/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local B=14680064 BIG=117440512
  # Each variant: one process, -g 2 (both GPUs from one thread, as nccl-tests is usually run without MPI)
  # unless it says -t 2 -g 1.  Columns: out-of-place and in-place time (us) per size.
  while read -r tag env_ args; do
    echo "### $tag: $env_ $args" >> $R/nccl-tests.txt
    env ${env_//,/ } timeout 120 $P $args >> $R/nccl-tests.txt 2>&1; echo "rc=$?" >> $R/nccl-tests.txt
  done <<V
seed-14.7MB-float NCCL_PROTO=LL,NCCL_ALGO=Ring,NCCL_P2P_LEVEL=SYS,NCCL_MAX_NCHANNELS=16,NCCL_BUFFSIZE=16777216,NCCL_NTHREADS=512 -b $B -e $B -g 2 -w 20 -n 100
seed-117MB-float NCCL_PROTO=LL,NCCL_ALGO=Ring,NCCL_P2P_LEVEL=SYS,NCCL_MAX_NCHANNELS=16,NCCL_BUFFSIZE=16777216,NCCL_NTHREADS=512 -b $B -e $BIG -f 8 -g 2 -w 20 -n 100
seed-14.7MB-bf16 NCCL_PROTO=LL,NCCL_ALGO=Ring,NCCL_P2P_LEVEL=SYS,NCCL_MAX_NCHANNELS=16,NCCL_BUFFSIZE=16777216,NCCL_NTHREADS=512 -b $B -e $B -g 2 -w 20 -n 100 -d bfloat16
seed-14.7MB-bf16-nocheck NCCL_PROTO=LL,NCCL_ALGO=Ring,NCCL_P2P_LEVEL=SYS,NCCL_MAX_NCHANNELS=16,NCCL_BUFFSIZE=16777216,NCCL_NTHREADS=512 -b $B -e $B -g 2 -w 20 -n 100 -d bfloat16 -c 0
seed-14.7MB-bf16-graph NCCL_PROTO=LL,NCCL_ALGO=Ring,NCCL_P2P_LEVEL=SYS,NCCL_MAX_NCHANNELS=16,NCCL_BUFFSIZE=16777216,NCCL_NTHREADS=512 -b $B -e $B -g 2 -w 20 -n 100 -d bfloat16 -G 10
seed-14.7MB-bf16-2threads NCCL_PROTO=LL,NCCL_ALGO=Ring,NCCL_P2P_LEVEL=SYS,NCCL_MAX_NCHANNELS=16,NCCL_BUFFSIZE=16777216,NCCL_NTHREADS=512 -b $B -e $B -t 2 -g 1 -w 20 -n 100 -d bfloat16
seed-14.7MB-bf16-registered NCCL_PROTO=LL,NCCL_ALGO=Ring,NCCL_P2P_LEVEL=SYS,NCCL_MAX_NCHANNELS=16,NCCL_BUFFSIZE=16777216,NCCL_NTHREADS=512 -b $B -e $B -g 2 -w 20 -n 100 -d bfloat16 -R 1
default-14.7MB-bf16 NCCL_NVLS_ENABLE=0 -b $B -e $B -g 2 -w 20 -n 100 -d bfloat16
V
  grep -E '^###|^ +14680064|^ +117440512|rc=' $R/nccl-tests.txt | tee $R/nccl-tests-summary.txt
  # commdiag at the same two sizes, same machine and boot: default and seed, graph and eager, torch and nccl-direct
  cat > $R/spec.yaml <<S
name: reconcile
backend: nccl
nproc_per_node: 2
dtype: bfloat16
sizes: {bytes: [$B, $BIG]}
trials: 2
warmup: 20
iters: 100
modes: [graph, eager]
vias: [torch, nccl-direct]
timeout_s: 120
base_env: {NCCL_NVLS_ENABLE: "0"}
configs:
  seed: $SEED
S
  timeout 240 python3 -m commdiag.cli sweep $R/spec.yaml --out $R/commdiag --no-confirm > $R/commdiag-console.txt 2>&1
  echo "commdiag rc=$?"; grep -E ' (14680064|117440512) ' $R/commdiag-console.txt | head -20
  touch $G/done-reconcile
}

tuner() {  # per-size certified sweep -> rules -> build -> default vs tuned, certified per size
  local T=$G/tuner; mkdir -p $T
  if [ ! -f $G/done-tuner-sizes ]; then
    cat > $T/sizes.yaml <<S
name: tuner-sizes
description: per-size certified PROTO x ALGO on 2x H200 (the sizes where NCCL's default switches protocol)
backend: nccl
nproc_per_node: 2
dtype: bfloat16
sizes: {hidden: 7168, tokens: [64, 128, 256, 512, 1024]}
trials: 3
warmup: 10
iters: 100
modes: [graph]
vias: [torch]
timeout_s: 120
base_env: {NCCL_NVLS_ENABLE: "0"}
grid:
  NCCL_PROTO: [LL, LL128]
  NCCL_ALGO: [Ring]
S
  fi
  run_stage tuner-sizes sweep $T/sizes.yaml --certify-sizes --no-confirm || return 1
  if [ ! -f $T/rules.txt ]; then
    python3 -m commdiag.cli tuner rules $G/tuner-sizes --out $T/rules.txt > $T/rules-console.txt 2>&1
    echo "rules rc=$?"; cat $T/rules-console.txt
    python3 -m commdiag.cli tuner build --out $T --rules $T/rules.txt > $T/build.txt 2>&1; echo "build rc=$?"; cat $T/build.txt
  fi
  [ -s $T/rules.txt ] || { echo "no rules: nothing to measure"; return 1; }
  for p2p in on off; do
    local name=tuned-p2p$p2p base='{NCCL_NVLS_ENABLE: "0"}'
    [ $p2p = off ] && base='{NCCL_NVLS_ENABLE: "0", NCCL_P2P_DISABLE: "1"}'
    cat > $T/$name.yaml <<S
name: $name
description: default vs commdiag's tuner plugin with rules from tuner-sizes (P2P $p2p)
backend: nccl
nproc_per_node: 2
dtype: bfloat16
sizes: {hidden: 7168, tokens: [16, 64, 128, 256, 512, 1024, 4096]}
trials: 3
warmup: 10
iters: 100
modes: [graph]
vias: [torch]
timeout_s: 120
base_env: $base
configs:
  tuned: {NCCL_TUNER_PLUGIN: $T/libnccl-tuner-commdiag.so, NCCL_TUNER_CONFIG_FILE: $T/rules.txt}
S
    run_stage $name sweep $T/$name.yaml --certify-sizes --no-confirm --explain || return 1
    grep -rh "commdiag-tuner\|TUNER/Plugin\|tuner plugin" $G/$name/launches $G/$name/explain 2>/dev/null \
      | sed 's/^[^ ]* //' | sort | uniq -c | sort -rn | head -40 > $G/$name-plugin-lines.txt
  done
}

for stage in "$@"; do
  case "$stage" in
    reconcile) reconcile;;
    step) [ -f $G/done-step-smoke ] || { timeout 150 python3 -m commdiag.cli step sweeps/step-moe-tp2.yaml --out $G/step-smoke \
            --no-confirm --set trials=1 --set 'sizes.tokens=[1,3]' --set model.layers=4 > $G/step-smoke-console.txt 2>&1;
            rc=$?; echo "step-smoke rc=$rc"; tail -30 $G/step-smoke-console.txt; [ $rc -eq 0 ] || { tail -50 $G/step-smoke/launches/*/rank*.error.txt $G/step-smoke/launches/*/torchrun.log 2>/dev/null | tail -60; exit 1; }
            touch $G/done-step-smoke; }
          run_stage step step sweeps/step-moe-tp2.yaml --set 'sizes.tokens=[1,2,3]' --set trials=2;;
    step-p2poff) run_stage step-p2poff step sweeps/step-moe-tp2.yaml --set 'sizes.tokens=[1,2,3]' --set trials=2 \
                   --set base_env.NCCL_P2P_DISABLE=1;;
    tuner) tuner;;
    proof) [ -f $G/done-proof ] || {  # check-env --nccl with the plugin: loaded, and two ways of failing
        P=$G/proof; mkdir -p $P; T=$G/tuner; L=$T/libnccl-tuner-commdiag.so
        printf '# commdiag-tuner-rules 1\ncoll=allreduce min_bytes=0 max_bytes=10 nranks=2 nnodes=1 algo=ring proto=fast\n' > $P/bad-rules.txt
        for c in "ok $L $T/rules.txt" "missing-library $P/absent/libnccl-tuner-commdiag.so $T/rules.txt" "bad-rules $L $P/bad-rules.txt"; do
          set -- $c
          NCCL_TUNER_PLUGIN=$2 NCCL_TUNER_CONFIG_FILE=$3 timeout 120 python3 -m commdiag.cli check-env --nccl --json > $P/checkenv-$1.json 2> $P/checkenv-$1.err
          echo "check-env --nccl $1 rc=$?" | tee -a $P/rc.txt
        done
        python3 - $P/checkenv-ok.json $P/checkenv-missing-library.json $P/checkenv-bad-rules.json <<'PY'
import json, sys
for f in sys.argv[1:]:
    try:
        d = json.load(open(f))
    except Exception as e:
        print(f, "unreadable", e); continue
    t = d.get("tuner") or {}
    print(f.rsplit("/", 1)[1], "ok", d.get("ok"), "tuner ok", t.get("ok"), t.get("error"))
    for r in t.get("ranks", []):
        print("  rank", r.get("rank"), r.get("summary"), r.get("problems"), {k: (v or {}).get("line") for k, v in (r.get("sizes") or {}).items()})
PY
        touch $G/done-proof; };;
    reconcile-l2) [ -f $G/done-reconcile-l2 ] || {  # which buffer state explains nccl-tests' 172/193 us
        for cfg in seed default; do
          if [ $cfg = seed ]; then e="NCCL_PROTO=LL NCCL_ALGO=Ring NCCL_P2P_LEVEL=SYS NCCL_MAX_NCHANNELS=16 NCCL_BUFFSIZE=16777216 NCCL_NTHREADS=512"; else e=""; fi
          env $e timeout 120 torchrun --nproc_per_node 2 benchmarks/reconcile_l2.py > $G/reconcile-l2-$cfg.txt 2>&1
          echo "reconcile-l2 $cfg rc=$?"; grep -v '^\*\|OMP_NUM' $G/reconcile-l2-$cfg.txt | tail -8
        done; touch $G/done-reconcile-l2; };;
    *) echo "unknown stage $stage"; exit 2;;
  esac
  echo "== after $stage: $(left)s left"
done
for r in tuned-p2pon tuned-p2poff; do [ -f $G/$r-console.txt ] && tail -45 $G/$r-console.txt && cat $G/$r-plugin-lines.txt; done
echo "left $(left)s; done: $(cd $G && ls done-* 2>/dev/null | tr '\n' ' ')"; cat $G/skipped.txt 2>/dev/null
