"""What this machine is, for NCCL: Python startup hooks, GPU topology, versions.

``detect()`` returns one frozen ``Detection`` with three parts:

1. Python hooks per interpreter (this one and each ``--python PATH``), from
   ``pyprobe.probe`` (which runs none of them);
2. the GPU topology from NVML (``topology.py``; replayable from a recording);
3. versions: driver, CUDA driver, NCCL (from torch when it is importable and has
   CUDA, else from the libnccl found), torch, Python.

No driver or no NVML makes part 2 one line with the reason; the rest still works.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os
import platform
import sys
from dataclasses import dataclass, field

from . import pcie as pcie_mod, pcieadvice, pyprobe
from ..errors import CommdiagError
from .topology import Topology, topology


@dataclass(frozen=True)
class PythonReport:
    python: str  # as given (or sys.executable)
    hooks: pyprobe.PythonHooks | None
    error: str | None = None

    def to_json(self) -> dict:
        return {"python": self.python, "hooks": self.hooks.to_json() if self.hooks else None, "error": self.error}


@dataclass(frozen=True)
class Detection:
    pythons: list[PythonReport]
    topology: Topology
    versions: dict
    nvml_readings: dict | None = None  # what topology was computed from: a recording, replayable
    notes: list[str] = field(default_factory=list)
    pcie: pcie_mod.PcieAudit | None = None  # the ACS/IOMMU audit (pcie.py); None when not asked for

    @property
    def ok(self) -> bool:
        """Every interpreter asked for was probed (no GPU is not a problem: detect says so and goes on)."""
        return not any(p.error for p in self.pythons)

    def to_json(self) -> dict:
        return {"pythons": [p.to_json() for p in self.pythons], "topology": self.topology.to_json(),
                "versions": self.versions, "nvml_readings": self.nvml_readings, "notes": self.notes,
                "pcie": self.pcie.to_json() if self.pcie else None}


def find_libnccl() -> str | None:
    """libnccl: pip's nvidia-nccl wheels in this interpreter's site dirs, then the system's loader path."""
    import site

    dirs = list(getattr(site, "getsitepackages", lambda: [])()) + [p for p in sys.path if p.endswith("-packages")]
    for d in dict.fromkeys(dirs):
        for hit in sorted(glob.glob(os.path.join(d, "nvidia", "nccl", "lib", "libnccl.so*"))):
            return hit
    return ctypes.util.find_library("nccl")


def libnccl_version(path: str) -> str | None:
    try:
        lib = ctypes.CDLL(path)
        v = ctypes.c_int()
        if lib.ncclGetVersion(ctypes.byref(v)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    code = v.value  # NCCL_VERSION(X,Y,Z): X*10000+Y*100+Z since 2.9, X*1000+Y*100+Z before
    major, rest = (code // 10000, code % 10000) if code >= 10000 else (code // 1000, code % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def torch_build(folder: str | None = None) -> tuple[str, str | None] | None:
    """(version, CUDA version or None) of the torch this interpreter would import (or of the torch package
    in ``folder``), as its torch/version.py states them, read without importing torch (seconds on a busy
    machine, for a CPU build that has no NCCL to ask for anyway); None where there is no torch or that
    file does not read as expected."""
    import ast

    if folder is None:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            return None
        folder = next(iter(spec.submodule_search_locations))
    path = os.path.join(folder, "version.py")
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(100_000))
    except (OSError, SyntaxError, ValueError):
        return None
    found = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id in ("__version__", "cuda") and node.value is not None:
            try:
                found[target.id] = ast.literal_eval(node.value)
            except ValueError:
                return None
    version, cuda = found.get("__version__"), found.get("cuda", "")
    if not isinstance(version, str) or not (cuda is None or isinstance(cuda, str)) or cuda == "":
        return None
    return version, cuda


def collect_versions(topo: Topology, *, with_torch: bool = True) -> dict:
    out: dict = {"python": platform.python_version(), "python_executable": sys.executable,
                 "driver": topo.driver, "cuda_driver": topo.cuda_driver, "torch": None, "torch_cuda": None,
                 "nccl": None, "nccl_source": None}
    build = torch_build() if with_torch and "torch" not in sys.modules else None
    if build is not None and build[1] is None:  # a CPU build: no NCCL in it, and no import needed to know
        out["torch"] = build[0]
    elif with_torch and importlib.util.find_spec("torch") is not None:
        try:
            import torch

            out["torch"], out["torch_cuda"] = torch.__version__, torch.version.cuda
            if torch.version.cuda:
                v = torch.cuda.nccl.version()
                out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
                out["nccl_source"] = "torch.cuda.nccl.version()"
        except Exception:  # a CPU build has no NCCL: fall through to the library
            pass
    if out["nccl"] is None:
        lib = find_libnccl()
        if lib:
            out["nccl"], out["nccl_source"] = libnccl_version(lib), lib
    return out


def detect(pythons=(), *, current: bool = True, nvml_readings: dict | None = None, with_torch: bool = True,
           cross_check: bool = True, sysfs_root: str | None = "/") -> Detection:
    """Probe interpreters, read (or replay) the topology, audit ACS/IOMMU under ``sysfs_root``
    (None: skip it), collect versions."""
    reports = []
    targets = ([sys.executable] if current else []) + [p for p in pythons]
    for py in dict.fromkeys(targets):
        try:
            # read-only: as root, a tree another user can change is probed as that user (trust.py)
            reports.append(PythonReport(py, pyprobe.probe(py, cross_check=cross_check, allow_user_owned=True)))
        except CommdiagError as e:
            reports.append(PythonReport(py, None, str(e)))
    readings = nvml_readings
    notes = []
    if readings is None:
        from .topology import NvmlUnavailable, read_nvml

        try:
            readings = read_nvml()
        except NvmlUnavailable as e:
            # the reason is the topology's own, said once (render and to_json both carry it)
            topo = Topology(False, str(e))
        else:
            topo = topology(readings)
    else:
        if not isinstance(readings, dict) or not all(
                isinstance(readings.get(k, []), list) and all(isinstance(x, dict) for x in readings.get(k, []))
                for k in ("gpus", "pairs")):
            raise CommdiagError("--nvml-replay: not an NVML recording (a mapping with lists 'gpus' and 'pairs', "
                                "as nvml-readings.json or `commdiag detect --json` writes)")
        try:
            topo = topology(readings)
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            raise CommdiagError(f"--nvml-replay: the recording has an unexpected shape "
                                f"({e.__class__.__name__}: {str(e)[:120]})") from None
        notes.append("topology replayed from a recording")
    audit = None if sysfs_root is None else pcie_mod.audit(sysfs_root, nvml_bus_ids=[g.bus_id for g in topo.gpus])
    return Detection(reports, topo, collect_versions(topo, with_torch=with_torch), readings, notes, audit)


def shadowing(h: pyprobe.PythonHooks, shadowed: str) -> tuple[str, str, str]:
    """Why a sitecustomize.py does not load and what to do: (why, command, what the command does).

    detect and doctor say the same words."""
    loaded = h.sitecustomize or "nothing"
    why = (f"`import sitecustomize` in {h.executable} finds {loaded} first on sys.path, and Python runs only "
           f"the first one it finds, so the code in {shadowed} never runs")
    return (why, f"commdiag install-hook --python {h.executable}",
            "it installs a .pth hook, which no sitecustomize shadows; or move that code into the sitecustomize "
            "that loads")


def wrapped(label: str, text: str, indent: str) -> list[str]:
    """``label text`` wrapped to 100 columns, continuation lines aligned under the text."""
    import textwrap

    return textwrap.wrap(text, 100, initial_indent=f"{indent}{label}", subsequent_indent=indent + " " * len(label),
                         break_on_hyphens=False, break_long_words=False)


def _entry(text: str) -> list[str]:
    """One entry of an interpreter's listing within 100 columns: wrapped at its spaces (a long path moves to
    a line of its own, under the entry), never cut inside a path."""
    import textwrap

    return textwrap.wrap(text, 100, initial_indent="    ", subsequent_indent="      ", break_on_hyphens=False,
                         break_long_words=False)


def render(d: Detection) -> str:
    lines = ["Python hooks"]
    for r in d.pythons:
        lines.append(f"  {r.python}")
        if r.hooks is None:
            lines.append(f"    error: {r.error}")
            continue
        h = r.hooks
        venv = f" (venv of {h.base_prefix})" if h.in_venv else ""
        lines += _entry(f"Python {h.version}, prefix {h.prefix}{venv}")
        target = f" -> {h.sitecustomize_target}" if h.sitecustomize_target and h.sitecustomize_target != h.sitecustomize else ""
        lines.append(f"    sitecustomize: {h.sitecustomize or 'none'}{target}")
        for s in h.shadowed_sitecustomize:
            lines.append(f"    SHADOWED (will not load): {s}")
            why, command, how = shadowing(h, s)
            lines += wrapped("why: ", why, "      ") + wrapped("do:  ", f"{command} ({how})", "      ")
        lines += _entry(f"usercustomize: {h.usercustomize or 'none'}   user site: {h.user_site} "
                        f"({'enabled' if h.user_site_enabled else 'disabled'})")
        for f, n, line in h.pth_exec:
            lines += _entry(f".pth runs code: {f}:{n}")
            lines.append(f"      {line[:90]}{'...' if len(line) > 90 else ''}")
        if h.disabled_by:
            lines.append(f"    disabled by: {', '.join(h.disabled_by)}")
        lines += _entry(f"site-packages: {', '.join(h.site_packages) or 'none'}")
        lines += _entry(f"cross-check (a normal start): {h.cross_check}")
    lines.append("")
    t = d.topology
    if not t.available:
        lines.append(f"Topology: unavailable: {t.reason}")
        lines.append("  the topology checks (NVLink/PCIe, P2P, LL128, NVLS) are skipped; the rest works")
    else:
        lines.append(f"Topology: {len(t.gpus)} GPU(s), {t.classification}")
        for g in t.gpus:
            lines.append(f"  GPU{g.index} {g.name} {g.bus_id} PCIe gen{g.pcie_gen}x{g.pcie_width} "
                         f"(max gen{g.pcie_gen_max}x{g.pcie_width_max}) NUMA {g.numa if g.numa is not None else 'N/A'} "
                         f"NVLink {g.active_links}/{len(g.nvlinks)} active")
        lines.append("")
        lines += ["  " + l for l in t.matrix().splitlines()]
        lines.append("")
        for a in t.advice:
            lines += wrapped("NCCL_P2P_LEVEL: ", a, "  ")
    lines.append("")
    if d.pcie is not None:
        lines += pcieadvice.render(d.pcie) + [""]
    v = d.versions
    lines.append("Versions: " + ", ".join(f"{k} {v[k]}" for k in ("driver", "cuda_driver", "nccl", "torch", "python")
                                          if v.get(k)))
    if v.get("nccl_source"):
        lines.append(f"  NCCL from {v['nccl_source']}")
    lines += [f"note: {n}" for n in d.notes]
    return "\n".join(lines)
