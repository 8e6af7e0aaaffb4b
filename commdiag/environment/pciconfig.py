"""PCI configuration space, decoded: the PCI Express port type and the ACS extended capability.

Pure functions over the bytes of ``/sys/bus/pci/devices/BDF/config`` (little-endian, as the
kernel returns them).  How much of config space a file holds says who read it:

* 4096 bytes: all of it (root, on a platform with extended configuration space);
* 256 bytes: the conventional space only (no extended capabilities exist or can be reached);
* 64 bytes: the kernel gives users other than root only the standard header
  (``drivers/pci/pci-sysfs.c``), so neither the PCIe capability nor ACS can be read.

The ACS register layout and bit order follow the PCIe specification (ACS Extended Capability,
ID 0x000D: Capability register at +4, Control register at +6) and are printed exactly the way
``lspci -vvv`` prints them (pciutils ls-ecaps.c: ``ACSCtl:\\tSrcValid+ TransBlk- ...``), so a user
can compare the two line by line.  Every walk is bounded: a capability list that loops, points
outside the data or is garbage ends the walk, never hangs it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

HEADER_ONLY = 64  # what a non-root reader gets
CONVENTIONAL = 256  # end of conventional config space; extended capabilities start here
EXTENDED = 4096

EXT_CAP_ACS = 0x000D
CAP_PCIE = 0x10
# ACS control/capability bits 0..6, in the PCIe specification's order and lspci's names
ACS_BITS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl", "DirectTrans")
# the bits that send peer-to-peer traffic somewhere else than straight to the peer
REDIRECTING = ("ReqRedir", "CmpltRedir", "EgressCtrl")
# PCI Express Capabilities register, Device/Port Type (bits 7:4)
PORT_TYPES = {0: "endpoint", 1: "legacy endpoint", 4: "root port", 5: "switch upstream port",
              6: "switch downstream port", 7: "PCIe-to-PCI bridge", 8: "PCI-to-PCIe bridge",
              9: "root complex integrated endpoint", 10: "root complex event collector"}
_MAX_CAPS = 256  # more capabilities than fit in config space means garbage


def access(config: bytes) -> str:
    """``full``, ``conventional`` (no extended space) or ``header-only`` (not read as root)."""
    n = len(config)
    if n >= EXTENDED:
        return "full"
    if n >= CONVENTIONAL:
        return "conventional"
    return "header-only"


def _word(data: bytes, off: int) -> int | None:
    return struct.unpack_from("<H", data, off)[0] if 0 <= off and off + 2 <= len(data) else None


def _long(data: bytes, off: int) -> int | None:
    return struct.unpack_from("<I", data, off)[0] if 0 <= off and off + 4 <= len(data) else None


@dataclass(frozen=True)
class ExtCap:
    id: int
    version: int
    offset: int


def ext_capabilities(config: bytes) -> list[ExtCap]:
    """The extended capability list from offset 0x100, in list order (as lspci walks it).

    The walk stops at a zero or all-ones header, a next pointer below 0x100 or outside the data,
    and at an offset it has seen before (a loop)."""
    out: list[ExtCap] = []
    seen: set[int] = set()
    off = CONVENTIONAL
    while off and off not in seen and len(out) < _MAX_CAPS:
        header = _long(config, off)
        if header is None or header in (0, 0xFFFFFFFF):
            break
        seen.add(off)
        out.append(ExtCap(header & 0xFFFF, (header >> 16) & 0xF, off))
        nxt = (header >> 20) & 0xFFC
        off = nxt if nxt >= CONVENTIONAL else 0
    return out


def port_type(config: bytes) -> str | None:
    """The PCIe Device/Port Type from the PCI Express capability, or None (not readable, not PCIe)."""
    status = _word(config, 0x06)
    if status is None or not status & 0x10 or len(config) <= HEADER_ONLY:
        return None  # no capability list, or only the header was readable
    off, seen = config[0x34] & 0xFC if len(config) > 0x34 else 0, set()
    while off >= 0x40 and off not in seen and len(seen) < _MAX_CAPS:
        seen.add(off)
        if off + 4 > len(config):
            return None
        if config[off] == CAP_PCIE:
            flags = _word(config, off + 2)
            return PORT_TYPES.get((flags >> 4) & 0xF, f"type {(flags >> 4) & 0xF}")
        off = config[off + 1] & 0xFC
    return None


@dataclass(frozen=True)
class Acs:
    offset: int
    capability: int  # the ACS Capability register (what the port supports)
    control: int  # the ACS Control register (what is enabled)

    def enabled(self) -> dict[str, bool]:
        return {name: bool(self.control >> bit & 1) for bit, name in enumerate(ACS_BITS)}

    def supported(self) -> dict[str, bool]:
        return {name: bool(self.capability >> bit & 1) for bit, name in enumerate(ACS_BITS)}

    @property
    def redirecting(self) -> list[str]:
        on = self.enabled()
        return [b for b in REDIRECTING if on[b]]

    def lspci(self) -> str:
        """The ACSCtl line as ``lspci -vvv`` prints it (without its leading tabs)."""
        return "ACSCtl:\t" + flags(self.control)

    def to_json(self) -> dict:
        return {"offset": self.offset, "capability": self.capability, "control": self.control,
                "enabled": self.enabled(), "supported": self.supported(), "redirecting": self.redirecting,
                "lspci": self.lspci()}


def flags(word: int) -> str:
    """``SrcValid+ TransBlk- ...`` for an ACS register value, lspci's format."""
    return " ".join(f"{name}{'+' if word >> bit & 1 else '-'}" for bit, name in enumerate(ACS_BITS))


def acs(config: bytes) -> Acs | None:
    """The ACS capability, or None when the list has none (check ``access`` first: a header-only
    read has no list at all)."""
    for cap in ext_capabilities(config):
        if cap.id == EXT_CAP_ACS:
            capability, control = _word(config, cap.offset + 4), _word(config, cap.offset + 6)
            if capability is None or control is None:
                return None
            return Acs(cap.offset, capability, control)
    return None
