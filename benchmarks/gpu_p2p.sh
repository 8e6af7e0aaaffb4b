#!/usr/bin/env bash
# commdiag p2p on the GPU machine, beside cuda-samples' p2pBandwidthLatencyTest built there (ground truth),
# and commdiag p2p's wall time.  Sent with the device tool, carrying .gpu-ref (the sample's .cu and four
# helper headers from a snapshot of NVIDIA/cuda-samples, git-ignored):
#   bash benchmarks/gpu_p2p.sh          # about 1-2 minutes on 1 GPU; RUNS=3 timed commdiag runs by default
# Leaves in $OUT (8 files at most): versions.txt, p2p.json (the first run), p2p.txt (rendered from it),
# p2p-runs.txt (every run's wall time and exit code, progress lines), ref.txt (p2pBandwidthLatencyTest),
# compare.txt (value by value, within 10%?), build.txt (nvcc).  Targets: 2 GPUs < 15 s, 8 GPUs < 60 s.
# NVLink multicast stays off everywhere.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
RUNS=${RUNS:-3}
REF=.gpu-ref/p2pBandwidthLatencyTest
B=/tmp/p2pref; mkdir -p $B

{ nvidia-smi -L; nvidia-smi topo -m; nvidia-smi -q -d PCIE | grep -E -i 'gen|width|replay' | sort | uniq -c
  python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus",
torch.cuda.device_count(), "python", sys.version.split()[0])'; } > $OUT/versions.txt 2>&1
cat $OUT/versions.txt

# 1. the reference, built here (about 20-40 s; before the timed runs so nvcc shares no time with them)
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
if [ -f $REF/p2pBandwidthLatencyTest.cu ]; then
  s=$(date +%s)
  timeout 240 $NVCC -O2 -std=c++17 -I$REF/Common -gencode arch=compute_$CC,code=sm_$CC \
    -o $B/p2pBandwidthLatencyTest $REF/p2pBandwidthLatencyTest.cu > $OUT/build.txt 2>&1
  echo "nvcc rc=$? in $(( $(date +%s) - s ))s (sm_$CC, $($NVCC --version | tail -1))" | tee -a $OUT/build.txt
else
  echo "no $REF: carry .gpu-ref (see docs/p2p.md, 'Ground truth')" | tee $OUT/build.txt
fi

# 2. commdiag p2p, RUNS times: the first run's JSON is kept; every run's wall time is printed
: > $OUT/p2p-runs.txt
for r in $(seq 1 $RUNS); do
  s=$(date +%s.%N)
  timeout -s INT -k 20 300 python3 -m commdiag.cli p2p --json > /tmp/p2p-$r.json 2> /tmp/p2p-$r.err
  rc=$?
  w=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" $s $(date +%s.%N))
  echo "run $r: exit $rc, wall ${w} s (command line to exit)" | tee -a $OUT/p2p-runs.txt
  sed 's/^/    /' /tmp/p2p-$r.err >> $OUT/p2p-runs.txt
done
cp /tmp/p2p-1.json $OUT/p2p.json
python3 - $RUNS >> $OUT/p2p-runs.txt <<'P'
import json, statistics, sys
walls = []
for r in range(1, int(sys.argv[1]) + 1):
    try:
        d = json.load(open(f"/tmp/p2p-{r}.json"))
    except Exception as e:
        print(f"run {r}: no JSON ({e})"); continue
    walls.append(d["wall_s"])
    g = d["gpus"][0] if d["gpus"] else {}
    h = lambda k: f"{g[k]['median']:.2f}" if g.get(k) else "-"
    print(f"run {r}: {len(d['gpus'])} GPU(s), {len(d['pairs'])} pair(s), measured in {d['wall_s']} s; "
          f"GPU0 H2D {h('h2d')} D2H {h('d2h')} local {h('local')} GB/s, lat H2D {h('lat_h2d')} us; "
          f"probes {d['environment'].get('probes')}, flags {[f['code'] for f in d['flags']]}")
if walls:
    print(f"commdiag p2p wall (library, probes included): median {statistics.median(walls):.1f} s, "
          f"range {min(walls):.1f}-{max(walls):.1f} s, n={len(walls)} (targets: 2 GPUs < 15 s, 8 GPUs < 60 s)")
P
python3 -m commdiag.cli p2p --from $OUT/p2p.json > $OUT/p2p.txt 2>&1
cat $OUT/p2p-runs.txt; cat $OUT/p2p.txt

# 3. the reference run, then both side by side
if [ -x $B/p2pBandwidthLatencyTest ]; then
  timeout 120 $B/p2pBandwidthLatencyTest > $OUT/ref.txt 2>&1; echo "p2pBandwidthLatencyTest rc=$?"
  cat $OUT/ref.txt
  python3 benchmarks/p2p_reference.py $OUT/p2p.json $OUT/ref.txt > $OUT/compare.txt 2>&1
  cat $OUT/compare.txt
fi
ls -la $OUT
