"""Measuring: sweeps of fresh torchrun launches, the worker, the launcher, NCCL's choices."""
