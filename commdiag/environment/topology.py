"""GPU topology from NVML: GPUs, pairwise paths and P2P, NVLink, and what it means for NCCL.

The NVML access is one function, ``read_nvml()``, which returns plain data in a
recording layout (the layout of tests/fixtures/h200x2-nvlink/nvml-readings.json:
every failed call stored as ``"err: <error>"``).  Everything else is pure
analysis of that data, so a recording made on a GPU machine replays exactly:
``analyze(json.load(f))``.  ``commdiag detect --json`` embeds the readings it
used, so its own output is a recording too.

nvidia-ml-py quirk: it defines ``NVML_P2P_CAPS_INDEX_READ = (0,)`` (a tuple),
which makes ``nvmlDeviceGetP2PStatus(a, b, NVML_P2P_CAPS_INDEX_READ)`` fail with
ArgumentError.  The capability indices below are plain ints from nvml.h.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# nvml.h nvmlGpuP2PCapsIndex_t; PROP is the old name of PCI (both 4).
P2P_CAPS = {"READ": 0, "WRITE": 1, "NVLINK": 2, "ATOMICS": 3, "PROP": 4, "PCI": 4}
# nvml.h nvmlGpuP2PStatus_t
P2P_STATUS = {0: "OK", 1: "CHIPSET_NOT_SUPPORTED", 2: "GPU_NOT_SUPPORTED", 3: "IOH_TOPOLOGY_NOT_SUPPORTED",
              4: "DISABLED_BY_REGKEY", 5: "NOT_SUPPORTED", 6: "UNKNOWN"}
# nvml.h nvmlGpuTopologyLevel_t -> nvidia-smi topo -m / NCCL path names (INTERNAL: two GPUs on one board)
ANCESTOR = {0: "INT", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS: Hopper has 18; the read stops at the first error anyway
NO_REMOTE = "ffffffff:ff:ff.0"  # what NVML reports as an NVLink's remote PCI id inside this VM (unknown)

NVLINK, PCIE_P2P, PCIE_NO_P2P, MIXED, SINGLE, NO_GPU = ("nvlink", "pcie-p2p", "pcie-no-p2p", "mixed",
                                                        "single-gpu", "no-gpu")


class NvmlUnavailable(Exception):
    """No driver, no libnvidia-ml, or no nvidia-ml-py: topology is skipped with this reason."""


# --------------------------------------------------------------------------- reading (the only NVML access)


def _err(e: BaseException) -> str:
    return f"err: {type(e).__name__}: {e}" if str(e) else f"err: {type(e).__name__}"


def _call(fn, *args):
    try:
        v = fn(*args)
    except Exception as e:  # every NVML call may be NotSupported on some GPU/VM: record, go on
        return _err(e)
    return v.decode() if isinstance(v, bytes) else v


def read_nvml() -> dict:
    """Read everything topology needs from NVML into the recording layout; raises NvmlUnavailable."""
    try:
        import pynvml
    except ImportError as e:
        raise NvmlUnavailable(f"nvidia-ml-py is not installed ({e})") from None
    try:
        pynvml.nvmlInit()
    except Exception as e:
        raise NvmlUnavailable(f"NVML did not initialise: {e} (no NVIDIA driver on this machine?)") from None
    try:
        out: dict = {"driver": _call(pynvml.nvmlSystemGetDriverVersion),
                     "cuda_driver": _call(pynvml.nvmlSystemGetCudaDriverVersion), "gpus": [], "pairs": []}
        n = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        for i, h in enumerate(handles):
            pci = _call(pynvml.nvmlDeviceGetPciInfo, h)
            bus = pci if isinstance(pci, str) else _str(pci.busId)
            gpu = {"index": i, "name": _call(pynvml.nvmlDeviceGetName, h), "bus": bus,
                   "pcie_gen": _call(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
                   "pcie_width": _call(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
                   "pcie_gen_max": _call(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
                   "pcie_width_max": _call(pynvml.nvmlDeviceGetMaxPcieLinkWidth, h),
                   "numa": _call(getattr(pynvml, "nvmlDeviceGetNumaNodeId", _missing), h), "nvlinks": []}
            for link in range(NVLINK_MAX_LINKS + 1):
                state = _call(pynvml.nvmlDeviceGetNvLinkState, h, link)
                if isinstance(state, str):
                    gpu["nvlinks"].append([link, state])
                    break
                remote = _call(pynvml.nvmlDeviceGetNvLinkRemotePciInfo_v2 if hasattr(
                    pynvml, "nvmlDeviceGetNvLinkRemotePciInfo_v2") else pynvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
                gpu["nvlinks"].append([link, state, remote if isinstance(remote, str) else _str(remote.busId)])
            out["gpus"].append(gpu)
        for i, a in enumerate(handles):
            for j, b in enumerate(handles):
                if i == j:
                    continue
                pair = {"i": i, "j": j, "ancestor": _call(pynvml.nvmlDeviceGetTopologyCommonAncestor, a, b)}
                for cap, idx in P2P_CAPS.items():
                    pair[cap] = _call(pynvml.nvmlDeviceGetP2PStatus, a, b, int(idx))  # plain int, see module doc
                out["pairs"].append(pair)
        return out
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _missing(*_):
    raise NotImplementedError("not in this nvidia-ml-py")


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# --------------------------------------------------------------------------- analysis (pure)


@dataclass(frozen=True)
class NvLink:
    link: int
    active: bool
    remote_bus: str | None


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str | None
    bus_id: str | None
    pcie_gen: int | None
    pcie_width: int | None
    pcie_gen_max: int | None
    pcie_width_max: int | None
    numa: int | None
    nvlinks: list[NvLink]

    @property
    def active_links(self) -> int:
        return sum(1 for l in self.nvlinks if l.active)


@dataclass(frozen=True)
class Pair:
    i: int
    j: int
    path: str | None  # common PCIe ancestor as nvidia-smi/NCCL name it (PIX ... SYS)
    p2p: dict[str, str]  # capability -> OK / NOT_SUPPORTED / ... / "err: ..."
    nvlinks: int  # links joining them (NVSwitch or unknown remote: the GPU's active links)
    kind: str  # nvlink, pcie-p2p, pcie-no-p2p

    @property
    def label(self) -> str:
        return f"NV{self.nvlinks}" if self.kind == NVLINK else (self.path or "?")


@dataclass(frozen=True)
class Topology:
    available: bool
    reason: str | None  # why not available
    driver: str | None = None
    cuda_driver: str | None = None  # "13.0"
    gpus: list[Gpu] = field(default_factory=list)
    pairs: list[Pair] = field(default_factory=list)
    classification: str = NO_GPU
    advice: list[str] = field(default_factory=list)

    @property
    def has_nvlink(self) -> bool:
        return any(p.kind == NVLINK for p in self.pairs)

    def pair(self, i: int, j: int) -> Pair | None:
        return next((p for p in self.pairs if p.i == i and p.j == j), None)

    def matrix(self) -> str:
        """A matrix like ``nvidia-smi topo -m`` (links and paths), then the P2P status per pair."""
        if not self.gpus:
            return ""
        names = [f"GPU{g.index}" for g in self.gpus]
        lines = ["\t" + "\t".join(names) + "\tNUMA"]
        for g in self.gpus:
            row = [" X " if h.index == g.index else (self.pair(g.index, h.index).label
                                                     if self.pair(g.index, h.index) else "?") for h in self.gpus]
            lines.append(f"GPU{g.index}\t" + "\t".join(row) + f"\t{g.numa if g.numa is not None else 'N/A'}")
        lines.append("")
        lines.append("P2P (read/write/nvlink/atomics): " + "  ".join(
            f"{p.i}->{p.j} " + "/".join(_short(p.p2p.get(c)) for c in ("READ", "WRITE", "NVLINK", "ATOMICS"))
            for p in self.pairs))
        return "\n".join(lines)

    def to_json(self) -> dict:
        d = asdict(self)
        for p, pd in zip(self.pairs, d["pairs"]):
            pd["label"] = p.label
        return d


def _short(status: str | None) -> str:
    if status == "OK":
        return "ok"
    if status is None:
        return "?"
    return "err" if status.startswith("err") else "no"


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _norm_bus(b) -> str | None:
    if not isinstance(b, str) or b.startswith("err"):
        return None
    # "00000000:00:06.0" and "0000:00:06.0" name the same function: compare without the domain's padding
    parts = b.lower().split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:]
    return ":".join(parts)


def _status(v) -> str:
    if isinstance(v, int) and not isinstance(v, bool):
        return P2P_STATUS.get(v, f"status {v}")
    return str(v)


def unavailable(reason: str) -> Topology:
    return Topology(False, reason)


def analyze(readings: dict) -> Topology:
    """Recording layout -> Topology (pure)."""
    gpus = []
    for g in readings.get("gpus", []):
        links = []
        for entry in g.get("nvlinks", []):
            if len(entry) >= 3:
                links.append(NvLink(int(entry[0]), entry[1] == 1, _norm_bus(entry[2])))
        numa = _int(g.get("numa"))
        gpus.append(Gpu(int(g["index"]), g.get("name") if isinstance(g.get("name"), str) else None,
                        g.get("bus") if isinstance(g.get("bus"), str) and not g["bus"].startswith("err") else None,
                        _int(g.get("pcie_gen")), _int(g.get("pcie_width")), _int(g.get("pcie_gen_max")),
                        _int(g.get("pcie_width_max")), numa, links))
    by_index = {g.index: g for g in gpus}
    pairs = []
    for p in readings.get("pairs", []):
        i, j = int(p["i"]), int(p["j"])
        p2p = {c: _status(p.get(c)) for c in P2P_CAPS if c in p}
        gi, gj = by_index.get(i), by_index.get(j)
        direct = 0
        if gi and gj and gj.bus_id:
            direct = sum(1 for l in gi.nvlinks if l.active and l.remote_bus == _norm_bus(gj.bus_id))
        if p2p.get("NVLINK") == "OK":
            kind = NVLINK
            # remote id unknown (VM) or an NVSwitch: nvidia-smi shows the GPU's active link count
            n = direct or (gi.active_links if gi else 0)
        else:
            n = direct
            kind = NVLINK if direct else (PCIE_P2P if "OK" in (p2p.get("READ"), p2p.get("WRITE")) else PCIE_NO_P2P)
        anc = p.get("ancestor")
        pairs.append(Pair(i, j, ANCESTOR.get(anc) if isinstance(anc, int) else None, p2p, n, kind))
    cls = classify(len(gpus), pairs)
    cuda = readings.get("cuda_driver")
    cuda_s = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None
    driver = readings.get("driver") if isinstance(readings.get("driver"), str) and not str(
        readings.get("driver")).startswith("err") else None
    return Topology(True, None, driver, cuda_s, gpus, pairs, cls, p2p_level_advice(cls, pairs))


def classify(n_gpus: int, pairs: list[Pair]) -> str:
    if n_gpus == 0:
        return NO_GPU
    if n_gpus == 1 or not pairs:
        return SINGLE
    kinds = {p.kind for p in pairs}
    return kinds.pop() if len(kinds) == 1 else MIXED


def p2p_level_advice(cls: str, pairs: list[Pair]) -> list[str]:
    """What the classification means for NCCL_P2P_LEVEL (and P2P in general)."""
    far = sorted({p.path for p in pairs if p.kind == PCIE_P2P and p.path in ("PHB", "NODE", "SYS")})
    if cls == NVLINK:
        return ["All GPU pairs are joined by NVLink: NCCL uses P2P over NVLink whatever NCCL_P2P_LEVEL says "
                "(NVL is the closest level), so NCCL_P2P_LEVEL does not change the path here.",
                "Do not set NCCL_P2P_DISABLE=1: it moves traffic off NVLink to host memory."]
    if cls == PCIE_P2P:
        out = ["PCIe with P2P: NCCL uses P2P by default only between GPUs whose path is at most PXB (PCIe "
               "switches, not the CPU); NCCL_P2P_LEVEL raises or lowers that limit."]
        if far:
            out.append(f"Some pairs here are {'/'.join(far)} apart: NCCL_P2P_LEVEL=SYS (or PHB/NODE) enables P2P "
                       "across the host bridge; it can be faster or slower than going through host memory, "
                       "depending on the root complex — sweep it (e.g. grid NCCL_P2P_LEVEL: [PXB, SYS]).")
        return out
    if cls == PCIE_NO_P2P:
        return ["PCIe without P2P (common in VMs without P2P passthrough, or with ACS/IOMMU redirecting PCIe "
                "traffic): NCCL moves data through host shared memory whatever NCCL_P2P_LEVEL says, so "
                "NCCL_P2P_LEVEL has no effect; tune protocol, channels and NCCL_BUFFSIZE instead, and check "
                "ACS/IOMMU if P2P is expected."]
    if cls == MIXED:
        kinds = ", ".join(f"{p.i}-{p.j} {p.label}" for p in pairs if p.i < p.j)
        return [f"Mixed topology ({kinds}): NVLink pairs use NVLink at any NCCL_P2P_LEVEL; PCIe pairs use P2P only "
                "up to the level (default PXB); a ring is as slow as its slowest hop, so sweep NCCL_P2P_LEVEL and "
                "consider placing tensor-parallel groups on NVLink-joined GPUs."]
    if cls == SINGLE:
        return ["One GPU: no inter-GPU traffic; NCCL_P2P_LEVEL does not matter."]
    return []


def topology(readings: dict | None = None) -> Topology:
    """Analyse ``readings`` (a recording) or read NVML now; no NVML -> an unavailable Topology with the reason."""
    if readings is None:
        try:
            readings = read_nvml()
        except NvmlUnavailable as e:
            return unavailable(str(e))
    return analyze(readings)
