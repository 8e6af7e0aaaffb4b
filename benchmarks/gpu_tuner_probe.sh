#!/usr/bin/env bash
# First load of commdiag's tuner plugin by a real libnccl, on a 2-GPU machine:
#   bash benchmarks/gpu_tuner_probe.sh      # leaves $OUT/tuner.tgz
# Builds the plugin, writes a two-rule file (all-reduce 1-2 MiB -> Ring/LL, 2-4 MiB -> Ring/LL128 on
# 2 ranks), and runs a one-trial sweep of default vs `tuned` (the plugin) at 0.9-7.3 MB with --explain,
# whose TUNING log shows what NCCL chose per size. Screening only (--no-confirm): a proof that the plugin
# loads and its rules fire on both ranks, not a certified measurement.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/out}; T=/tmp/tuner; mkdir -p "$OUT" $T
python3 -m commdiag.cli tuner build --out $T > $T/build.txt 2>&1; echo "build rc=$?"; cat $T/build.txt
cat > $T/rules.txt <<'R'
# commdiag-tuner-rules 1
coll=allreduce min_bytes=1048576 max_bytes=2097152 nranks=2 nnodes=1 algo=ring proto=ll
coll=allreduce min_bytes=2097153 max_bytes=4194304 nranks=2 nnodes=1 algo=ring proto=ll128
R
cat > $T/spec.yaml <<S
name: tuner-probe
backend: nccl
nproc_per_node: 2
dtype: bfloat16
sizes: {hidden: 7168, tokens: [64, 128, 256, 512]}
trials: 1
warmup: 10
iters: 50
modes: [graph, eager]
vias: [torch]
timeout_s: 120
base_env: {NCCL_NVLS_ENABLE: "0"}
configs:
  tuned: {NCCL_TUNER_PLUGIN: $T/libnccl-tuner-commdiag.so, NCCL_TUNER_CONFIG_FILE: $T/rules.txt}
S
timeout 300 python3 -m commdiag.cli sweep $T/spec.yaml --out $T/run --no-confirm --explain > $T/console.txt 2>&1
echo "sweep rc=$?"; tail -25 $T/console.txt
python3 -m commdiag.cli explain $T/run --no-run > $T/explain.txt 2>&1; cat $T/explain.txt
grep -rh "commdiag-tuner\|TUNER/Plugin\|tuner" $T/run/launches $T/run/explain 2>/dev/null | sort | uniq -c | sort -rn | head -30 > $T/plugin-lines.txt
cat $T/plugin-lines.txt
tar czf $OUT/tuner.tgz --exclude="*.so" -C /tmp tuner
