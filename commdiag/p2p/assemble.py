"""Probe records and job outcomes -> ``P2PResult`` (pure: no CUDA, no NVML, no processes).

The probe reports CUDA's view (device index, UUID, peer access) and NVML's (the recording
layout of environment/topology.py, plus UUID and PCIe replay counter per NVML GPU).
The two are joined by UUID, then by PCI bus id: CUDA numbers GPUs by CUDA_VISIBLE_DEVICES
and its own order, NVML by PCI order.
"""

from __future__ import annotations

from ..environment import topology
from . import ceiling, flags
from .probe import FINAL
from .result import NOT_RUN, OK, Check, Gpu, Link, P2PResult, Pair, Settings, Stat


def _int(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _norm_uuid(u) -> str | None:
    return u.lower() if isinstance(u, str) and not u.startswith("err") else None


def nvml_index_map(devices: list[dict], nvml: dict | None, extras: list[dict] | None) -> dict[int, int]:
    """CUDA index -> NVML index, by UUID, else by PCI bus id."""
    by_uuid = {_norm_uuid(e.get("uuid")): e["index"] for e in extras or [] if _norm_uuid(e.get("uuid"))}
    by_bus = {topology._norm_bus(g.get("bus")): g["index"] for g in (nvml or {}).get("gpus", [])
              if topology._norm_bus(g.get("bus"))}
    out = {}
    for d in devices:
        n = by_uuid.get(_norm_uuid(d.get("uuid")))
        if n is None:
            n = by_bus.get(topology._norm_bus(d.get("bus_id")))
        if n is not None:
            out[int(d["index"])] = n
    return out


def _under_load(readings: list) -> tuple[int | None, int | None]:
    """The highest generation and width seen while copies ran (a link that reached them can)."""
    gens = [r[0] for r in readings if isinstance(r, (list, tuple)) and len(r) == 2 and _int(r[0])]
    widths = [r[1] for r in readings if isinstance(r, (list, tuple)) and len(r) == 2 and _int(r[1])]
    return (max(gens) if gens else None), (max(widths) if widths else None)


def _check(d) -> Check | None:
    if not isinstance(d, dict):
        return None
    return Check(int(d.get("bytes", 0)), int(d.get("mismatches", 0)), d.get("first_offset"))


def assemble(hello: dict, outcomes: dict, settings: Settings, environment: dict | None = None,
             wall_s: float | None = None) -> P2PResult:
    devices = hello.get("devices") or []
    nvml, extras = hello.get("nvml"), hello.get("nvml_extras")
    topo = topology.analyze(nvml) if isinstance(nvml, dict) else None
    to_nvml = nvml_index_map(devices, nvml, extras)
    nv_gpu = {g["index"]: g for g in (nvml or {}).get("gpus", [])}
    nv_extra = {e["index"]: e for e in extras or []}
    final = outcomes.get(FINAL)
    replays_after = (final.record or {}).get("replays", {}) if final is not None and final.status == OK else {}

    # link readings under load, from every job that loaded a GPU's link
    loads: dict[int, list] = {}
    idle: dict[int, list] = {}
    for o in outcomes.values():
        for i, rs in ((o.record or {}).get("link_load") or {}).items():
            loads.setdefault(int(i), []).extend(rs)
        for i, r in ((o.record or {}).get("link_idle") or {}).items():
            idle.setdefault(int(i), r)

    gpus = []
    for d in devices:
        i = int(d["index"])
        n = to_nvml.get(i)
        g, e = nv_gpu.get(n, {}), nv_extra.get(n, {})
        gen, width = _under_load(loads.get(i, []))
        link = None
        if g or gen is not None:
            link = Link(gen, width, _int(g.get("pcie_gen_max")), _int(g.get("pcie_width_max")),
                        *(idle.get(i) or (_int(g.get("pcie_gen")), _int(g.get("pcie_width")))))
        o = outcomes.get(f"gpu{i}")
        rec = (o.record or {}) if o is not None else {}
        after = replays_after.get(str(n)) if n is not None else None
        gpus.append(Gpu(
            index=i, name=d.get("name"), uuid=d.get("uuid"), bus_id=d.get("bus_id") or g.get("bus"), nvml_index=n,
            status=o.status if o is not None else NOT_RUN, phase=o.phase if o is not None else None,
            error=o.error if o is not None else None, wall_s=o.wall_s if o is not None else None,
            h2d=Stat.of(rec.get("h2d")), d2h=Stat.of(rec.get("d2h")), host_bidir=Stat.of(rec.get("host_bidir")),
            lat_h2d=Stat.of(rec.get("lat_h2d")), lat_d2h=Stat.of(rec.get("lat_d2h")),
            local=Stat.of(rec.get("local")), link=link, ceiling=ceiling.gpu_ceiling(link),
            replays_before=_int(e.get("replays")), replays_after=_int(after),
            capability=d.get("capability") if isinstance(d.get("capability"), str) else None))

    by_index = {g.index: g for g in gpus}
    peer = hello.get("peer") or []
    pairs = []
    for a in range(len(devices)):
        for b in range(a + 1, len(devices)):
            o = outcomes.get(f"{a}-{b}")
            rec = (o.record or {}) if o is not None else {}
            tp = topo.pair(to_nvml[a], to_nvml[b]) if topo and a in to_nvml and b in to_nvml else None
            ga, gb = by_index[a], by_index[b]
            nvlinks = tp.nvlinks if tp is not None and tp.kind == topology.NVLINK else 0
            peer_ab = rec.get("peer_ab", _cell(peer, a, b))
            peer_ba = rec.get("peer_ba", _cell(peer, b, a))
            pairs.append(Pair(
                a=a, b=b, status=o.status if o is not None else NOT_RUN, phase=o.phase if o is not None else None,
                error=o.error if o is not None else None, wall_s=o.wall_s if o is not None else None,
                peer_ab=peer_ab, peer_ba=peer_ba, nvml_p2p=dict(tp.p2p) if tp is not None else {},
                path=tp.label if tp is not None else None, nvlinks=nvlinks,
                check_ab=_check(rec.get("check_ab")), check_ba=_check(rec.get("check_ba")),
                **{k: Stat.of(rec.get(k)) for k in ("p2p_ab", "p2p_ba", "p2p_bidir", "host_ab", "host_ba",
                                                     "host_bidir", "lat_p2p_ab", "lat_p2p_ba", "lat_host_ab",
                                                     "lat_host_ba")},
                ceiling=ceiling.pair_ceiling(ga.link, gb.link, nvlinks, ga.capability or gb.capability)))

    notes = []
    if len(devices) == 1:
        notes.append("one GPU visible: pair tests (peer access, data check, P2P and through-host copies between "
                     "GPUs) need 2 or more GPUs; measured here: the host link (pinned copies both ways, "
                     "latency), the link under load and the replay counter")
    if hello.get("nvml_error"):
        notes.append(f"NVML could not be read ({hello['nvml_error']}): no P2P status, link readings, ceilings "
                     "or replay counters")
    elif topo is not None and len(to_nvml) < len(devices):
        notes.append("some CUDA devices could not be matched to NVML GPUs (by UUID or PCI bus id): their NVML "
                     "values are missing")
    gpus_t, pairs_t = tuple(gpus), tuple(pairs)
    env = {"torch": hello.get("torch"), "cuda": hello.get("cuda"), "driver": hello.get("driver"),
           **_timing_notes(outcomes), **(environment or {})}
    return P2PResult(gpus_t, pairs_t, flags.evaluate(gpus_t, pairs_t, settings), tuple(notes), settings, env, wall_s)


def _timing_notes(outcomes: dict) -> dict:
    """How long the spin kernels had to be (cycles, the largest per kind) and how many latency repeats were
    redone with a longer one: evidence that host-side queueing was never timed."""
    spins: dict = {}
    redone = 0
    for o in outcomes.values():
        rec = o.record or {}
        for k, v in (rec.get("spin_cycles") or {}).items():
            spins[k] = max(spins.get(k, 0), v)
        redone += rec.get("latency_redone") or 0
    return {"spin_cycles": spins, "latency_redone": redone} if spins else {}


def _cell(m, i, j):
    try:
        v = m[i][j]
    except (IndexError, TypeError):
        return None
    return v if isinstance(v, bool) else None
