"""The ACS and IOMMU audit: what stands between each pair of GPUs on the PCIe tree, read from sysfs.

``audit(root)`` reads (never writes) a sysfs tree -- the live ``/`` or a captured copy -- and
returns one frozen ``PcieAudit``:

* the IOMMU: units (``/sys/class/iommu``), groups (``/sys/kernel/iommu_groups``), each GPU's group,
  its default domain type (``iommu_group/type``: ``DMA``, ``DMA-FQ``, ``identity``, ...) and the
  other devices in it, and the IOMMU options on the kernel command line (``/proc/cmdline``);
* each NVIDIA GPU's PCIe path, from its root port down to the GPU (the device's directory under
  ``/sys/devices/pciDDDD:BB/...``), every hop with its current and maximum link speed and width;
* per GPU pair, the common upstream bridge where their paths meet and the bridges between them;
* with root, the ACS Control bits of each of those bridges (``pciconfig``), and what they mean.

Why it matters (NCCL's troubleshooting guide, "PCI Access Control Services"): IO virtualization
"can interfere with GPU Direct by redirecting all PCI point-to-point traffic to the CPU root
complex, causing a significant performance reduction or even a hang".  Real reports:
NVIDIA/nccl#2079 (all-reduce deadlock, ACS on AMD root bridges), NVIDIA/nccl#1999,
vllm#9920 and vllm#33041 (TP=2 hangs fixed by disabling ACS/IOMMU).  commdiag only reports;
it never changes an ACS or IOMMU setting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import pciconfig
from .sysfs import SysfsTree

FORMAT, VERSION = "commdiag-pcie-audit", 1
# Format history: 1 -- first version (docs/formats.md, "PCIe and IOMMU audit").

BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")
NVIDIA = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA compatible controller, 3D controller
BRIDGE_CLASS = "0x0604"
CLASS_NAMES = {"0x0300": "VGA controller", "0x0302": "3D controller", "0x0604": "PCI bridge",
               "0x0600": "host bridge", "0x0200": "Ethernet controller", "0x0207": "InfiniBand controller",
               "0x0108": "NVMe controller", "0x0680": "bridge", "0x0106": "SATA controller",
               "0x0c03": "USB controller", "0x0880": "system peripheral"}
GT_PER_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
MAX_GPUS = 64  # NVML's limit per node is lower; more in a tree is garbage (and 64 GPUs are 2016 pairs)
IOMMU_TYPES = ("DMA", "DMA-FQ", "identity", "unmanaged", "blocked")

# IOMMU modes, as the audit names them
OFF, PASSTHROUGH, TRANSLATED, TRANSLATED_LAZY = "off", "passthrough", "translated", "translated (lazy)"
ASSIGNED, BLOCKED, UNKNOWN, MIXED = "assigned to a VM or vfio", "blocked", "unknown", "mixed"
_MODE_OF_TYPE = {"identity": PASSTHROUGH, "DMA": TRANSLATED, "DMA-FQ": TRANSLATED_LAZY,
                 "unmanaged": ASSIGNED, "blocked": BLOCKED}

# ACS states of a bridge
ACS_REDIRECT, ACS_ON, ACS_OFF, ACS_ABSENT = "redirect", "on, no redirect", "off", "no ACS capability"
ACS_NEEDS_ROOT, ACS_NO_EXTENDED, ACS_UNREADABLE = "needs root", "no extended config space", "unreadable"

NCCL_ACS = ("https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html"
            "#pci-access-control-services-acs")
SUDO_DETECT = 'sudo "$(command -v commdiag)" detect'


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Link:
    speed: str | None  # as the kernel prints it, "16.0 GT/s PCIe"
    gen: int | None
    width: int | None
    max_speed: str | None
    max_gen: int | None
    max_width: int | None

    def text(self) -> str:
        if self.gen is None and self.width is None and self.max_gen is None and self.max_width is None:
            return "no link attributes"

        def one(g, w):
            return f"gen{g if g is not None else '?'} x{w if w is not None else '?'}"
        return f"{one(self.gen, self.width)} (max {one(self.max_gen, self.max_width)})"


@dataclass(frozen=True)
class Hop:
    bdf: str
    kind: str  # GPU, root port, switch upstream port, switch downstream port, bridge, class name
    kind_from: str  # "config" (the PCIe capability), "position" (where it sits in the tree), "class"
    class_code: str | None
    vendor: str | None
    device: str | None
    link: Link
    config_bytes: int | None  # how many bytes of config space could be read (None: not read)
    acs: pciconfig.Acs | None

    @property
    def is_bridge(self) -> bool:
        return (self.class_code or "").startswith(BRIDGE_CLASS)

    @property
    def acs_state(self) -> str | None:
        """None for hops whose ACS was not read (GPUs and other endpoints)."""
        if not self.is_bridge:
            return None
        if self.config_bytes is None:
            return ACS_UNREADABLE
        if self.config_bytes < pciconfig.CONVENTIONAL:
            return ACS_NEEDS_ROOT
        if self.acs is None:
            return ACS_ABSENT if self.config_bytes >= pciconfig.EXTENDED else ACS_NO_EXTENDED
        if self.acs.redirecting:
            return ACS_REDIRECT
        return ACS_ON if self.acs.control & 0x7F else ACS_OFF

    def to_json(self) -> dict:
        return {"bdf": self.bdf, "kind": self.kind, "kind_from": self.kind_from, "class": self.class_code,
                "vendor": self.vendor, "device": self.device,
                "link": {"speed": self.link.speed, "gen": self.link.gen, "width": self.link.width,
                         "max_speed": self.link.max_speed, "max_gen": self.link.max_gen,
                         "max_width": self.link.max_width},
                "config_bytes": self.config_bytes, "acs_state": self.acs_state,
                "acs": self.acs.to_json() if self.acs else None}


@dataclass(frozen=True)
class GpuPath:
    bdf: str
    index: int | None  # NVML's index when NVML named this bus id, else None
    host_bridge: str | None  # pci0000:00
    hops: list[Hop]  # the root port first, the GPU last
    iommu_group: str | None
    iommu_type: str | None
    group_peers: list[str]  # the other devices in its IOMMU group, "BDF class-name"
    error: str | None = None

    @property
    def label(self) -> str:
        return f"GPU{self.index}" if self.index is not None else self.bdf

    @property
    def bridges(self) -> list[Hop]:
        """The hops above the GPU: bridges (in a PCIe tree, every one of them), root port first."""
        return self.hops[:-1]

    def to_json(self) -> dict:
        return {"bdf": self.bdf, "index": self.index, "host_bridge": self.host_bridge,
                "hops": [h.to_json() for h in self.hops], "iommu_group": self.iommu_group,
                "iommu_type": self.iommu_type, "group_peers": self.group_peers, "error": self.error}


@dataclass(frozen=True)
class PairPath:
    a: str
    b: str
    label: str  # "GPU0-GPU1"
    meeting: str | None  # BDF of the common upstream bridge, a host bridge name, or None
    meeting_kind: str  # "bridge", "host bridge", "different host bridges", "unknown"
    between: list[str]  # bridges on the path from one GPU to the other (BDFs), the meeting point excluded
    redirecting: dict[str, list[str]]  # bridge -> redirecting ACS bits
    unreadable: list[str]  # bridges whose ACS could not be read

    @property
    def verdict(self) -> str:
        if self.meeting_kind == "unknown":
            return "unknown path"
        if self.redirecting:
            return "redirected"
        if self.unreadable:
            return "ACS unread"
        if not self.between:
            return "no bridge between"
        return "not redirected"

    def to_json(self) -> dict:
        return {"a": self.a, "b": self.b, "label": self.label, "meeting": self.meeting,
                "meeting_kind": self.meeting_kind, "between": self.between, "redirecting": self.redirecting,
                "unreadable": self.unreadable, "verdict": self.verdict}


@dataclass(frozen=True)
class Iommu:
    units: list[str]  # /sys/class/iommu entries: dmar0 (Intel VT-d), ivhd0 (AMD-Vi), ...
    groups: int  # entries under /sys/kernel/iommu_groups
    cmdline: list[str]  # the IOMMU/ACS options on the kernel command line, verbatim
    mode: str
    detail: str

    def to_json(self) -> dict:
        return {"units": self.units, "groups": self.groups, "cmdline": self.cmdline, "mode": self.mode,
                "detail": self.detail}


@dataclass(frozen=True)
class PcieAudit:
    root: str
    available: bool
    reason: str | None = None
    iommu: Iommu | None = None
    gpus: list[GpuPath] = field(default_factory=list)
    pairs: list[PairPath] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def bridges(self) -> dict[str, Hop]:
        """Every bridge on a GPU's path, once, by BDF."""
        return {h.bdf: h for g in self.gpus for h in g.bridges}

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "root": self.root, "available": self.available,
                "reason": self.reason, "iommu": self.iommu.to_json() if self.iommu else None,
                "gpus": [g.to_json() for g in self.gpus], "pairs": [p.to_json() for p in self.pairs],
                "problems": self.problems}


# --------------------------------------------------------------------------- reading


def _hex_attr(tree: SysfsTree, rel: str, digits: int) -> str | None:
    """A ``0x...`` attribute (vendor, class), validated: anything else in a hostile tree is None."""
    v = tree.read_text(rel)
    return v.lower() if v and re.fullmatch(rf"0x[0-9a-fA-F]{{{digits}}}", v) else None


def _speed(v: str | None) -> tuple[str | None, int | None]:
    m = re.match(r"^([0-9]+(?:\.[0-9]+)?) GT/s", v or "")
    if not m:
        return None, None
    return m.group(0) + (" PCIe" if v.endswith(" PCIe") else ""), GT_PER_GEN.get(float(m.group(1)))


def _width(v: str | None) -> int | None:
    return int(v) if v and v.isdigit() and 0 < int(v) <= 32 else None


def read_link(tree: SysfsTree, dev: str) -> Link:
    speed, gen = _speed(tree.read_text(f"{dev}/current_link_speed"))
    max_speed, max_gen = _speed(tree.read_text(f"{dev}/max_link_speed"))
    return Link(speed, gen, _width(tree.read_text(f"{dev}/current_link_width")), max_speed, max_gen,
                _width(tree.read_text(f"{dev}/max_link_width")))


def _class_name(code: str | None) -> str:
    if code is None:
        return "device"
    return CLASS_NAMES.get(code[:6], f"class {code}")


def _norm_bus(bus: str | None) -> str | None:
    """NVML's ``00000000:03:00.0`` -> sysfs's ``0000:03:00.0`` (the domain as the kernel prints it, %04x)."""
    if not isinstance(bus, str):
        return None
    parts = bus.lower().split(":")
    if len(parts) == 3 and re.fullmatch(r"[0-9a-f]{1,8}", parts[0]):
        parts[0] = f"{int(parts[0], 16):04x}"
    out = ":".join(parts)
    return out if BDF.match(out) else None


def kernel_options(cmdline: str) -> list[str]:
    """The options of ``/proc/cmdline`` that set the IOMMU or ACS, verbatim (at most 20)."""
    out = []
    for tok in cmdline.split()[:1000]:
        if tok == "--":  # what follows is for init, not the kernel
            break
        key = tok.split("=", 1)[0].lower()
        if (key in ("iommu", "intel_iommu", "amd_iommu", "pcie_acs_override", "vfio_iommu_type1.allow_unsafe_interrupts")
                or key.startswith("iommu.") or (key == "pci" and "acs" in tok.lower())):
            out.append(tok[:200])
    return out[:20]


def _cmdline_mode(options: list[str]) -> str | None:
    """What the command line asks for: off, passthrough, or None (nothing said)."""
    mode = None
    for tok in options:
        key, _, value = tok.partition("=")
        values = value.lower().split(",")
        if key in ("iommu", "intel_iommu", "amd_iommu") and "off" in values:
            mode = OFF
        elif (key == "iommu" and "pt" in values) or (key == "iommu.passthrough" and value in ("1", "y", "on")):
            mode = PASSTHROUGH
    return mode


def iommu_state(tree: SysfsTree, gpu_types: list[str | None]) -> Iommu:
    units = [u for u in (tree.listdir("sys/class/iommu") or []) if re.fullmatch(r"[\w.:-]{1,64}", u)]
    groups = [g for g in (tree.listdir("sys/kernel/iommu_groups") or []) if g.isdigit()]
    options = kernel_options(tree.read_text("proc/cmdline", 65536) or "")
    asked = _cmdline_mode(options)
    types = sorted({t for t in gpu_types if t})
    if not gpu_types:  # no GPU: the machine's groups say it
        types = sorted({t for t in (_group_type(tree, f"sys/kernel/iommu_groups/{g}") for g in groups[:64]) if t})
    if len(types) > 1:
        mode = MIXED
        detail = f"the GPUs' IOMMU groups have different domain types ({', '.join(types)})"
    elif types:
        mode = _MODE_OF_TYPE[types[0]]
        detail = {
            PASSTHROUGH: "identity domain: the IOMMU does not translate the GPUs' DMA (iommu=pt or the "
                         "platform's default)",
            TRANSLATED: "DMA domain: the IOMMU translates every DMA of the GPUs, peer traffic included",
            TRANSLATED_LAZY: "DMA-FQ domain: the IOMMU translates every DMA of the GPUs (invalidations "
                             "batched)",
            ASSIGNED: "unmanaged domain: the GPUs belong to vfio (a VM or a user-space driver)",
            BLOCKED: "blocked domain: the GPUs' DMA is blocked"}[mode]
    elif not groups:
        mode = OFF
        detail = ("no IOMMU groups: no IOMMU translates DMA here (disabled in the firmware or on the kernel "
                  "command line, or a VM without a virtual IOMMU)")
        if units:
            detail = f"IOMMU units are registered ({', '.join(units[:4])}) but no device is in a group"
    elif asked == PASSTHROUGH:
        mode, detail = PASSTHROUGH, "iommu=pt on the kernel command line (this kernel shows no group type)"
    else:
        mode, detail = UNKNOWN, ("IOMMU groups exist but this kernel shows no group type (before 5.11) and the "
                                 "command line does not say iommu=pt: translated, unless the platform defaults "
                                 "to passthrough")
    return Iommu(units[:64], len(groups), options, mode, detail)


def _group_type(tree: SysfsTree, group: str) -> str | None:
    t = tree.read_text(f"{group}/type")
    return t if t in IOMMU_TYPES else None


def _kind(config: bytes | None, class_code: str | None, depth: int, is_gpu: bool) -> tuple[str, str]:
    """(kind, where it came from) of the hop at ``depth`` below the host bridge (0: on the root bus)."""
    if is_gpu:
        return "GPU", "class"
    port = pciconfig.port_type(config) if config else None
    if port:
        return port, "config"
    if (class_code or "").startswith(BRIDGE_CLASS):
        # a PCIe hierarchy alternates below a root port: switch upstream port, downstream ports, ...
        if depth == 0:
            return "root port", "position"
        return ("switch upstream port" if depth % 2 else "switch downstream port"), "position"
    return _class_name(class_code), "class"


def _gpu_path(tree: SysfsTree, bdf: str, index: int | None, classes: dict[str, str | None]) -> GpuPath:
    real = tree.resolve(f"sys/bus/pci/devices/{bdf}")
    if real is None:
        return GpuPath(bdf, index, None, [], None, None, [], "its sysfs link does not resolve")
    parts = real.split("/")
    hosts = [i for i, p in enumerate(parts) if HOST_BRIDGE.match(p)]
    if not hosts or parts[-1] != bdf:
        return GpuPath(bdf, index, None, [], None, None, [], f"not under a PCI host bridge: {real[:200]}")
    host = hosts[0]
    chain = [(i, p) for i, p in enumerate(parts) if i > host and BDF.match(p)]
    hops = []
    depth = 0  # bridges above this hop since the last device that is not a bridge (e.g. Intel VMD)
    for i, name in chain:
        dev = "/".join(parts[:i + 1])
        cls = _hex_attr(tree, f"{dev}/class", 6)
        is_gpu = name == bdf
        config = None
        if (cls or "").startswith(BRIDGE_CLASS):
            config = tree.read_bytes(f"{dev}/config", pciconfig.EXTENDED)
        kind, source = _kind(config, cls, depth, is_gpu)
        depth = depth + 1 if (cls or "").startswith(BRIDGE_CLASS) else 0
        acs = pciconfig.acs(config) if config and len(config) > pciconfig.CONVENTIONAL else None
        hops.append(Hop(name, kind, source, cls, _hex_attr(tree, f"{dev}/vendor", 4),
                        _hex_attr(tree, f"{dev}/device", 4), read_link(tree, dev),
                        len(config) if config is not None else None, acs))
    group_dir = tree.resolve(f"{real}/iommu_group")
    group = gtype = None
    peers: list[str] = []
    if group_dir is not None:
        group = group_dir.rsplit("/", 1)[-1][:16]
        gtype = _group_type(tree, group_dir)
        members = tree.listdir(f"{group_dir}/devices")
        if members is None:  # a capture without the group's devices/: ask every device instead
            members = [d for d in classes if tree.resolve(f"sys/bus/pci/devices/{d}/iommu_group") == group_dir]
        peers = [f"{m} {_class_name(classes.get(m))}" for m in members if BDF.match(m) and m != bdf]
    return GpuPath(bdf, index, parts[host], hops, group, gtype, peers[:32])


def _pair(a: GpuPath, b: GpuPath) -> PairPath:
    label = f"{a.label}-{b.label}"
    if a.error or b.error or not a.hops or not b.hops:
        return PairPath(a.bdf, b.bdf, label, None, "unknown", [], {}, [])
    ba, bb = a.bridges, b.bridges
    n = 0
    if a.host_bridge == b.host_bridge:
        while n < min(len(ba), len(bb)) and ba[n].bdf == bb[n].bdf:
            n += 1
    between = ba[n:] + bb[n:]
    if a.host_bridge != b.host_bridge:
        meeting, kind = None, "different host bridges"
    elif n:
        meeting, kind = ba[n - 1].bdf, "bridge"
    else:
        meeting, kind = a.host_bridge, "host bridge"
    redirecting = {h.bdf: h.acs.redirecting for h in between if h.acs_state == ACS_REDIRECT}
    unreadable = [h.bdf for h in between if h.acs_state in (ACS_NEEDS_ROOT, ACS_UNREADABLE)]
    return PairPath(a.bdf, b.bdf, label, meeting, kind, [h.bdf for h in between], redirecting, unreadable)


def audit(root: str = "/", *, nvml_bus_ids=(), tree: SysfsTree | None = None) -> PcieAudit:
    """Read the IOMMU state, every NVIDIA GPU's PCIe path and the bridges between each pair.

    ``nvml_bus_ids``: NVML's bus id per GPU index, to name GPUs as NVML (and CUDA with
    CUDA_DEVICE_ORDER=PCI_BUS_ID) do; GPUs NVML did not name are shown by bus id."""
    tree = tree or SysfsTree(root)
    devices = tree.listdir("sys/bus/pci/devices")
    if devices is None:
        return PcieAudit(tree.root, False, f"no sys/bus/pci/devices under {tree.root} (not Linux, or not a "
                                           "sysfs tree)", problems=tree.problems)
    devices = [d for d in devices if BDF.match(d)]
    classes = {d: _hex_attr(tree, f"sys/bus/pci/devices/{d}/class", 6) for d in devices}
    gpus = [d for d in devices if (classes[d] or "")[:6] in GPU_CLASSES
            and _hex_attr(tree, f"sys/bus/pci/devices/{d}/vendor", 4) == NVIDIA]
    if len(gpus) > MAX_GPUS:
        tree.problems.append(f"{len(gpus)} NVIDIA GPUs in sysfs: only the first {MAX_GPUS} audited")
        gpus = gpus[:MAX_GPUS]
    index = {b: i for i, b in enumerate(_norm_bus(x) for x in nvml_bus_ids) if b}
    paths = [_gpu_path(tree, d, index.get(d), classes) for d in gpus]
    paths.sort(key=lambda g: (g.index is None, g.index if g.index is not None else 0, g.bdf))
    pairs = [_pair(a, b) for i, a in enumerate(paths) for b in paths[i + 1:]]
    iommu = iommu_state(tree, [g.iommu_type for g in paths])
    return PcieAudit(tree.root, True, None, iommu, paths, pairs, list(tree.problems))
