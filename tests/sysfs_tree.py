"""Constructed sysfs trees in the kernel's layout, for the PCIe/IOMMU audit tests.

The layout follows the kernel's ABI documents (Documentation/ABI/testing/sysfs-bus-pci,
sysfs-kernel-iommu_groups) and the real tree captured on the GPU machine
(tests/fixtures/pcie/h200x1-vm): a device is a directory under ``sys/devices/pciDDDD:BB/``, nested
below its bridges; ``sys/bus/pci/devices/BDF`` is a relative link to it; attributes are one line
(``0x10de``, ``0x030200``, ``16.0 GT/s PCIe``, ``16``); ``iommu_group`` links to
``sys/kernel/iommu_groups/N``, whose ``devices/`` links back and whose ``type`` names the default
domain.  Config space is real bytes: a type 0/1 header, a capability list with the PCI Express
capability, and an extended capability list at 0x100 (AER, then ACS when asked for).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

ACS_ALL = 0x005F  # the ACS capability most switch ports report: V B R C U T (no egress control)
ACS_KERNEL = 0x001D  # what Linux's pci_enable_acs sets on such a port: SrcValid ReqRedir CmpltRedir UpstreamFwd
SPEEDS = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe"}


def config_space(vendor: int, device: int, class_code: int, *, port_type: int | None = None,
                 acs_ctl: int | None = None, acs_cap: int = ACS_ALL, link=(4, 16, 4, 16), size: int = 4096,
                 buses=(0, 0, 0), dsn: int | None = None) -> bytes:
    """Config space bytes as the kernel returns them (little-endian), cut to ``size`` (64: a
    non-root reader; 256: no extended space)."""
    c = bytearray(4096)
    bridge = class_code >> 8 == 0x0604
    struct.pack_into("<HHHH", c, 0, vendor, device, 0x0007, 0x0010)  # command; status: capability list
    c[0x08] = 0xA1
    c[0x09:0x0C] = bytes([class_code & 0xFF, class_code >> 8 & 0xFF, class_code >> 16 & 0xFF])
    c[0x0E] = 0x01 if bridge else 0x00
    if bridge:
        c[0x18:0x1B] = bytes(buses)
    c[0x34] = 0x40
    c[0x40:0x42] = bytes([0x01, 0x60])  # power management, next: PCI Express
    struct.pack_into("<H", c, 0x42, 0x0003)
    pt = port_type if port_type is not None else (4 if bridge else 0)
    c[0x60:0x62] = bytes([0x10, 0x00])  # PCI Express capability, last in the list
    struct.pack_into("<H", c, 0x62, 0x0002 | pt << 4)
    gen, width, max_gen, max_width = link
    struct.pack_into("<I", c, 0x6C, max_gen | max_width << 4)  # Link Capabilities
    struct.pack_into("<H", c, 0x72, gen | width << 4)  # Link Status
    # extended capabilities: AER at 0x100, then ACS at 0x148 and a Device Serial Number at 0x180,
    # each when asked for
    caps = [(0x100, 0x0001, 2)] + ([(0x148, 0x000D, 1)] if acs_ctl is not None else []) + (
        [(0x180, 0x0003, 1)] if dsn is not None else [])
    for n, (off, cap_id, version) in enumerate(caps):
        nxt = caps[n + 1][0] if n + 1 < len(caps) else 0
        struct.pack_into("<I", c, off, cap_id | version << 16 | nxt << 20)
    if acs_ctl is not None:
        struct.pack_into("<HH", c, 0x14C, acs_cap, acs_ctl)
    if dsn is not None:
        struct.pack_into("<Q", c, 0x184, dsn)
    return bytes(c[:size])


class Tree:
    """A sysfs root under ``path``: ``tree.device(...)`` adds a PCI function where the kernel would."""

    def __init__(self, path: Path, cmdline: str = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet"):
        self.root = Path(path)
        self.dirs: dict[str, Path] = {}
        (self.root / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
        (self.root / "sys/class/iommu").mkdir(parents=True, exist_ok=True)
        (self.root / "sys/kernel/iommu_groups").mkdir(parents=True, exist_ok=True)
        (self.root / "proc").mkdir(exist_ok=True)
        (self.root / "proc/cmdline").write_text(cmdline + "\n")

    def device(self, bdf: str, parent: str | None, *, vendor: int, device: int, class_code: int,
               link=(4, 16, 4, 16), config: bytes | None = None, group: int | None = None,
               host: str | None = None, **config_args) -> Path:
        """``parent``: the BDF of the bridge above, or None for the root bus of ``host``
        (default ``pciDDDD:BB`` from the BDF)."""
        if parent is None:
            host = host or f"pci{bdf[:4]}:{bdf[5:7]}"
            top = self.root / "sys/devices" / host
            top.mkdir(parents=True, exist_ok=True)
            d = top / bdf
        else:
            d = self.dirs[parent] / bdf
        d.mkdir()
        self.dirs[bdf] = d
        gen, width, max_gen, max_width = link
        attrs = {"vendor": f"0x{vendor:04x}", "device": f"0x{device:04x}", "class": f"0x{class_code:06x}",
                 "current_link_speed": SPEEDS[gen], "current_link_width": str(width),
                 "max_link_speed": SPEEDS[max_gen], "max_link_width": str(max_width)}
        for name, value in attrs.items():
            (d / name).write_text(value + "\n")
        if config is None:
            config = config_space(vendor, device, class_code, link=link, **config_args)
        (d / "config").write_bytes(config)
        link_path = self.root / "sys/bus/pci/devices" / bdf
        os.symlink(os.path.relpath(d, link_path.parent), link_path)
        if group is not None:
            self.join_group(bdf, group)
        return d

    def join_group(self, bdf: str, group: int, type_: str | None = None) -> None:
        g = self.root / "sys/kernel/iommu_groups" / str(group)
        (g / "devices").mkdir(parents=True, exist_ok=True)
        d = self.dirs[bdf]
        os.symlink(os.path.relpath(g, d), d / "iommu_group")
        os.symlink(os.path.relpath(d, g / "devices"), g / "devices" / bdf)
        if type_ is not None:
            self.group_type(group, type_)

    def group_type(self, group: int, type_: str) -> None:
        (self.root / "sys/kernel/iommu_groups" / str(group) / "type").write_text(type_ + "\n")

    def iommu_unit(self, name: str) -> None:
        target = self.root / "sys/devices/virtual/iommu" / name
        target.mkdir(parents=True)
        os.symlink(os.path.relpath(target, self.root / "sys/class/iommu"), self.root / "sys/class/iommu" / name)


NV, GPU_CLASS, BRIDGE = 0x10DE, 0x030200, 0x060400
BROADCOM, AMD = 0x1000, 0x1022


def switch_box(path: Path, *, acs_ctl: int | None, iommu: str | None = None, config_size: int = 4096,
               cmdline: str = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet") -> Tree:
    """Two GPUs behind one PCIe switch (a root port, the switch's upstream port, two downstream
    ports) -- the layout of a PCIe GPU server with PLX/Broadcom switches.  ``acs_ctl`` on the
    downstream ports (None: they have no ACS capability); ``iommu``: each group's type, or None
    for no IOMMU."""
    t = Tree(path, cmdline)
    groups = iommu is not None
    if groups:
        t.iommu_unit("dmar0")
    t.device("0000:00:01.0", None, vendor=0x8086, device=0x347A, class_code=BRIDGE, port_type=4,
             acs_ctl=acs_ctl, buses=(0, 1, 4), group=1 if groups else None, size=config_size)
    t.device("0000:01:00.0", "0000:00:01.0", vendor=BROADCOM, device=0xC010, class_code=BRIDGE, port_type=5,
             buses=(1, 2, 4), group=2 if groups else None, size=config_size)
    for n, (dsp, gpu) in enumerate((("0000:02:00.0", "0000:03:00.0"), ("0000:02:01.0", "0000:04:00.0"))):
        t.device(dsp, "0000:01:00.0", vendor=BROADCOM, device=0xC010, class_code=BRIDGE, port_type=6,
                 acs_ctl=acs_ctl, buses=(2, 3 + n, 3 + n), group=3 + 2 * n if groups else None, size=config_size)
        t.device(gpu, dsp, vendor=NV, device=0x2BB5, class_code=GPU_CLASS, link=(1, 16, 5, 16),
                 group=4 + 2 * n if groups else None, size=config_size)
    if groups:
        for g in range(1, 7):
            t.group_type(g, iommu)
    return t


def root_ports_box(path: Path) -> Tree:
    """Three GPUs: two under different root ports of one host bridge, one under a second host
    bridge (another CPU socket); AMD root ports with ACS as Linux enables it with an IOMMU on."""
    t = Tree(path, "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro amd_iommu=on iommu=pt")
    t.iommu_unit("ivhd0")
    t.iommu_unit("ivhd1")
    for n, (rp, gpu) in enumerate((("0000:00:01.1", "0000:01:00.0"), ("0000:00:03.1", "0000:02:00.0"),
                                   ("0000:40:01.1", "0000:41:00.0"))):
        t.device(rp, None, vendor=AMD, device=0x14AB, class_code=BRIDGE, port_type=4, acs_ctl=ACS_KERNEL,
                 group=10 + 2 * n)
        t.device(gpu, rp, vendor=NV, device=0x2BB5, class_code=GPU_CLASS, link=(5, 16, 5, 16), group=11 + 2 * n)
    for g in range(10, 16):
        t.group_type(g, "identity")
    return t


def two_socket_box(path: Path) -> Tree:
    """Eight GPUs, four behind one PCIe switch per CPU socket (host bridges pci0000:00 and
    pci0000:40); ACS as Linux enables it on the root ports and on the first two downstream ports of
    each switch, off on the other two; the GPU 0000:44:00.0 trained at x8 in an x16 slot; IOMMU on
    (DMA groups)."""
    t = Tree(path, "BOOT_IMAGE=/vmlinuz-6.8 root=/dev/nvme0n1p2 ro amd_iommu=on")
    t.iommu_unit("ivhd0")
    g = 0
    for s, (rp, bus) in enumerate((("0000:00:01.1", 0x01), ("0000:40:01.1", 0x41))):
        t.device(rp, None, vendor=AMD, device=0x14AB, class_code=BRIDGE, port_type=4, acs_ctl=ACS_KERNEL,
                 buses=(0, bus, bus + 5), group=100 + s)
        usp = f"0000:{bus:02x}:00.0"
        t.device(usp, rp, vendor=BROADCOM, device=0xC010, class_code=BRIDGE, port_type=5, group=100 + s)
        for k in range(4):
            dsp, gpu = f"0000:{bus + 1:02x}:{k:02x}.0", f"0000:{bus + 2 + k:02x}:00.0"
            t.device(dsp, usp, vendor=BROADCOM, device=0xC010, class_code=BRIDGE, port_type=6,
                     acs_ctl=ACS_KERNEL if k < 2 else 0, group=200 + g)
            t.device(gpu, dsp, vendor=NV, device=0x2BB5, class_code=GPU_CLASS,
                     link=(1, 8 if gpu == "0000:44:00.0" else 16, 5, 16), group=300 + g)
            t.group_type(300 + g, "DMA")
            g += 1
    return t
