"""Confounders: what the machine did during a run's launches that could explain a difference.

Reads each launch's ``machine`` record in run.json (measure/machinestate.py), on the GPUs
the launch used (its ranks' PCI bus ids on the launching node; all GPUs when unknown), and
names these conditions:

* thermal throttling (HW_THERMAL_SLOWDOWN, SW_THERMAL_SLOWDOWN), power capping
  (SW_POWER_CAP, HW_POWER_BRAKE_SLOWDOWN) or a hardware slowdown (HW_SLOWDOWN): a clock-event
  reason seen while the launch ran or just after it, or NVML's violation counter growing;
* another compute process on a GPU of the launch (not one of the launch's own);
* a PCIe link below its maximum generation or width while the GPU was under load;
* PCIe replay or link-recovery counters that grew during the launch;
* SM or memory clocks under load (each launch's lowest reading) that differ between arms.

Which conditions mark a claim.  A claim compares two arms: the claimed config's launches
and default's, from the stage that tested it (stage 2; stage 1 for ``--certify-sizes``'
per-size claims).  A condition marks the claim when it hit a different share of the two
arms (2 of default's 6 launches, none of seed's 6): then it can be what the test saw.
Clocks mark it when the arms' medians differ by more than CLOCK_TOLERANCE.  A condition
that hit both arms alike (never, always, or the same share) cannot favour one arm; it is
named in the run's notes only.  A marked claim keeps its test result and is shown as
"certified faster, but confounded: ..." (docs/verdicts.md, "Confounders").

Pure: run.json in, records out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

DEFAULT = "default"
# SM clocks move in 15 MHz steps (about 0.75% at 2 GHz); beyond two or three steps the arms
# ran at different speeds.
CLOCK_TOLERANCE = 0.02
LIST_LAUNCHES = 6  # launch numbers named in one note before "..."

THERMAL, POWER, SLOWDOWN, PROCESS, LINK, REPLAY = ("thermal throttling", "power capping", "hardware slowdown",
                                                   "another process", "a PCIe link below its maximum",
                                                   "PCIe replays")
REASON_GROUP = {"HW_THERMAL_SLOWDOWN": THERMAL, "SW_THERMAL_SLOWDOWN": THERMAL, "SW_POWER_CAP": POWER,
                "HW_POWER_BRAKE_SLOWDOWN": POWER, "HW_SLOWDOWN": SLOWDOWN}
VIOLATION_GROUP = {"thermal": THERMAL, "power": POWER}
# how a claim's line says that launches met the condition
PHRASE = {THERMAL: "ran with thermal throttling", POWER: "ran with power capping",
          SLOWDOWN: "ran with a hardware slowdown", PROCESS: "ran beside another process on their GPUs",
          LINK: "ran with a PCIe link below its maximum", REPLAY: "saw PCIe replays or link recoveries"}


@dataclass(frozen=True)
class Fact:
    """One condition in one launch: its group, what exactly (for the claim line), and the note's words."""

    group: str
    detail: str
    note: str  # "{launches}" is replaced by the launches it was seen in


@dataclass(frozen=True)
class ClaimCheck:
    """The confounders of one claim: the conditions that differ between its two arms."""

    config: str
    mode: str
    where: str
    stage: int
    confounders: tuple[str, ...]
    unrecorded: int = 0  # launches of the two arms without a machine record

    @property
    def confounded(self) -> bool:
        return bool(self.confounders)

    def to_json(self) -> dict:
        return {"config": self.config, "mode": self.mode, "where": self.where, "stage": self.stage,
                "confounded": self.confounded, "confounders": list(self.confounders),
                "unrecorded_launches": self.unrecorded}


@dataclass(frozen=True)
class Confounders:
    """What the machine state says about a run: per claim, and notes on every launch."""

    recorded: bool
    reason: str | None  # why nothing was recorded
    claims: tuple[ClaimCheck, ...] = ()
    notes: tuple[str, ...] = ()
    launches: dict = field(default_factory=dict)  # launch index -> its facts' notes (the report's table)

    def for_claim(self, claim) -> ClaimCheck | None:
        return next((c for c in self.claims if (c.config, c.mode, c.where) == (claim.config, claim.mode, claim.where)),
                    None)

    def to_json(self) -> dict:
        return {"recorded": self.recorded, "reason": self.reason, "claims": [c.to_json() for c in self.claims],
                "notes": list(self.notes)}


# --------------------------------------------------------------------------- one launch


def _norm_bus(bus) -> str | None:
    """"00000000:C1:00.0" (NVML) and "00000000:c1:00.0" (torch) name the same function."""
    if not isinstance(bus, str):
        return None
    parts = bus.lower().split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:]
    return ":".join(parts)


def _int(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _dict(v) -> dict:
    return v if isinstance(v, dict) else {}


def _list(v) -> list:
    return v if isinstance(v, list) else []


def used_gpus(launch: dict, run: dict) -> set[int] | None:
    """NVML indices of the GPUs the launch's ranks on the launching node used (their bus ids), else
    those NVML listed the launch's own processes on (``own_gpus``: ab, whose benchmark reports no
    ranks), else those it listed any launch of the run's own processes on; None when unknown."""
    machine = _dict(launch.get("machine"))
    host = _dict(_dict(run.get("fingerprint")).get("launcher")).get("hostname")
    buses = {_norm_bus(r.get("pci_bus_id")) for r in _list(launch.get("ranks")) if isinstance(r, dict)
             and r.get("pci_bus_id") and (host is None or r.get("hostname") in (None, host))}
    buses.discard(None)
    found = {g.get("index") for g in _list(machine.get("gpus")) if isinstance(g, dict)
             and _norm_bus(g.get("pci_bus_id")) in buses}
    if not found:
        found = _own_gpus(launch)
    if not found:
        # NVML listed none of this launch's processes (a short benchmark between two readings): it ran
        # where the run's other launches were seen, not on every GPU of the box (a stranger on another
        # GPU would otherwise mark only the launches NVML happened to miss)
        found = set().union(*(_own_gpus(l) for l in _list(run.get("launches")) if isinstance(l, dict)))
    return found or None


def _own_gpus(launch: dict) -> set[int]:
    return {i for i in _list(_dict(launch.get("machine")).get("own_gpus")) if isinstance(i, int)
            and not isinstance(i, bool)}


def _gpus(launch: dict, run: dict) -> list[dict]:
    used = used_gpus(launch, run)
    return [g for g in _list(_dict(launch.get("machine")).get("gpus"))
            if isinstance(g, dict) and (used is None or g.get("index") in used)]


def _static(run: dict) -> dict[int, dict]:
    return {g.get("index"): g for g in _list(_dict(run.get("machine_state")).get("gpus")) if isinstance(g, dict)}


def recorded(launch: dict) -> bool:
    return _dict(launch.get("machine")).get("available") is True


def launch_facts(launch: dict, run: dict) -> list[Fact]:
    """The conditions one launch met (empty when none, or when it has no machine record)."""
    if not recorded(launch):
        return []
    facts: list[Fact] = []
    static = _static(run)
    for g in _gpus(launch, run):
        i = g.get("index")
        during, after = _dict(g.get("during")), _dict(g.get("after"))
        reasons = set(_dict(during.get("reasons"))) | {r for r in _list(after.get("reasons")) if isinstance(r, str)}
        if reasons & {"HW_THERMAL_SLOWDOWN", "HW_POWER_BRAKE_SLOWDOWN"}:
            reasons.discard("HW_SLOWDOWN")  # set with either of them (nvidia-smi nests them under it)
        for r in sorted(reasons):
            if r in REASON_GROUP:
                facts.append(Fact(REASON_GROUP[r], f"{r} on GPU {i}",
                                  f"{REASON_GROUP[r]} ({r}) on GPU {i} during {{launches}}"))
        for kind, ms in sorted(_dict(g.get("violation_ms")).items()):
            if kind in VIOLATION_GROUP and (_int(ms) or 0) > 0:
                grp = VIOLATION_GROUP[kind]
                facts.append(Fact(grp, f"NVML {kind} violation time on GPU {i}",
                                  f"{grp} (NVML's {kind} violation time grew) on GPU {i} during {{launches}}"))
        gen, width = _int(during.get("pcie_gen_min")), _int(during.get("pcie_width_min"))
        top = static.get(i, {})
        max_gen, max_width = _int(top.get("pcie_max_gen")), _int(top.get("pcie_max_width"))
        if (gen and max_gen and gen < max_gen) or (width and max_width and width < max_width):
            at = f"Gen{gen or '?'} x{width or '?'}"
            facts.append(Fact(LINK, f"GPU {i} at {at} under load, max Gen{max_gen or '?'} x{max_width or '?'}",
                              f"GPU {i}'s PCIe link ran at {at} under load (max Gen{max_gen or '?'} "
                              f"x{max_width or '?'}) during {{launches}}"))
        for key, what in (("pcie_replay_delta", "replay"), ("pcie_recovery_delta", "link recovery")):
            n = _int(g.get(key))
            if n:
                facts.append(Fact(REPLAY, f"GPU {i} +{n} {what}", f"the PCIe {what} counter of GPU {i} grew "
                                  f"during {{launches}}"))
    used = {g.get("index") for g in _gpus(launch, run)}
    for p in _list(_dict(launch.get("machine")).get("others")):
        if not isinstance(p, dict) or p.get("gpu") not in used:
            continue
        who = f"pid {p.get('pid')}, {str(p.get('name'))[:40]}"
        when = "during" if "during" in _list(p.get("seen")) else "around"
        facts.append(Fact(PROCESS, f"{who}, GPU {p.get('gpu')}",
                          f"another process ({who}) used GPU {p.get('gpu')} {when} {{launches}}"))
    return facts


def _clock(launch: dict, run: dict, key: str) -> float | None:
    """A launch's lowest ``key`` (sm_clock, mem_clock) under load over its GPUs."""
    lows = [_int(_list(_dict(g.get("during")).get(key))[0]) for g in _gpus(launch, run)
            if _list(_dict(g.get("during")).get(key))]
    lows = [v for v in lows if v is not None]
    return min(lows) if lows else None


# --------------------------------------------------------------------------- claims


def _launches_of(run: dict, config: str, stage: int) -> list[dict]:
    return [l for l in _list(run.get("launches")) if isinstance(l, dict) and l.get("config") == config
            and int(l.get("stage", 1) or 1) == stage and l.get("status") == "ok"]


def _short(details: set[str], n: int = 3) -> str:
    items = sorted(details)
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def claim_check(run: dict, config: str, mode: str, where: str, stage: int) -> ClaimCheck:
    """The conditions that differ between ``config``'s and default's launches of ``stage``."""
    found, unrecorded = compare_arms(run, config, _launches_of(run, DEFAULT, stage),
                                     _launches_of(run, config, stage), f"stage-{stage} launches")
    return ClaimCheck(config, mode, where, stage, found, unrecorded)


def compare_arms(run: dict, config: str, default_launches: list[dict], config_launches: list[dict],
                 what: str = "launches") -> tuple[tuple[str, ...], int]:
    """The conditions that differ between two arms' launches (module docstring), and how many of
    them have no machine record.  The shared interface: sweep passes a claim's stage-2 launches,
    ab an arm's launches; ``what`` is how the lines name them ("stage-2 launches")."""
    arms = [(DEFAULT, default_launches), (config, config_launches)]
    unrecorded = sum(1 for _, ls in arms for l in ls if not recorded(l))
    hit: list[dict[str, tuple[int, set[str]]]] = []
    for _, ls in arms:
        groups: dict[str, tuple[int, set[str]]] = {}
        for l in ls:
            facts = launch_facts(l, run)
            for grp in {f.group for f in facts}:
                n, det = groups.get(grp, (0, set()))
                groups[grp] = (n + 1, det | {f.detail for f in facts if f.group == grp})
        hit.append(groups)
    out = []
    la, lb = [sum(1 for l in ls if recorded(l)) for _, ls in arms]
    for grp in PHRASE:
        (na, da), (nb, db) = hit[0].get(grp, (0, set())), hit[1].get(grp, (0, set()))
        if not la or not lb or na * lb == nb * la:
            continue  # the same share of both arms (or an arm without records): cannot favour one
        first, second = ((DEFAULT, na, la), (config, nb, lb)) if na / la >= nb / lb else \
            ((config, nb, lb), (DEFAULT, na, la))
        out.append(f"{first[1]} of {first[0]}'s {first[2]} {what} {PHRASE[grp]} "
                   f"({_short(da | db)}); {second[1]} of {second[0]}'s {second[2]}")
    for key, name in (("sm_clock", "SM"), ("mem_clock", "memory")):
        vals = [[v for l in ls if (v := _clock(l, run, key)) is not None] for _, ls in arms]
        if vals[0] and vals[1]:
            a, b = median(vals[0]), median(vals[1])
            if abs(a - b) / max(a, b) > CLOCK_TOLERANCE:
                out.append(f"{name} clocks under load differed between the arms: {DEFAULT}'s {what} "
                           f"at {a:.0f} MHz, {config}'s at {b:.0f} MHz (medians of each launch's lowest)")
    return tuple(out), unrecorded


# --------------------------------------------------------------------------- the run


def _launch_list(indices: list[int]) -> str:
    idx = sorted(set(indices))
    if len(idx) == 1:
        return f"launch {idx[0]}"
    if len(idx) <= LIST_LAUNCHES:
        return "launches " + ", ".join(map(str, idx))
    return f"{len(idx)} launches ({', '.join(map(str, idx[:LIST_LAUNCHES]))}, ...)"


def unrecorded_reason(run: dict) -> str | None:
    """Why a run has no machine state at all (None: it has some)."""
    state = _dict(run.get("machine_state"))
    if any(recorded(l) for l in _list(run.get("launches")) if isinstance(l, dict)):
        return None
    if state.get("available") is False and state.get("reason"):
        return str(state["reason"])
    if not state:
        return f"run format {run.get('version', '?')} predates commdiag's machine-state recording"
    return str(state.get("stopped") or "no launch has a machine record")


def check(run: dict, certifications=()) -> Confounders:
    """The run's confounders: for each certification's claim (module docstring), and notes on
    every finished launch."""
    reason = unrecorded_reason(run)
    if reason is not None:
        return Confounders(False, reason)
    claims = []
    for c in certifications:
        claim = c.claim
        stage = 2 if claim.band is not None else 1  # --certify-sizes tests stage-1 launches
        claims.append(claim_check(run, claim.config, claim.mode, claim.where, stage))
    seen: dict[str, list[int]] = {}
    per_launch: dict[int, list[str]] = {}
    finished = [l for l in _list(run.get("launches")) if isinstance(l, dict) and l.get("status") != "pending"]
    clocks = []
    for l in finished:
        for f in launch_facts(l, run):
            seen.setdefault(f.note, []).append(l.get("index"))
            per_launch.setdefault(l.get("index"), []).append(f"{f.group} ({f.detail})")
        v = _clock(l, run, "sm_clock")
        if v is not None:
            clocks.append(v)
    notes = [note.replace("{launches}", _launch_list(idx)) for note, idx in seen.items()]
    if clocks and (max(clocks) - min(clocks)) / max(clocks) > CLOCK_TOLERANCE:
        notes.append(f"SM clocks under load ranged {min(clocks):.0f}-{max(clocks):.0f} MHz over "
                     f"{len(clocks)} launches (each launch's lowest)")
    missing = sum(1 for l in finished if not recorded(l))
    if missing:
        notes.append(f"machine state not recorded for {missing} of {len(finished)} finished launches")
    stopped = _dict(run.get("machine_state")).get("stopped")
    if stopped:
        notes.append(str(stopped))
    return Confounders(True, None, tuple(claims), tuple(notes), per_launch)
