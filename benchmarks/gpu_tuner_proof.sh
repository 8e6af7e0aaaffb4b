#!/usr/bin/env bash
# On a 2-GPU machine: the proof that the tuner plugin loaded and which rule
# fired, in check-env --nccl (loaded, and four ways of not loading), in every sweep launch and in explain.
#   bash benchmarks/gpu_tuner_proof.sh      # leaves $OUT/proof.tgz
# Not run as a whole: the 2026-11-30 runs recorded every check-env case (loaded and all four failures) and the tuned
# sweeps through benchmarks/gpu_tuner_step.sh (stages proof and tuner); the "not a tuner" and dlopen-error cases
# are recorded too (benchmarks/h200x2-2026-11-30-tuner/proof).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/out}; T=/tmp/proof; mkdir -p "$OUT" $T
python3 -m commdiag.cli tuner build --out $T > $T/build.txt 2>&1; echo "build rc=$?"
LIB=$T/libnccl-tuner-commdiag.so
cat > $T/rules.txt <<'R'
# commdiag-tuner-rules 1
coll=allreduce min_bytes=1048576 max_bytes=2097152 nranks=2 nnodes=1 algo=ring proto=ll
coll=allreduce min_bytes=2097153 max_bytes=4194304 nranks=2 nnodes=1 algo=ring proto=ll128
R
printf '# commdiag-tuner-rules 1\ncoll=allreduce min_bytes=0 max_bytes=10 nranks=2 nnodes=1 algo=ring proto=fast\n' > $T/bad-rules.txt
echo 'int commdiag_not_a_tuner = 1;' > $T/empty.c && cc -shared -fPIC -o $T/libnot-a-tuner.so $T/empty.c
ce() {  # NAME PLUGIN RULES
  NCCL_TUNER_PLUGIN=$2 NCCL_TUNER_CONFIG_FILE=$3 timeout 240 python3 -m commdiag.cli check-env --nccl > $T/checkenv-$1.txt 2>&1
  echo "check-env $1 rc=$?" | tee -a $T/rc.txt
  NCCL_TUNER_PLUGIN=$2 NCCL_TUNER_CONFIG_FILE=$3 timeout 240 python3 -m commdiag.cli check-env --nccl --json > $T/checkenv-$1.json 2>$T/checkenv-$1.err
  echo "check-env --json $1 rc=$?" | tee -a $T/rc.txt
}
ce ok $LIB $T/rules.txt
ce missing-library $T/absent/libnccl-tuner-commdiag.so $T/rules.txt
ce dlopen-error $T/rules.txt $T/rules.txt
ce unsupported $T/libnot-a-tuner.so $T/rules.txt
ce bad-rules $LIB $T/bad-rules.txt
tail -n 30 $T/checkenv-ok.txt $T/checkenv-missing-library.txt
cat > $T/spec.yaml <<S
name: tuner-proof
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
  tuned: {NCCL_TUNER_PLUGIN: $LIB, NCCL_TUNER_CONFIG_FILE: $T/rules.txt}
  not-a-tuner: {NCCL_TUNER_PLUGIN: $T/libnot-a-tuner.so}
S
timeout 300 python3 -m commdiag.cli sweep $T/spec.yaml --out $T/run --no-confirm --explain > $T/console.txt 2>&1
echo "sweep rc=$?" | tee -a $T/rc.txt; tail -25 $T/console.txt
python3 -m commdiag.cli explain $T/run --no-run > $T/explain.txt 2>&1; cat $T/explain.txt
python3 - $T/run/run.json > $T/launch-tuner.txt <<'P'
import json, sys
run = json.load(open(sys.argv[1]))
for l in run["launches"]:
    print(l["index"], l["config"], l["status"], l.get("error", ""))
    for r in l.get("ranks", []):
        t = r.get("nccl_tuner")
        if t: print("  rank", r["rank"], t["loaded"], t["name"], t["abi"], [x["matching"] for x in t["rules"]], {s: f["line"] for s, f in t["fired"].items()}, t["problems"])
P
cat $T/launch-tuner.txt
grep -rh "commdiag-tuner\|TUNER/Plugin\|tuner plugin\|NCCL_TUNER" $T/run/launches $T/run/explain 2>/dev/null | sort | uniq -c | sort -rn | head -40 > $T/plugin-lines.txt
cat $T/plugin-lines.txt
mkdir -p $T/launch-logs && for d in $T/run/launches/*; do cp $d/nccl.*.log $T/launch-logs/ 2>/dev/null; done
tar czf $OUT/proof.tgz --exclude="*.so" --exclude="samples.csv" -C /tmp proof
