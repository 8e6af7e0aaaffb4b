#!/usr/bin/env bash
# A real NET/Socket recording on ONE GPU: two ranks on the same GPU, each told by NCCL_HOSTID that it is
# on a host of its own (NCCL's host hash comes from NCCL_HOSTID when set: src/misc/utils.cc,
# getHostHash), so NCCL connects them through its network transport (sockets over loopback) instead of
# refusing a duplicate GPU.  What it records: NCCL's own "via NET/Socket/..." connection lines, ring
# and tree lines with nNodes 2, for `commdiag explain --log` (tests/fixtures/transports/).  Also the
# duplicate-GPU refusal NCCL prints without NCCL_HOSTID.  About 1 minute.
#   OUT=/tmp/out bash benchmarks/gpu_transports_net1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/out}; T=/tmp/net1; rm -rf $T; mkdir -p "$OUT" $T
finish() { tar czf "$OUT/transports-net1.tgz" -C /tmp net1; cp $T/summary.txt "$OUT/net1-summary.txt" 2>/dev/null; }
trap finish EXIT
{ nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())'; } > $T/versions.txt 2>&1
cat > $T/allreduce.py <<'PY'
import os, sys, torch, torch.distributed as dist
if sys.argv[1:] == ["hostid"]:
    os.environ["NCCL_HOSTID"] = f"commdiag-net1-host{os.environ['RANK']}"
torch.cuda.set_device(0)  # both ranks on the one GPU
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
for nbytes in (4096, 1 << 20, 16 << 20):
    t = torch.ones(nbytes // 4, device="cuda")
    for _ in range(3):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    assert t[0].item() == 2 ** 3, t[0].item()
print("rank", os.environ["RANK"], "ok", flush=True)
dist.destroy_process_group()
PY
record() {  # NAME ARG ENV...
  local name=$1 arg=$2; shift 2
  mkdir -p $T/$name
  env "$@" NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,GRAPH,NET,TUNING \
    NCCL_DEBUG_FILE=$T/$name/nccl.%h.%p.log timeout 120 python3 -m torch.distributed.run --standalone \
    --nnodes=1 --nproc-per-node=2 --max-restarts=0 $T/allreduce.py $arg > $T/$name/torchrun.txt 2>&1
  echo "$name rc=$? ($arg $*)" | tee -a $T/rc.txt
  python3 -m commdiag.cli explain --log $T/$name/nccl.*.log > $T/$name/explain.txt 2>&1
  python3 -m commdiag.cli explain --json --log $T/$name/nccl.*.log > $T/$name/explain.json 2>&1
  { echo "== $name ($arg $*)"; grep -h " via \|set by environment\|nNodes\|Duplicate" $T/$name/nccl.*.log \
      | sed -E 's/^.*NCCL (INFO|WARN) //; s/^Channel [0-9]+(\/[0-9]+)? : //' | sort | uniq -c | sort -rn | head -12
    cat $T/$name/explain.txt; } >> $T/summary.txt
}
record net-hostid hostid
record net-hostid-p2p-shm-off hostid NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
record duplicate-gpu none
cat $T/summary.txt | head -120
