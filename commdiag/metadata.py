"""The environment fingerprint: one small ``collect_*`` function per source (pyperf's pattern).

Each collector returns a dict and silently skips what it cannot read, so the
fingerprint works on a laptop, a CPU CI box and an 8-GPU server alike.  The
worker calls these itself, so the fingerprint describes the process that was
actually measured.
"""

from __future__ import annotations

import ctypes
import os
import platform
import socket
import sys

from . import __version__


def collect_host() -> dict:
    return {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "commdiag": __version__,
    }


def collect_torch() -> dict:
    """torch, its CUDA and its NCCL; imports torch (call only where torch is needed anyway)."""
    try:
        import torch
    except ImportError:
        return {}
    out = {"torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        if torch.cuda.is_available():
            v = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
            out["gpu_count"] = torch.cuda.device_count()
    except Exception:  # no NCCL in this build, or a driver problem: skip, as pyperf does
        pass
    return out


def collect_gpu(device: int) -> dict:
    """Name and PCI bus id of the GPU this rank uses (torch), plus driver facts from NVML."""
    out: dict = {}
    try:
        import torch

        props = torch.cuda.get_device_properties(device)
        out["gpu_name"] = props.name
        out["pci_bus_id"] = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except Exception:
        pass
    out.update(collect_nvml_driver())
    return out


def collect_nvml_driver() -> dict:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return {}
    out: dict = {}
    try:
        v = pynvml.nvmlSystemGetDriverVersion()
        out["driver"] = v.decode() if isinstance(v, bytes) else v
        out["cuda_driver"] = pynvml.nvmlSystemGetCudaDriverVersion()
    except Exception:
        pass
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out


def libc_getenv(name: str) -> str | None:
    """The value C code (NCCL) sees, which differs from os.environ after os.putenv or setenv."""
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    libc.getenv.argtypes = [ctypes.c_char_p]
    v = libc.getenv(name.encode())
    return v.decode(errors="replace") if v is not None else None


def env_seen(names) -> dict[str, dict]:
    return {n: {"environ": os.environ.get(n), "getenv": libc_getenv(n)} for n in names}
