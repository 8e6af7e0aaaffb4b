"""Persisting settings: Python startup hooks, systemd drop-ins, nccl.conf, exact undo."""
