"""Which GPU pairs NCCL's default keeps off P2P on a PCIe box, and what NCCL_P2P_LEVEL changes.

NCCL decides per pair (``src/graph/paths.cc``, ``ncclTopoCheckP2p``): P2P when the PCIe path type is at
most ``p2pLevel``.  Since NCCL 2.23.4 (commit 68b54236) the default level is PXB: GPUs under different
CPU host bridges (NVML's PHB, NODE and SYS) exchange data through host shared memory (SHM) instead,
"as it would cause a significant performance degradation when using many GPUs"; the exception is an
AMD x86 CPU with at most 2 GPUs, where the level stays SYS.  Before 2.23.4 the default was SYS.
``NCCL_P2P_LEVEL`` (a path name, or the old numbers 0-5) sets the level; ``NCCL_P2P_DISABLE=1`` makes
it LOC.  NCCL also refuses P2P where NVML reports it unsupported, whatever the level.

Pure: ``far_pairs`` and ``advice`` take a Topology, the NCCL versions in play and the settings.
"""

from __future__ import annotations

import re

from .topology import PCIE_P2P, Topology

# NCCL's path types in order (src/graph/topo.cc topoPathTypeStr, 2.28); names from older versions
# (2.23: LOC NVL NVB PIX PXB PXN PHB SYS) keep the same relative order.
PATH_ORDER = ["LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS"]
OLD_LEVELS = ["LOC", "PIX", "PXB", "PHB", "SYS", "SYS"]  # paths.cc levelsOldToNew for NCCL_P2P_LEVEL=0..5
# NVML's common-ancestor names -> the NCCL path type between two GPUs under them.  NVML's NODE (two
# host bridges of one CPU) is one CPU node in NCCL's topology, which NCCL calls PHB.
NVML_TO_NCCL = {"PIX": "PIX", "PXB": "PXB", "PHB": "PHB", "NODE": "PHB", "SYS": "SYS"}
DEFAULT_LEVEL_SINCE = (2, 23, 4)
FAR = ("PHB", "NODE", "SYS")


def _version(text: str | None) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in str(text).split("+")[0].split(".")[:3]) if text else None
    except ValueError:
        return None


def user_level(settings: dict[str, str]) -> str | None:
    """The path level NCCL_P2P_DISABLE / NCCL_P2P_LEVEL set, as NCCL reads them (ncclGetLevel); None: unset."""
    disable = re.match(r"\s*[+]?(0[xX][0-9a-fA-F]+|\d+)", settings.get("NCCL_P2P_DISABLE") or "")
    if disable and int(disable[1], 0) == 1:  # strtol(str, NULL, 0) == 1
        return "LOC"
    level = settings.get("NCCL_P2P_LEVEL")
    if level is None:
        return None
    if level in PATH_ORDER:
        return level
    if (old := re.match(r"\d+", level)):  # the old numbers: strtol, capped at the table's end
        return OLD_LEVELS[min(int(old[0]), len(OLD_LEVELS) - 1)]
    return None  # NCCL ignores a name it does not know and keeps its default


def far_pairs(topo: Topology) -> dict[str, list[tuple[int, int]]]:
    """NVML path (PHB/NODE/SYS) -> GPU pairs (i < j) that NVML allows P2P between, under different host bridges."""
    out: dict[str, list[tuple[int, int]]] = {}
    for p in topo.pairs:
        if p.i < p.j and p.kind == PCIE_P2P and p.path in FAR:
            out.setdefault(p.path, []).append((p.i, p.j))
    return out


def _covers(level: str, nvml_path: str) -> bool:
    return PATH_ORDER.index(NVML_TO_NCCL[nvml_path]) <= PATH_ORDER.index(level)


def _names(pairs: list[tuple[int, int]], limit: int = 12) -> str:
    shown = ", ".join(f"{i}-{j}" for i, j in pairs[:limit])
    return shown + (f" and {len(pairs) - limit} more" if len(pairs) > limit else "")


HOW = ("measure it: `commdiag sweep sweeps/pcie8.yaml` has config p2p-sys (NCCL_P2P_LEVEL=SYS alone, "
       "certified against default); `commdiag explain RUN_DIR` shows the transport per GPU pair for each config")


def advice(topo: Topology, versions: list[str | None], settings: dict[str, tuple[str, str]]) -> list[tuple]:
    """Doctor records ``(severity, check, title, evidence, action)`` for PCIe pairs under different host bridges.

    ``versions``: the NCCL versions in play (this interpreter's, the probed servers'); ``settings``:
    NAME -> (value, where) as doctor sees them."""
    far = far_pairs(topo)
    if not topo.available or not far:
        return []
    every = sorted(p for pairs in far.values() for p in pairs)
    by_path = "; ".join(f"{path}: {_names(pairs)}" for path, pairs in sorted(far.items(), key=lambda kv: FAR.index(kv[0])))
    check = "P2P across host bridges"
    level = user_level({k: v for k, (v, _) in settings.items()})
    if level is not None:
        source = next((f"{k}={v} from {where}" for k, (v, where) in settings.items()
                       if k in ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL")), "")
        left = [p for path, pairs in far.items() if not _covers(level, path) for p in pairs]
        if not left:
            return [("ok", check, f"{source}: NCCL may use P2P between all {len(every)} pair(s) under different "
                     "host bridges", by_path, HOW)]
        return [("info", check, f"{source}: NCCL moves data through host memory (SHM) between {len(left)} "
                 f"GPU pair(s): {_names(sorted(left))}", by_path, HOW)]
    known = sorted({v for v in (_version(x) for x in versions) if v})
    shown = ", ".join(".".join(map(str, v)) for v in known)
    amd = (" (NCCL makes one exception: an AMD CPU with at most 2 GPUs keeps P2P)" if len(topo.gpus) <= 2 else "")
    if known and all(v < DEFAULT_LEVEL_SINCE for v in known):
        return [("info", check, f"NCCL {shown} uses P2P between all {len(every)} pair(s) under different host bridges "
                 "by default; NCCL 2.23.4 and newer does not (they go through host memory)", by_path,
                 "after an NCCL upgrade, " + HOW)]
    when = (f"NCCL {shown}" if known and all(v >= DEFAULT_LEVEL_SINCE for v in known)
            else "NCCL 2.23.4 and newer" + (f" (found {shown})" if known else " (NCCL version not found here)"))
    return [("info", check, f"{when} moves data through host memory (SHM), not P2P, between {len(every)} GPU "
             f"pair(s) under different CPU host bridges by default{amd}: {_names(every)}",
             f"NVML: P2P supported; paths {by_path}; NCCL's default P2P level is PXB since 2.23.4 "
             "(src/graph/paths.cc); NCCL_P2P_LEVEL=SYS (or PHB) allows P2P there, which can be faster or slower "
             "than host memory depending on the root complex",
             HOW)]
