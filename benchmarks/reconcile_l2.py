"""Why nccl-tests and commdiag differ for the seed settings at 14.7 MB: which buffer state matters.

Run on 2 GPUs with the seed settings in the environment:
    torchrun --nproc_per_node 2 benchmarks/reconcile_l2.py
Each variant: torch.distributed.all_reduce (in place, as commdiag and torch-based servers call it) of
14.7 MB bf16, per-call CUDA events, median over 50 calls after 10 warm-up calls:
    alone        the 14.7 MB tensor, calls back to back (commdiag's case)
    slice117     the first 14.7 MB of a 117 MB tensor (nccl-tests' buffers when -e 117 MB)
    l2flush      as alone, but 256 MB of another tensor is written before each call (evicts L2)
    random       as alone, but the buffer is refilled from a random bf16 tensor before each call
    direct-in    libnccl's ncclAllReduce through ctypes (commdiag's nccl-direct), send == receive
    direct-out   the same, out of place: send and receive are two 14.7 MB buffers (nccl-tests'
                 first column; vLLM/SGLang-style pynccl wrappers that return a new tensor do this)
Prints one line per variant (rank 0).
"""

from __future__ import annotations

import os
import statistics

import torch
import torch.distributed as dist

N = 14680064 // 2
BIG = 117440512 // 2
CALLS, WARM = 50, 10


def timed(buf, before=None, call=None) -> float:
    times = []
    for i in range(WARM + CALLS):
        if before is not None:
            before()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        if call is None:
            dist.all_reduce(buf)
        else:
            call()
        b.record()
        b.synchronize()
        if i >= WARM:
            times.append(a.elapsed_time(b) * 1000.0)
    return statistics.median(times)


def main() -> None:
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    out = {}
    buf = torch.zeros(N, dtype=torch.bfloat16, device="cuda")
    out["alone"] = timed(buf)
    big = torch.zeros(BIG, dtype=torch.bfloat16, device="cuda")
    out["slice117"] = timed(big[:N])
    scratch = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    out["l2flush"] = timed(buf, lambda: scratch.fill_(1))
    src = (torch.randn(N, device="cuda") * 0.01).to(torch.bfloat16)
    out["random"] = timed(buf, lambda: buf.copy_(src))
    import ctypes
    from commdiag.measure import nccldirect

    nccl = nccldirect.Nccl(rank, dist.get_world_size(), group=dist.new_group(backend="gloo"))
    stream = torch.cuda.current_stream().cuda_stream
    same = nccl.allreduce_call(buf, "bfloat16", stream)
    out["direct-in"] = timed(buf, call=same)
    recv = torch.zeros_like(buf)
    other = nccl.allreduce_call(buf, "bfloat16", stream)
    other.args = (other.args[0], ctypes.c_void_p(recv.data_ptr()), *other.args[2:])
    out["direct-out"] = timed(buf, lambda: buf.copy_(src), call=other)
    torch.cuda.synchronize()
    nccl.close()
    if rank == 0:
        env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_") and k != "NCCL_DEBUG_FILE"}
        print("env", " ".join(f"{k}={v}" for k, v in env.items()))
        for k, v in out.items():
            print(f"{k:<11} {v:9.2f} us  (median of {CALLS} calls, per-call CUDA events)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
