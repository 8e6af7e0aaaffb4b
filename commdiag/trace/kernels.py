"""What a GPU kernel is, from its name: NCCL communication (and which collective, algorithm, protocol
and data type NCCL chose), another communication kernel, a memory copy, or compute.

The classes are HTA's (``hta.utils.utils.get_kernel_type``), so the time split agrees with HTA's
temporal breakdown: a kernel whose name contains ``nccl`` is communication, ``Memcpy``/``Memset``
(or a ``gpu_memcpy``/``gpu_memset`` event) is memory, everything else is compute.  One addition,
kept apart from NCCL: the custom all-reduce kernels of vLLM and SGLang (``cross_device_reduce``,
``custom_all_reduce``, ``one_shot``/``two_shot`` all-reduce) are communication too, but no NCCL
variable changes them.

NCCL names its kernels after what it runs: ``ncclDevKernel_AllReduce_Sum_bf16_RING_LL`` (NCCL >= 2.19),
``ncclKernel_AllReduce_RING_LL_Sum_bfloat16`` (older).  Several collectives of one launch, or a
``Generic`` kernel, carry no single algorithm: they are "?" here, said as unknown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

COMPUTE, NCCL, CUSTOM_COMM, MEMORY = "compute", "nccl", "custom-comm", "memory"

_CUSTOM_COMM = re.compile(r"cross_device_reduce|custom_all_reduce|allreduce_fusion|one_shot_all_reduce|"
                          r"two_shot_all_reduce|quickreduce|mscclpp", re.I)
_ALGO_PROTO = re.compile(r"(?:^|_)(RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|NVLS_TREE|NVLS|PAT)_(LL128|LL|SIMPLE)(?:_|$)")
_COLLECTIVES = ("AllReduce", "AllGather", "ReduceScatter", "Reduce", "Broadcast", "SendRecv", "AllToAll", "Send",
                "Recv", "Generic")
_DTYPES = {"i8": "int8", "int8": "int8", "u8": "uint8", "uint8": "uint8", "i32": "int32", "int32": "int32",
           "u32": "uint32", "uint32": "uint32", "i64": "int64", "int64": "int64", "u64": "uint64", "uint64": "uint64",
           "f16": "float16", "half": "float16", "f32": "float32", "float": "float32", "f64": "float64",
           "double": "float64", "bf16": "bfloat16", "bfloat16": "bfloat16", "f8e4m3": "float8_e4m3",
           "f8e5m2": "float8_e5m2"}
_OPS = ("Sum", "Prod", "Max", "Min", "PreMulSum", "SumPostDiv")


@dataclass(frozen=True)
class NcclKernel:
    """What an NCCL kernel's name says NCCL chose ("?" where it does not say)."""

    collective: str
    algorithm: str
    protocol: str
    dtype: str
    op: str

    def to_json(self) -> dict:
        return {"collective": self.collective, "algorithm": self.algorithm, "protocol": self.protocol,
                "dtype": self.dtype, "op": self.op}


def kind(name: str, category: str) -> str:
    """COMPUTE, NCCL, CUSTOM_COMM or MEMORY for a GPU event (``category``: the reader's kernel/memcpy/memset)."""
    if "nccl" in name:  # HTA: is_comm_kernel
        return NCCL
    if category != "kernel" or name.startswith(("Memcpy", "Memset")):
        return MEMORY
    if _CUSTOM_COMM.search(name):
        return CUSTOM_COMM
    return COMPUTE


def parse_nccl(name: str) -> NcclKernel:
    """An NCCL kernel name -> its collective, algorithm, protocol, data type and reduction."""
    base = name.split("(", 1)[0].strip()
    for prefix in ("ncclDevKernel_", "ncclKernel_", "void ncclDevKernel_", "void ncclKernel_"):
        if base.startswith(prefix):
            base = base[len(prefix):]
            break
    parts = base.split("_")
    collective = next((c for c in _COLLECTIVES if parts and parts[0] == c), parts[0] if parts and parts[0] else "?")
    m = _ALGO_PROTO.search(base)
    algorithm, protocol = (m.group(1), m.group(2)) if m else ("?", "?")
    dtype = next((_DTYPES[p] for p in parts if p in _DTYPES), "?")
    op = next((p for p in parts if p in _OPS), "?")
    return NcclKernel(collective, algorithm, protocol, dtype, op)


# torch's dtype names in record_param_comms ("BFloat16", "Float", ...) -> bytes per element
DTYPE_BYTES = {"BFloat16": 2, "Half": 2, "Float": 4, "Double": 8, "Int": 4, "Long": 8, "Short": 2, "Char": 1,
               "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1,
               "Float8_e5m2fnuz": 1, "ComplexFloat": 8, "ComplexDouble": 16, "UInt32": 4, "UInt64": 8}
