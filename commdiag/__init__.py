"""commdiag: NCCL/PCIe communication diagnostics.

Did the NCCL settings arrive, did NCCL apply them, do they help at my message
sizes by more than the noise, and are they installed so that they survive a
restart.  The package is a library; ``commdiag.cli`` is a thin click layer.
"""

__version__ = "0.1.0"
