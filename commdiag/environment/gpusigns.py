"""Whether this machine can have a CUDA GPU at all, known without importing torch.

Importing torch to count GPUs costs 4-7 s of CPU; a machine without NVIDIA's kernel driver cannot
show torch a GPU, and the driver shows itself in files: /proc/driver/nvidia/gpus/ (one folder per
GPU), the /dev/nvidia0... device nodes, WSL2's /dev/dxg.  With none of them, a GPU-only command says
"no GPU" at once; with any of them it asks torch as before (a container may hide /proc's part).
"""

from __future__ import annotations

import os
from pathlib import Path

# Where an NVIDIA driver shows itself (tests/conftest.py's GPU_SIGNS list the same, plus ROCm's)
SIGNS = ("/proc/driver/nvidia/gpus", "/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg")


def no_cuda_driver(root: str | os.PathLike = "/") -> bool:
    """True when none of the driver's files exist under ``root`` (a staged tree in tests): no CUDA GPU
    can be visible here, and asking torch would only take seconds to say so."""
    return not any((Path(root) / s.lstrip("/")).exists() for s in SIGNS)
