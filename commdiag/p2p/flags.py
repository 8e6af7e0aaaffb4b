"""The checks of ``commdiag p2p``: one ``Flag`` per finding, with its evidence, criterion and what to do.

Pure functions of the measured result.  A flag needs a margin above the measured noise: a value
is "below" a limit only when its best sample is below it, and two values differ only when their
min-max ranges do not overlap and the medians differ by more than the check's minimum effect.
Every threshold is a named constant with its reason (DCGM's PCIe plugin keeps its limits in a
table too, not in code paths).
"""

from __future__ import annotations

import statistics

from .result import FAIL, HUNG, INFO, FAILED, OK, WARN, Flag, Gpu, Pair, Settings, Stat

# P2P must be this much slower than through host memory to be flagged (beyond disjoint ranges):
# smaller gaps do not change which transport NCCL should use.
HOST_MARGIN = 0.05
# Copy-engine writes of equal size should run at the same speed both ways; more than this apart
# (with disjoint ranges) points at the platform (a read/write asymmetry of a root complex or switch).
ASYMMETRY = 0.15
# A GPU whose every pair is below this fraction of the other pairs' median bandwidth (best samples
# included) is the common factor: its link, riser or slot.
SLOW_GPU = 0.8
# DCGM's PCIe plugin fails a GPU above this many PCIe replays during its test.
REPLAY_FAIL = 80

ACS_ACTION = ("check ACS and the IOMMU on the PCIe path (NCCL's troubleshooting page: they redirect P2P "
              "to the root complex, slowly or into a hang): lspci -vvv | grep ACSCtl (SrcValid+ means on); "
              "fix in the BIOS, or NCCL_P2P_DISABLE=1 until it is fixed")


def evaluate(gpus: tuple[Gpu, ...], pairs: tuple[Pair, ...], settings: Settings) -> tuple[Flag, ...]:
    out: list[Flag] = []
    for p in pairs:
        out += _job_flags(f"pair {p.name}", p.status, p.phase, p.error, settings, pair=True)
        out += _peer_flags(p)
        out += _check_flags(p)
    for g in gpus:
        out += _job_flags(f"GPU {g.index}", g.status, g.phase, g.error, settings, pair=False)
        out += _link_flags(g)
        out += _replay_flags(g)
        out += _host_ceiling_flags(g, settings.min_fraction)
    measured = [p for p in pairs if p.status == OK]
    for p in measured:
        out += _ceiling_flags(p, settings.min_fraction)
        out += _host_faster_flags(p)
        out += _asymmetry_flags(p)
    out += _slow_gpu_flags(gpus, measured)
    order = {FAIL: 0, WARN: 1, INFO: 2}
    return tuple(sorted(out, key=lambda f: order[f.severity]))


def below(s: Stat | None, limit: float) -> bool:
    """Every sample below ``limit`` (the best one too): noise cannot explain it."""
    return s is not None and s.hi < limit


def slower(x: Stat | None, y: Stat | None, margin: float) -> bool:
    """``x`` slower than ``y`` (bandwidths): ranges disjoint and medians more than ``margin`` apart."""
    return x is not None and y is not None and x.hi < y.lo and x.median < (1 - margin) * y.median


def _job_flags(subject, status, phase, error, settings, pair: bool) -> list[Flag]:
    where = f" in {phase}" if phase else ""
    if status == HUNG:
        what = "P2P copies between these GPUs" if pair else "host copies of this GPU"
        return [Flag("hung", FAIL, subject,
                     f"no result within {settings.pair_timeout_s:g} s{where}; the probe was killed",
                     f"every job finishes within --pair-timeout ({settings.pair_timeout_s:g} s)",
                     (ACS_ACTION if pair else "check the GPU's health (nvidia-smi -q, dmesg for Xid errors)")
                     + f"; a larger --pair-timeout tells a slow link from a hang ({what})")]
    if status == FAILED:
        return [Flag("failed", FAIL, subject, f"the probe failed{where}: {error or 'no error text'}",
                     "every job runs to its end",
                     "read the error; run again with CUDA_LAUNCH_BLOCKING=1 for the failing call")]
    return []


def _peer_flags(p: Pair) -> list[Flag]:
    nv = [p.nvml_p2p.get(c) for c in ("READ", "WRITE")]
    nvml_ok = None if all(v is None for v in nv) else any(v == "OK" for v in nv)
    cuda = [v for v in (p.peer_ab, p.peer_ba) if v is not None]
    cuda_ok = None if not cuda else all(cuda)
    nv_text = "/".join(v or "?" for v in nv)
    if cuda_ok is False and nvml_ok is not True:
        return [Flag("no-peer-access", INFO, f"pair {p.name}",
                     f"CUDA reports no peer access; NVML P2P read/write: {nv_text}",
                     "CUDA peer access between the GPUs of a pair",
                     "NCCL moves this pair's data through host memory (SHM); if P2P is expected, " + ACS_ACTION
                     + "; in a VM, P2P needs passthrough that exposes it")]
    if cuda_ok is not None and nvml_ok is not None and cuda_ok != nvml_ok:
        return [Flag("peer-access-disagrees", WARN, f"pair {p.name}",
                     f"CUDA peer access {'yes' if cuda_ok else 'no'} but NVML P2P read/write {nv_text}",
                     "CUDA and NVML agree on P2P",
                     "trust the measurement (data check, bandwidth); a driver update or a BIOS setting "
                     "(ACS, IOMMU, above-4G decoding, resizable BAR) usually explains the difference")]
    return []


def _check_flags(p: Pair) -> list[Flag]:
    out = []
    for src, dst, c in ((p.a, p.b, p.check_ab), (p.b, p.a, p.check_ba)):
        if c is not None and not c.ok:
            out.append(Flag("data-mismatch", FAIL, f"{src}->{dst}",
                            f"{c.mismatches} of {c.bytes} bytes differ after the copy (first at byte "
                            f"{c.first_offset})",
                            "a known pattern copied GPU to GPU arrives byte-exact (DCGM's broken_p2p)",
                            "do not use P2P between these GPUs (NCCL_P2P_DISABLE=1) until fixed; " + ACS_ACTION
                            + "; update the driver and the BIOS"))
    return out


def _ceiling_flags(p: Pair, fraction: float) -> list[Flag]:
    if p.ceiling is None:
        return []
    out = []
    limit = fraction * p.ceiling.gbps
    for src, dst in ((p.a, p.b), (p.b, p.a)):
        s = p.get("p2p", src, dst)
        if below(s, limit):
            out.append(Flag("below-ceiling", WARN, f"{src}->{dst}",
                            f"P2P {s.text('GB/s')} is {100 * s.median / p.ceiling.gbps:.0f}% of "
                            f"{p.ceiling.gbps:g} GB/s ({p.ceiling.basis})",
                            f"best sample at least {fraction:.0%} of the link's ceiling (--min-fraction)",
                            "a root complex or switch slower than the links: compare the through-host "
                            "numbers, then " + ACS_ACTION))
    if below(p.p2p_bidir, 2 * limit):
        s = p.p2p_bidir
        out.append(Flag("below-ceiling", WARN, f"{p.a}<->{p.b}",
                        f"P2P both ways {s.text('GB/s')} is {100 * s.median / (2 * p.ceiling.gbps):.0f}% of "
                        f"{2 * p.ceiling.gbps:g} GB/s ({p.ceiling.basis}, both directions)",
                        f"best sample at least {fraction:.0%} of twice the one-way ceiling",
                        "PCIe is full duplex: a pair far below twice its one-way speed shares a bottleneck "
                        "between directions (root complex, switch uplink)"))
    return out


def _host_faster_flags(p: Pair) -> list[Flag]:
    out = []
    for src, dst in ((p.a, p.b), (p.b, p.a)):
        s, h = p.get("p2p", src, dst), p.get("host", src, dst)
        if slower(s, h, HOST_MARGIN):
            out.append(Flag("p2p-slower-than-host", WARN, f"{src}->{dst}",
                            f"P2P {s.text('GB/s')} vs through host {h.text('GB/s')}",
                            f"P2P at least as fast as through pinned host memory (ranges disjoint, "
                            f"> {HOST_MARGIN:.0%} apart)",
                            "NCCL's SHM path would be faster: sweep NCCL_P2P_DISABLE=1 (or a lower "
                            "NCCL_P2P_LEVEL) against default; " + ACS_ACTION))
        ls, lh = p.get("lat_p2p", src, dst), p.get("lat_host", src, dst)
        # latencies: larger is worse, so P2P is "slower" when host's range lies entirely below it
        if ls is not None and lh is not None and lh.hi < ls.lo and lh.median < (1 - HOST_MARGIN) * ls.median:
            out.append(Flag("p2p-slower-than-host", WARN, f"{src}->{dst}",
                            f"P2P latency {ls.text('us')} vs through host {lh.text('us')}",
                            "a small P2P copy takes no longer than one through host memory",
                            "small all-reduces (decode) would be faster without P2P: sweep "
                            "NCCL_P2P_DISABLE=1 against default; " + ACS_ACTION))
    if slower(p.p2p_bidir, p.host_bidir, HOST_MARGIN):
        out.append(Flag("p2p-slower-than-host", WARN, f"{p.a}<->{p.b}",
                        f"P2P both ways {p.p2p_bidir.text('GB/s')} vs through host {p.host_bidir.text('GB/s')}",
                        f"P2P at least as fast as through host memory (ranges disjoint, > {HOST_MARGIN:.0%} apart)",
                        "sweep NCCL_P2P_DISABLE=1 against default; " + ACS_ACTION))
    return out


def _asymmetry_flags(p: Pair) -> list[Flag]:
    ab, ba = p.p2p_ab, p.p2p_ba
    if ab is None or ba is None:
        return []
    lo, hi, (src, dst) = (ab, ba, (p.a, p.b)) if ab.median < ba.median else (ba, ab, (p.b, p.a))
    if not slower(lo, hi, ASYMMETRY):
        return []
    return [Flag("asymmetric", WARN, f"pair {p.name}",
                 f"{src}->{dst} {lo.text('GB/s')} vs {dst}->{src} {hi.text('GB/s')}",
                 f"both directions within {ASYMMETRY:.0%} (ranges disjoint)",
                 "a platform that writes faster than it reads across the root complex, or a link trained "
                 "differently each way: compare the link readings of both GPUs; " + ACS_ACTION)]


def _slow_gpu_flags(gpus: tuple[Gpu, ...], measured: list[Pair]) -> list[Flag]:
    """One GPU slow to every peer: all its pair directions below SLOW_GPU x the others' median."""
    indices = sorted({p.a for p in measured} | {p.b for p in measured})
    if len(indices) < 3:
        return []
    out = []
    for g in indices:
        mine = [s for p in measured if g in (p.a, p.b) for s in (p.p2p_ab, p.p2p_ba) if s is not None]
        others = [s.median for p in measured if g not in (p.a, p.b) for s in (p.p2p_ab, p.p2p_ba)
                  if s is not None]
        if not mine or not others:
            continue
        ref = statistics.median(others)
        if all(s.hi < SLOW_GPU * ref for s in mine):
            best = max(s.median for s in mine)
            gpu = next((x for x in gpus if x.index == g), None)
            host = ""
            if gpu is not None and gpu.h2d is not None:
                host = f"; its host copies: H2D {gpu.h2d.text('GB/s')}"
            out.append(Flag("slow-gpu", WARN, f"GPU {g}",
                            f"its fastest pair direction is {best:.1f} GB/s (median) against a median of "
                            f"{ref:.1f} GB/s between the other GPUs{host}",
                            f"every pair of a GPU, best samples included, below {SLOW_GPU:.0%} of the others' median",
                            "the common factor is this GPU's link: reseat the card or riser, check its slot's "
                            "PCIe setting in the BIOS, compare lspci -vvv LnkSta with LnkCap"))
    return out


def _link_flags(g: Gpu) -> list[Flag]:
    link = g.link
    if link is None or link.gen is None or not link.below_max:
        return []
    return [Flag("link-below-max", WARN, f"GPU {g.index}",
                 f"PCIe gen{link.gen} x{link.width} under load, the link allows gen{link.gen_max} "
                 f"x{link.width_max}",
                 "under load a link trains to its maximum generation and width (idle links train down)",
                 "reseat the card or riser, check the slot's PCIe setting in the BIOS (Auto/GenN), "
                 "compare lspci -vvv LnkSta with LnkCap for the GPU and its upstream bridge")]


def _replay_flags(g: Gpu) -> list[Flag]:
    d = g.replay_delta
    if d is None or d <= 0:
        return []
    return [Flag("pcie-replays", FAIL if d > REPLAY_FAIL else WARN, f"GPU {g.index}",
                 f"the PCIe replay counter grew by {d} during the test ({g.replays_before} -> {g.replays_after})",
                 f"no replays; DCGM's PCIe plugin fails above {REPLAY_FAIL}",
                 "replays are link-level retransmissions after errors: signal integrity (riser, cable, "
                 "slot); reseat, check nvidia-smi -q -d PCIE and dmesg for AER errors")]


def _host_ceiling_flags(g: Gpu, fraction: float) -> list[Flag]:
    if g.ceiling is None:
        return []
    out = []
    for what, s in (("H2D", g.h2d), ("D2H", g.d2h)):
        if below(s, fraction * g.ceiling.gbps):
            out.append(Flag("below-ceiling", WARN, f"GPU {g.index} {what}",
                            f"{what} {s.text('GB/s')} is {100 * s.median / g.ceiling.gbps:.0f}% of "
                            f"{g.ceiling.gbps:g} GB/s ({g.ceiling.basis})",
                            f"best sample at least {fraction:.0%} of the link's ceiling (--min-fraction)",
                            "check the link (generation and width under load), the CPU socket the GPU hangs "
                            "off (NUMA) and other traffic on the host"))
    return out
