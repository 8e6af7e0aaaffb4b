"""What a link can carry at most, one direction, in GB/s (10^9 bytes/s): pure arithmetic.

PCIe: transfer rate per lane after line coding, times the width.  A copy between two GPUs
over PCIe crosses both GPUs' links, so its ceiling is the slower of the two.  Real copies
reach about 85-90% of it (TLP headers and flow control; PCIe Gen5 x16 is 63 GB/s raw and
about 55 GB/s measured P2P one way on RTX 5090 / RTX PRO 6000 on EPYC).

NVLink: links joining the pair times the per-link rate of the GPU's generation, told by its
compute capability (NVML's own version number is ambiguous: older drivers return the major
version, newer ones the nvmlNvlinkVersion_t enum, where NVLink 4.0 is 6).
"""

from __future__ import annotations

from .result import Ceiling, Link

# GB/s per lane and direction: GT/s x coding / 8.  Gen1-2: 8b/10b; Gen3-5: 128b/130b;
# Gen6-7: PAM4 with 256-byte FLITs carrying 242 bytes of TLP and DLLP (64 and 128 GT/s).
PCIE_LANE_GBPS = {1: 2.5 * 0.8 / 8, 2: 5.0 * 0.8 / 8, 3: 8.0 * 128 / 130 / 8, 4: 16.0 * 128 / 130 / 8,
                  5: 32.0 * 128 / 130 / 8, 6: 64.0 * 242 / 256 / 8, 7: 128.0 * 242 / 256 / 8}
# GB/s per NVLink and direction by compute capability major: P100 (6) NVLink 1, 20; V100 (7),
# A100 (8) and H100/H200 (9) NVLink 2-4, 25 (a link is 50 GB/s both ways); B200/GB200 (10) NVLink 5, 50.
NVLINK_LINK_GBPS = {6: 20.0, 7: 25.0, 8: 25.0, 9: 25.0, 10: 50.0}


def pcie_gbps(gen: int | None, width: int | None) -> float | None:
    if gen not in PCIE_LANE_GBPS or not width or width <= 0:
        return None
    return PCIE_LANE_GBPS[gen] * width


def _link_terms(link: Link | None) -> tuple[int | None, int | None, str]:
    """(gen, width, how it was read): under load if NVML gave it, else the maximum."""
    if link is None:
        return None, None, "unknown"
    if link.gen is not None and link.width is not None:
        return link.gen, link.width, "under load"
    return link.gen_max, link.width_max, "maximum (no reading under load)"


def gpu_ceiling(link: Link | None) -> Ceiling | None:
    """One GPU's PCIe link, one direction: the ceiling of its host copies."""
    gen, width, how = _link_terms(link)
    g = pcie_gbps(gen, width)
    return None if g is None else Ceiling(round(g, 2), f"PCIe gen{gen} x{width} ({how})")


def pair_ceiling(link_a: Link | None, link_b: Link | None, nvlinks: int = 0,
                 capability: str | None = None) -> Ceiling | None:
    """One direction of a pair: NVLink when NVML counts links between them, else the slower PCIe end."""
    if nvlinks > 0:
        try:
            rate = NVLINK_LINK_GBPS.get(int(str(capability).split(".")[0]))
        except ValueError:
            rate = None
        if rate is None:
            return None
        return Ceiling(round(rate * nvlinks, 2), f"NVLink x{nvlinks} at {rate:g} GB/s each (compute {capability})")
    ends = [_link_terms(link_a), _link_terms(link_b)]
    rates = [pcie_gbps(g, w) for g, w, _ in ends]
    if any(r is None for r in rates):
        return None
    slow = min(range(2), key=lambda k: rates[k])
    (ga, wa, ha), (gb, wb, hb) = ends
    how = ha if ha == hb else f"{ha} / {hb}"
    if (ga, wa) == (gb, wb):
        basis = f"PCIe gen{ga} x{wa} (both ends, {how})"
    else:
        basis = f"PCIe gen{ends[slow][0]} x{ends[slow][1]} (slower end of gen{ga} x{wa} / gen{gb} x{wb}, {how})"
    return Ceiling(round(rates[slow], 2), basis)
