"""NCCL's own vocabulary: its variables and its log."""
