"""Synthetic Kineto traces in torch.profiler's exact shape (the header and event fields of the real
traces in tests/fixtures/traces/), for what the real ones do not show: a launch-bound eager step, and a
trace of hundreds of MB (benchmarks/trace_speed.py).

One TP decode step = ``layers`` x (compute kernels, one NCCL all-reduce with its record_param_comms).
``eager``: every kernel has its own cudaLaunchKernel, ``launch_us`` apart on the CPU; the GPU runs a
kernel in ``kernel_us``, so with launch_us > kernel_us the GPU waits for the CPU (launch-bound).
``graph``: one cudaGraphLaunch per step, the kernels back to back.  ``filler``: CPU operators and flow
events per kernel, as a real trace carries (they make up most of a real file's size).
"""

from __future__ import annotations

import gzip
import json

HEADER = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320,
                                                     "computeMajor": 9, "computeMinor": 0, "numSms": 132}],
          "record_shapes": 1, "cuda_driver_version": 13000, "cuda_runtime_version": 13000, "cupti_version": 130001,
          "displayTimeUnit": "ms", "baseTimeNanoseconds": 1790857026000000000}
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
COMPUTE = ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_NNT",
           "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>, "
           "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)")


def events(mode: str, steps: int = 3, layers: int = 4, kernels_per_layer: int = 3, kernel_us: float = 5.0,
           launch_us: float = 20.0, nccl_us: float = 30.0, nelems: int = 32768, filler: int = 0, rank: int = 0,
           step_name: str = "ProfilerStep#{i}", t0: float = 5495804062317.0):
    """The trace events of ``steps`` steps, one at a time (a generator: a 500 MB trace is never in memory)."""
    pid, tid = 500 + rank, 500 + rank
    corr = ext = 0
    cpu = gpu = t0
    for i in range(steps):
        step_start = cpu
        body = []
        if mode == "graph":
            corr += 1
            body.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": pid, "tid": tid,
                         "ts": cpu + 5, "dur": 10.0, "args": {"cbid": 311, "correlation": corr}})
            gpu = max(gpu, cpu + 20)
            graph_corr = corr
        for layer in range(layers):
            for k in range(kernels_per_layer + 1):
                is_nccl = k == kernels_per_layer
                name = NCCL if is_nccl else COMPUTE[k % len(COMPUTE)]
                dur = nccl_us if is_nccl else kernel_us
                ext += 1
                if mode == "eager":
                    corr += 1
                    cpu += launch_us
                    if is_nccl:
                        body.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": pid, "tid": tid,
                                     "ts": cpu - 8, "dur": 12.0, "args": {
                                         "External id": ext, "Collective name": "allreduce", "dtype": "BFloat16",
                                         "In msg nelems": nelems, "Out msg nelems": nelems, "Group size": 2,
                                         "Process Group Ranks": "[0, 1]"}})
                    body.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid,
                                 "ts": cpu, "dur": 4.0, "args": {"External id": ext, "cbid": 211, "correlation": corr}})
                    start = max(gpu, cpu + 3)
                    kcorr = corr
                else:
                    start, kcorr = gpu, graph_corr
                body.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": start, "dur": dur,
                             "args": {"External id": ext if mode == "eager" else None, "queued": 0, "device": 0,
                                      "context": 1, "stream": 7, "correlation": kcorr, "registers per thread": 96,
                                      "grid": [2, 1, 1], "block": [640, 1, 1]}})
                gpu = start + dur + 1.0
                for f in range(filler):
                    body.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": tid,
                                 "ts": cpu - 2 + 0.01 * f, "dur": 1.5, "args": {
                                     "External id": ext, "Record function id": 0, "Concrete Inputs": ["", ""],
                                     "Input type": ["c10::BFloat16", "c10::BFloat16"],
                                     "Input Strides": [[4096, 1], [6144, 1]], "Input Dims": [[8, 4096], [4096, 6144]],
                                     "Ev Idx": ext}})
                    body.append({"ph": "s", "id": kcorr, "pid": pid, "tid": tid, "ts": cpu, "cat": "ac2g", "name": "ac2g"})
                    body.append({"ph": "f", "id": kcorr, "pid": 0, "tid": 7, "ts": start, "cat": "ac2g", "name": "ac2g",
                                 "bp": "e"})
        cpu = max(cpu, step_start + 30) + 5
        yield {"ph": "X", "cat": "user_annotation", "name": step_name.format(i=i), "pid": pid, "tid": tid,
               "ts": step_start, "dur": cpu - step_start, "args": {"External id": 0, "Record function id": 0}}
        yield from body
        if mode == "graph":
            cpu = max(cpu, gpu)  # the next replay starts after this one (a synchronising server loop)
        cpu += 10


def write(path, mode: str, *, rank: int = 0, world_size: int = 2, gz: bool | None = None, header: dict | None = None,
          **kw) -> str:
    """Write one rank's trace (gzipped when the name ends in .gz); returns the path."""
    head = dict(HEADER if header is None else header)
    if world_size and header is None:
        head["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size, "nccl_version": "2.28.9"}
    gz = str(path).endswith(".gz") if gz is None else gz
    opener = gzip.open(path, "wt", compresslevel=1) if gz else open(path, "w")
    with opener as f:
        f.write("{\n" + "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in head.items()))
        f.write('  "traceEvents": [\n')
        first = True
        for ev in events(mode, rank=rank, **kw):
            f.write(("  " if first else ",\n  ") + json.dumps(ev))
            first = False
        f.write('\n  ],\n  "traceName": "synthetic"\n}\n')
    return str(path)
