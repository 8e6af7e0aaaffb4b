"""What the ACS/IOMMU audit means and what to do: detect's text and doctor's records.

Pure functions over a ``pcie.PcieAudit``.  The fixes named are the documented ones (NCCL's
troubleshooting guide): ACS off in the BIOS, or ``setpci`` per bridge after every boot, and
``iommu=pt``; commdiag itself never changes a setting.
"""

from __future__ import annotations

import textwrap

from . import pcie

MEANING = ("NCCL's troubleshooting guide: IO virtualization (VT-d, IOMMU) with ACS \"can interfere with GPU "
           "Direct by redirecting all PCI point-to-point traffic to the CPU root complex, causing a significant "
           "performance reduction or even a hang\" (real cases: NVIDIA/nccl#2079, #1999; vllm#9920, #33041).")
ACS_FIX = ("the documented fixes: turn ACS off in the BIOS (often under IO virtualization, VT-d, AMD-Vi or "
           "an ACS setting); or, lost at every reboot, per bridge `sudo setpci -s BDF ECAP_ACS+0x6.w=0000`; "
           "with an IOMMU on, also boot with iommu=pt. Both remove the isolation VMs and vfio rely on. "
           "Check again with `sudo lspci -vvv -s BDF | grep -i ACSCtl`. commdiag changes none of these.")
IOMMU_FIX = ("if P2P between the GPUs is slow or hangs (NCCL's check: cuda-samples' p2pBandwidthLatencyTest), "
             "boot with iommu=pt (kernel command line, e.g. GRUB_CMDLINE_LINUX; then update-grub and reboot), "
             "or turn the IOMMU (VT-d / AMD-Vi) off in the BIOS when no VM or vfio needs it. "
             "commdiag changes neither.")
_ACS_SHORT = {pcie.ACS_REDIRECT: "ACS redirect on", pcie.ACS_ON: "ACS on, no redirect", pcie.ACS_OFF: "ACS off",
              pcie.ACS_ABSENT: "no ACS capability", pcie.ACS_NEEDS_ROOT: "ACS needs root",
              pcie.ACS_NO_EXTENDED: "no extended config space", pcie.ACS_UNREADABLE: "config unreadable"}
_PORTS_BELOW = ("root port", "switch downstream port")  # their link attributes describe the link below them


def _wrap(label: str, text: str, indent: str, hang: str | None = None) -> list[str]:
    """``label text`` within 100 columns; continuation lines under the text (or at ``hang``)."""
    return textwrap.wrap(text, 100, initial_indent=indent + label,
                         subsequent_indent=hang if hang is not None else indent + " " * len(label),
                         break_on_hyphens=False, break_long_words=False)


def _few(items: list[str], n: int = 6) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def degraded_links(a: pcie.PcieAudit) -> list[tuple[str, pcie.Hop, int]]:
    """(GPU label, hop, width both ends allow) for each link narrower than both of its ends can run.

    A port's own maximum is not enough: an x16 slot holding an x8 card is not degraded.  The other
    end of a root or downstream port's link is the hop below it; of anything else, the hop above."""
    out, seen = [], set()
    for g in a.gpus:
        for i, h in enumerate(g.hops):
            if h.link.width is None or h.link.max_width is None or h.bdf in seen:
                continue
            other = g.hops[i + 1] if h.kind in _PORTS_BELOW and i + 1 < len(g.hops) else (
                g.hops[i - 1] if i and h.kind not in _PORTS_BELOW else None)
            allowed = min(h.link.max_width, other.link.max_width if other and other.link.max_width else 99)
            if h.link.width < allowed:
                seen.add(h.bdf)
                out.append((g.label, h, allowed))
    return out


def _hop_name(label: str, h: pcie.Hop) -> str:
    """``GPU3 0000:44:00.0``, ``GPU 0000:44:00.0`` (no NVML index) or ``0000:42:01.0 (switch
    downstream port) above GPU3``."""
    if h.kind == "GPU":
        return f"GPU {h.bdf}" if label == h.bdf else f"{label} {h.bdf}"
    return f"{h.bdf} ({h.kind}) above {label}"


def _slow_links(a: pcie.PcieAudit) -> list[tuple[str, pcie.Hop]]:
    """Links below their maximum speed now, each hop once (a root port is on several GPUs' paths)."""
    out: dict[str, tuple[str, pcie.Hop]] = {}
    for g in a.gpus:
        for h in g.hops:
            if h.link.gen is not None and h.link.max_gen is not None and h.link.gen < h.link.max_gen:
                out.setdefault(h.bdf, (g.label, h))
    return list(out.values())


# --------------------------------------------------------------------------- detect's text

_MEET = {"bridge": "meet at {}", "host bridge": "meet at host bridge {}",
         "different host bridges": "under different host bridges (CPU sockets or root complexes)",
         "unknown": "path unknown"}
_CELL = {"redirected": "REDIR", "not redirected": "ok", "ACS unread": "root?", "no bridge between": "-",
         "unknown path": "?"}
_LIST_UP_TO = 6  # pairs listed one per line; more (5+ GPUs) become a matrix and the meeting points


def _short(g: pcie.GpuPath) -> str:
    return g.label if g.index is not None else g.bdf[5:]


def _pairs(a: pcie.PcieAudit) -> list[str]:
    """One line per pair, or for many GPUs a GPU x GPU matrix of the ACS verdict (within 100 columns)
    and the pairs grouped by where they meet."""
    if not a.pairs:
        return []
    names = {g.bdf: _short(g) for g in a.gpus}
    width = max(len(n) for n in names.values()) + 2
    if len(a.pairs) > _LIST_UP_TO and 4 + width * (len(a.gpus) + 1) <= 100:
        lines = ["  GPU pairs, ACS between them: REDIR redirected, ok not redirected, root? needs root, "
                 "- no bridge"]
        by = {(p.a, p.b): p for p in a.pairs}
        lines.append("    " + " " * width + "".join(f"{names[g.bdf]:>{width}}" for g in a.gpus))
        for g in a.gpus:
            cells = [" X" if g.bdf == h.bdf else _CELL[(by.get((g.bdf, h.bdf)) or by[(h.bdf, g.bdf)]).verdict]
                     for h in a.gpus]
            lines.append(f"    {names[g.bdf]:<{width}}" + "".join(f"{c:>{width}}" for c in cells))
        meets: dict[str, list[str]] = {}
        for p in a.pairs:
            meets.setdefault(_MEET[p.meeting_kind].format(p.meeting), []).append(f"{names[p.a]}-{names[p.b]}")
        for where, pairs in meets.items():
            lines += _wrap("", f"{where}: {_few(pairs, 8)}", "    ", "      ")
        redirecting = sorted({b for p in a.pairs for b in p.redirecting})
        if redirecting:
            lines += _wrap("", f"ACS redirect on at {_few(redirecting, 8)}", "    ", "      ")
        return lines
    lines = ["  GPU pairs: where their paths meet, the bridges between them, ACS"]
    for p in a.pairs:
        verdict = {"redirected": "ACS redirect on at " + ", ".join(p.redirecting),
                   "ACS unread": "ACS not read (needs root)", "not redirected": "no ACS redirect",
                   "no bridge between": "nothing to check", "unknown path": ""}[p.verdict]
        n = len(p.between)
        text = f"{_MEET[p.meeting_kind].format(p.meeting)}; {n} bridge{'s' if n != 1 else ''} between; {verdict}"
        lines += _wrap(f"{p.label}: ", text.rstrip("; "), "    ")
    return lines


def render(a: pcie.PcieAudit) -> list[str]:
    lines = [f"PCIe and IOMMU (sysfs under {a.root})"]
    if not a.available:
        return lines + [f"  unavailable: {a.reason}"]
    io = a.iommu
    units = f"IOMMU units {_few(io.units, 4)}" if io.units else "no IOMMU units"
    lines += _wrap("", f"IOMMU {io.mode}: {io.detail}. {units}, {io.groups} group(s); kernel command line: "
                   f"{' '.join(io.cmdline) or 'no IOMMU option'}", "  ")
    if not a.gpus:
        lines.append("  no NVIDIA GPU in sysfs")
    shown = set()  # a bridge shared by several GPUs' paths shows its ACSCtl line once
    for g in a.gpus:
        group = (f"IOMMU group {g.iommu_group} ({g.iommu_type or 'no type shown'})" if g.iommu_group
                 else "no IOMMU group")
        peers = f", shared with {_few(g.group_peers, 3)}" if g.group_peers else (", alone in it" if g.iommu_group
                                                                                   else "")
        name = f"{g.label} {g.bdf}" if g.index is not None else g.bdf
        lines += _wrap("", f"{name} under {g.host_bridge or '?'}; {group}{peers}", "  ")
        if g.error:
            lines.append(f"    path unknown: {g.error}")
            continue
        if len(g.hops) == 1:
            lines.append("    on the root bus: no root port or switch above it (typical of a VM)")
        for h in g.hops:
            state = h.acs_state
            lines.append(f"    {h.bdf:<13} {h.kind[:22]:<22} {h.link.text():<24} {_ACS_SHORT.get(state, '')}".rstrip())
            if state in (pcie.ACS_REDIRECT, pcie.ACS_ON) and h.bdf not in shown:
                shown.add(h.bdf)
                lines.append(f"      {h.acs.lspci()}".replace("\t", " "))
    lines += _pairs(a)
    unread = sorted({b for p in a.pairs for b in p.unreadable})
    if unread:
        lines += _wrap("", "ACS needs root: the kernel shows other users only the first 64 bytes of config "
                       f"space. Run `sudo lspci -vvv -s {unread[0]} | grep -i ACSCtl` for each bridge "
                       f"({_few(unread)}), or `{pcie.SUDO_DETECT}`.", "  ")
    if any(p.redirecting for p in a.pairs):
        lines += _wrap("", MEANING, "  ") + _wrap("do: ", ACS_FIX, "  ")
    for label, h, allowed in degraded_links(a):
        lines += _wrap("", f"{_hop_name(label, h)}: link runs x{h.link.width}, both ends allow x{allowed}: a "
                       "degraded link (riser, slot, seating)", "  ")
    lines += [f"  skipped: {p}" for p in a.problems]
    return lines


# --------------------------------------------------------------------------- doctor's records


def _record(severity, check, title, evidence="", action="") -> dict:
    return {"severity": severity, "check": check, "title": title, "evidence": evidence, "action": action}


def records(a: pcie.PcieAudit) -> list[dict]:
    """doctor's records for the audit: IOMMU, ACS, links, skipped entries (keys of doctor.Finding)."""
    if not a.available:
        return [_record("info", "pcie", "no PCIe/IOMMU view", a.reason or "", "the ACS/IOMMU checks are skipped")]
    out = []
    n = len(a.gpus)
    io = a.iommu
    ev = (f"{io.detail}; units: {_few(io.units, 4) or 'none'}; groups: {io.groups}; kernel command line: "
          f"{' '.join(io.cmdline) or 'no IOMMU option'}")
    if io.mode in (pcie.TRANSLATED, pcie.TRANSLATED_LAZY, pcie.UNKNOWN, pcie.MIXED) and n >= 2:
        sev = "info" if io.mode == pcie.UNKNOWN else "warning"
        out.append(_record(sev, "iommu", f"IOMMU {io.mode} with {n} GPUs: peer traffic may be slowed or hang",
                           ev, IOMMU_FIX))
    elif io.mode in (pcie.TRANSLATED, pcie.TRANSLATED_LAZY, pcie.ASSIGNED, pcie.BLOCKED, pcie.UNKNOWN, pcie.MIXED):
        out.append(_record("info", "iommu", f"IOMMU {io.mode}", ev,
                           "no GPU pair here, so no peer traffic to slow down" if n < 2 else ""))
    else:
        out.append(_record("ok", "iommu", f"IOMMU {io.mode}: GPU DMA is not translated", ev))
    redirected = [p for p in a.pairs if p.redirecting]
    unread = sorted({b for p in a.pairs for b in p.unreadable})
    bridges = a.bridges()
    if n == 0:
        out.append(_record("info", "acs", "no NVIDIA GPU in sysfs: nothing between GPUs to check"))
    elif n == 1:
        out.append(_record("ok", "acs", "one GPU: no GPU pair, ACS does not matter"))
    if redirected:
        by_line: dict[str, list[str]] = {}  # bridges with the same ACSCtl line, named together
        for b in sorted({b for p in redirected for b in p.redirecting}):
            by_line.setdefault(bridges[b].acs.lspci().replace("\t", " "), []).append(f"{b} ({bridges[b].kind})")
        out.append(_record(
            "warning", "acs", f"ACS redirects peer-to-peer traffic between {len(redirected)} of {len(a.pairs)} "
                              "GPU pair(s) to the root complex",
            "; ".join(f"{line} on {', '.join(names)}" for line, names in by_line.items())
            + f"; pairs: {_few([p.label for p in redirected])}. " + MEANING, ACS_FIX))
    if unread:
        out.append(_record(
            "info", "acs", f"ACS of {len(unread)} bridge(s) between GPUs not read: needs root",
            "the kernel shows users other than root only the first 64 bytes of PCI config space; bridges: "
            + _few(unread), f"`sudo lspci -vvv -s BDF | grep -i ACSCtl` per bridge, e.g. "
                            f"`sudo lspci -vvv -s {unread[0]} | grep -i ACSCtl`, or `{pcie.SUDO_DETECT}`"))
    if n >= 2 and not redirected and not unread:
        read = sorted({b for p in a.pairs for b in p.between})
        if read:
            out.append(_record("ok", "acs", f"ACS redirects no peer traffic ({len(read)} bridge(s) between GPUs "
                                            "read)"))
        elif all(p.verdict == "no bridge between" for p in a.pairs):
            out.append(_record("ok", "acs", "no bridge between the GPUs (on the root bus: a VM's host decides "
                                            "ACS, out of sight here)"))
    for label, h, allowed in degraded_links(a):
        out.append(_record("warning", "pcie link", f"{_hop_name(label, h)}: link runs x{h.link.width} where both "
                                                   f"ends allow x{allowed}",
                           f"{h.bdf} ({h.kind}): {h.link.text()}",
                           "reseat the card or check the riser/slot; every ring through this link is slowed"))
    slow = _slow_links(a)
    if slow:
        out.append(_record("info", "pcie link", f"{len(slow)} link(s) below their maximum speed now",
                           "; ".join(f"{_hop_name(lbl, h)} {h.link.text()}" for lbl, h in slow[:6]),
                           "normal for an idle GPU (links slow down to save power); read again while the "
                           "GPUs are busy"))
    if a.problems:
        out.append(_record("info", "pcie sysfs", f"{len(a.problems)} sysfs entr(y/ies) skipped",
                           "; ".join(a.problems[:4])))
    return out
