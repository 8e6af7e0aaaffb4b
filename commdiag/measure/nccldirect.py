"""libnccl called directly through ctypes: the "nccl-direct" path beside torch.distributed.

Inference servers call NCCL both through torch.distributed and through their own
ctypes wrappers ("pynccl"); this module is the second kind, kept lean so that
eager mode measures NCCL plus the least Python can add: the arguments of every
call are built once (``AllReduceCall``), and a call is one ctypes foreign
function call with pre-converted arguments.

It binds the very libnccl torch loaded (found in /proc/self/maps after torch's
CUDA init), so both paths measure the same library; ``library_path()`` and
``version()`` report which one.  The communicator's unique id is broadcast
through torch.distributed (the process group's store), as pynccl does.

C signatures bound (nccl.h, stable since NCCL 2.0)::

    ncclResult_t ncclGetVersion(int *version);
    ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);          // struct { char internal[128]; }
    ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
    ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
    ncclResult_t ncclGroupStart(void);  ncclResult_t ncclGroupEnd(void);
    ncclResult_t ncclCommDestroy(ncclComm_t comm);
    const char  *ncclGetErrorString(ncclResult_t result);
"""

from __future__ import annotations

import ctypes
import os
import re

NCCL_UNIQUE_ID_BYTES = 128
# ncclDataType_t (nccl.h): ncclInt8=0 ... ncclFloat16=6, ncclFloat32=7, ncclFloat64=8, ncclBfloat16=9
NCCL_DTYPES = {"int32": 2, "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
NCCL_SUM = 0  # ncclRedOp_t ncclSum


class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * NCCL_UNIQUE_ID_BYTES)]


# name -> (restype, argtypes): the table the binding and its test share.
SIGNATURES = {
    "ncclGetVersion": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int)]),
    "ncclGetUniqueId": (ctypes.c_int, [ctypes.POINTER(NcclUniqueId)]),
    "ncclCommInitRank": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, NcclUniqueId, ctypes.c_int]),
    "ncclAllReduce": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_void_p, ctypes.c_void_p]),
    "ncclGroupStart": (ctypes.c_int, []),
    "ncclGroupEnd": (ctypes.c_int, []),
    "ncclCommDestroy": (ctypes.c_int, [ctypes.c_void_p]),
    "ncclGetErrorString": (ctypes.c_char_p, [ctypes.c_int]),
}


class NcclError(RuntimeError):
    pass


def loaded_libnccl(maps_text: str | None = None) -> str | None:
    """Path of the libnccl mapped into this process (torch loads it with its CUDA libraries)."""
    if maps_text is None:
        try:
            with open("/proc/self/maps") as f:
                maps_text = f.read()
        except OSError:
            return None
    for line in maps_text.splitlines():
        m = re.search(r"(/\S*libnccl\.so[.\d]*)\s*$", line)
        if m:
            return m.group(1)
    return None


def find_libnccl() -> str:
    """The libnccl torch uses: the mapped one, else the nvidia-nccl wheel's, else the loader's."""
    path = loaded_libnccl()
    if path:
        return path
    try:
        import nvidia.nccl  # the wheel torch's CUDA builds depend on

        for d in nvidia.nccl.__path__:
            candidate = os.path.join(d, "lib", "libnccl.so.2")
            if os.path.exists(candidate):
                return candidate
    except ImportError:
        pass
    import ctypes.util

    found = ctypes.util.find_library("nccl")
    if not found:
        raise NcclError("no libnccl found (not mapped by torch, no nvidia-nccl wheel, none on the loader path)")
    return found


def bind(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


class Nccl:
    """A bound libnccl and one communicator over the current torch.distributed group."""

    def __init__(self, rank: int, world: int, path: str | None = None, group=None):
        import torch.distributed as dist

        self.path = path or find_libnccl()
        self.lib = bind(self.path)
        uid = NcclUniqueId()
        if rank == 0:
            self._check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        box = [bytes(uid.internal)]
        dist.broadcast_object_list(box, src=0, group=group)  # the same rendezvous as torch (gloo control group)
        ctypes.memmove(uid.internal, box[0], NCCL_UNIQUE_ID_BYTES)
        self.comm = ctypes.c_void_p()
        self._check(self.lib.ncclCommInitRank(ctypes.byref(self.comm), world, uid, rank), "ncclCommInitRank")

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            raise NcclError(f"{what} failed: {self.lib.ncclGetErrorString(result).decode()} (ncclResult_t {result})")

    def version(self) -> str:
        v = ctypes.c_int()
        self._check(self.lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
        return version_string(v.value)

    def allreduce_call(self, buf, dtype: str, stream_handle: int) -> "AllReduceCall":
        return AllReduceCall(self, buf, dtype, stream_handle)

    def close(self) -> None:
        if self.comm:
            self._check(self.lib.ncclCommDestroy(self.comm), "ncclCommDestroy")
            self.comm = ctypes.c_void_p()


def version_string(code: int) -> str:
    """NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9 (major*1000 + minor*100 + patch before)."""
    if code >= 20900:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


class AllReduceCall:
    """An in-place sum all-reduce with every argument converted once; calling it is one FFI call.

    The result code is checked by ``check_last`` after a timed loop rather than per call,
    so the loop measures dispatch, not Python error handling.
    """

    __slots__ = ("fn", "args", "nccl")

    def __init__(self, nccl: Nccl, buf, dtype: str, stream_handle: int):
        ptr = ctypes.c_void_p(buf.data_ptr())
        self.nccl = nccl
        self.fn = nccl.lib.ncclAllReduce
        self.args = (ptr, ptr, ctypes.c_size_t(buf.numel()), ctypes.c_int(NCCL_DTYPES[dtype]),
                     ctypes.c_int(NCCL_SUM), nccl.comm, ctypes.c_void_p(stream_handle))

    def __call__(self) -> int:
        return self.fn(*self.args)

    def checked(self) -> None:
        self.nccl._check(self.fn(*self.args), "ncclAllReduce")
