"""Parse what NCCL and a tuner plugin said about the plugin: loaded or not, and which rule fired.

NCCL 2.28.9's own lines (``src/plugin/tuner.cc``, ``src/plugin/plugin_open.cc``,
``src/plugin/tuner/tuner_v*.cc`` at tag v2.28.9-1), all INIT|TUNING except the first
(ENV|TUNING):

* ``NCCL_TUNER_PLUGIN set by environment to PATH``: what was asked for;
* ``TUNER/Plugin: Using NAME (vN)``: the ABI NCCL took (2.24/2.25: ``Using tuner plugin NAME``);
* ``Successfully loaded external tuner plugin PATH``: loaded from that library;
* failures: ``TUNER/Plugin: Could not find: NAMES`` (no such file), ``TUNER/Plugin: LIB: DLERROR``
  (dlopen refused it: not an ELF, a missing dependency, ...), ``External tuner plugin PATH is
  unsupported`` (no ncclTunerPlugin_v2..v5 symbol NCCL knows).

commdiag's plugin (``commdiag/tuner/commdiag_tuner.c``) adds ``commdiag-tuner: ...`` lines: the
rules it loaded per communicator (or one WARN saying why none), each rule application (on
change of size, bounded) and per-rule counts when the communicator is destroyed.

The proof needs ``NCCL_DEBUG=INFO`` and ``NCCL_DEBUG_SUBSYS`` including INIT (load, rules,
applications) or TUNING.  A plugin asked for but not shown loaded is a failure (``problems``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from . import ncclog

COMMDIAG = "commdiag"  # the name commdiag's plugin gives NCCL

_REQUESTED = re.compile(r"^NCCL_TUNER_PLUGIN set by environment to (?P<value>.*)$")
_USING = re.compile(r"^TUNER/Plugin: Using (?:tuner plugin (?P<old>.+)|(?P<name>.+) \(v(?P<abi>\d+)\))$")
_LOADED = re.compile(r"^Successfully loaded external tuner plugin (?P<path>.+)$")
_UNSUPPORTED = re.compile(r"^External tuner plugin (?P<path>.+) is unsupported$")
_NOT_FOUND = re.compile(r"^TUNER/Plugin: Could not find:(?P<names>.*)$")
_CLOSING = re.compile(r"^TUNER/Plugin: Closing tuner: '(?P<name>.*)'$")
_DLERROR = re.compile(r"^TUNER/Plugin: (?P<lib>.+?): (?P<why>.+)$")

_CT = "commdiag-tuner: "
_RULES = re.compile(r"^loaded (?P<total>\d+) rules from (?P<path>.*), (?P<matching>\d+) for nRanks=(?P<nranks>\d+) "
                    r"nNodes=(?P<nnodes>\d+) \(comm 0x(?P<comm>[0-9a-f]+), tuner ABI v(?P<abi>\d+)\)$")
_NO_RULES = re.compile(r"^NCCL_TUNER_CONFIG_FILE=(?P<path>.*?): (?P<why>(?:line (?P<line>\d+): )?.*); no rules, "
                       r"NCCL chooses every collective$")
_APPLIED = re.compile(r"^rule line (?P<line>\d+) applied: (?P<coll>\w+) nBytes=(?P<bytes>\d+) regBuff=(?P<reg>-?\d+) "
                      r"-> algo=(?P<algo>\w+) proto=(?P<proto>\w+) channels=(?P<channels>\d+) \((?P<note>.*)\)$")
_DISABLED = re.compile(r"^rule line (?P<line>\d+) not applied: (?P<coll>\w+) nBytes=(?P<bytes>\d+) "
                       r"regBuff=(?P<reg>-?\d+): NCCL disabled algo=(?P<algo>\w+) proto=(?P<proto>\w+) "
                       r"for this collective \((?P<note>.*)\); NCCL's choice stands$")
_OUTSIDE = re.compile(r"^rule line (?P<line>\d+) not applied: (?P<coll>\w+) nBytes=(?P<bytes>\d+): "
                      r"algo=(?P<algo>\w+) proto=(?P<proto>\w+) is outside NCCL's cost table; NCCL's choice stands$")
_COUNTS = re.compile(r"^comm 0x(?P<comm>[0-9a-f]+): rule line (?P<line>\d+) applied (?P<applied>\d+) times, "
                     r"not applied (?P<refused>\d+) times$")


@dataclass
class RulesLoaded:
    """``loaded N rules from PATH, M for nRanks=R nNodes=K (comm 0xH, tuner ABI vX)``: one communicator."""

    total: int
    path: str
    matching: int
    nranks: int
    nnodes: int
    comm: str
    abi: int


@dataclass
class RuleEvent:
    """One ``rule line L applied`` / ``not applied`` line: what the rule did for one size."""

    line: int
    collective: str
    bytes: int
    reg_buff: int | None  # None: the line does not say (outside the cost table)
    algo: str
    proto: str
    channels: int | None
    applied: bool
    note: str  # "cost was 20.814", or why it was not applied


@dataclass
class RuleCount:
    """``comm 0xH: rule line L applied A times, not applied N times``, at communicator destroy."""

    comm: str
    line: int
    applied: int
    not_applied: int


@dataclass
class TunerLog:
    """What one NCCL process said about its tuner plugin."""

    host: str
    pid: int
    device: int
    requested: str | None = None  # NCCL_TUNER_PLUGIN as NCCL read it
    name: str | None = None  # the plugin's own name (``commdiag``), from ``TUNER/Plugin: Using``
    abi: int | None = None
    library: str | None = None  # ``Successfully loaded external tuner plugin PATH``
    load_errors: list[str] = field(default_factory=list)  # NCCL's own failure lines, verbatim
    closed: bool = False
    rules: list[RulesLoaded] = field(default_factory=list)
    rules_warnings: list[str] = field(default_factory=list)  # commdiag-tuner WARN lines
    events: list[RuleEvent] = field(default_factory=list)
    counts: list[RuleCount] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # other commdiag-tuner lines

    @property
    def loaded(self) -> bool:
        return self.name is not None

    @property
    def wanted(self) -> bool:
        """A plugin was asked for (``none`` turns NCCL's plugin search off)."""
        return bool(self.requested) and self.requested.lower() != "none"

    def problems(self, require_rules: bool = True) -> list[str]:
        """Why this process does not prove the requested plugin ran; [] when it does (or none was asked for).

        ``require_rules``: commdiag's plugin must also show rules loaded for this communicator."""
        if not self.wanted:
            return []
        if not self.loaded:
            if self.load_errors:
                return [f"NCCL did not load the tuner plugin {self.requested}: " + "; ".join(self.load_errors)]
            return [f"NCCL_TUNER_PLUGIN={self.requested} but NCCL printed no tuner load line "
                    "(TUNER/Plugin: Using ...); its log needs NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS with INIT"]
        if self.library is None:
            return [f"NCCL_TUNER_PLUGIN={self.requested} but NCCL took tuner {self.name!r} from elsewhere "
                    "(its net plugin), not that library"]
        if self.name != COMMDIAG or not require_rules:
            return []
        out = [f"commdiag-tuner: {w}" for w in self.rules_warnings]
        if not self.rules and not out:
            out.append("commdiag's plugin loaded but printed no 'loaded N rules' line")
        out += [f"commdiag-tuner: none of the {r.total} rules in {r.path} is for nRanks={r.nranks} "
                f"nNodes={r.nnodes} (comm 0x{r.comm}): NCCL chooses every collective"
                for r in self.rules if r.matching == 0]
        return out

    def rule_by_size(self, collective: str = "allreduce") -> dict[int, RuleEvent]:
        """Size -> the last rule event logged for it (the rule that fired, or was refused)."""
        return {e.bytes: e for e in self.events if e.collective == collective}

    def summary(self) -> str:
        """One line: loaded NAME (vN) from LIB, rules, or what failed."""
        if not self.wanted and not self.loaded:
            return "no tuner plugin requested"
        if not self.loaded:
            return "FAILED: " + (self.problems()[0] if self.problems() else "not loaded")
        text = f"loaded {self.name} (tuner ABI v{self.abi if self.abi is not None else '?'})"
        text += f" from {self.library}" if self.library else " (not from NCCL_TUNER_PLUGIN's library)"
        for r in self.rules:
            text += f"; {r.matching} of {r.total} rules from {r.path} for nRanks={r.nranks} nNodes={r.nnodes}"
        for w in self.rules_warnings:
            text += f"; WARN {w}"
        return text

    def to_json(self) -> dict:
        """run.json's per-rank ``nccl_tuner`` (see commdiag/formats/results.py)."""
        return {"requested": self.requested, "loaded": self.loaded, "name": self.name, "abi": self.abi,
                "library": self.library, "load_errors": list(self.load_errors),
                "rules": [asdict(r) for r in self.rules], "rules_warnings": list(self.rules_warnings),
                "fired": {str(e.bytes): {"line": e.line, "applied": e.applied, "algo": e.algo, "proto": e.proto,
                                         "channels": e.channels, "reg_buff": e.reg_buff}
                          for e in self.events if e.collective == "allreduce"},
                "counts": [asdict(c) for c in self.counts], "problems": self.problems()}


def _event(m: re.Match, applied: bool) -> RuleEvent:
    g = m.groupdict()
    return RuleEvent(int(g["line"]), g["coll"], int(g["bytes"]), int(g["reg"]) if g.get("reg") is not None else None,
                     g["algo"], g["proto"], int(g["channels"]) if g.get("channels") is not None else None, applied,
                     g.get("note") or "outside NCCL's cost table")


def _plugin_line(t: TunerLog, msg: str, level: str) -> bool:
    body = msg[len(_CT):]
    if level == "WARN":
        m = _NO_RULES.match(body)
        t.rules_warnings.append(f"NCCL_TUNER_CONFIG_FILE={m['path']}: {m['why']}" if m else body)
    elif (m := _RULES.match(body)):
        t.rules.append(RulesLoaded(int(m["total"]), m["path"], int(m["matching"]), int(m["nranks"]),
                                   int(m["nnodes"]), m["comm"], int(m["abi"])))
    elif (m := _APPLIED.match(body)):
        t.events.append(_event(m, True))
    elif (m := _DISABLED.match(body)) or (m := _OUTSIDE.match(body)):
        t.events.append(_event(m, False))
    elif (m := _COUNTS.match(body)):
        t.counts.append(RuleCount(m["comm"], int(m["line"]), int(m["applied"]), int(m["refused"])))
    else:
        t.notes.append(body)
    return True


def _nccl_line(t: TunerLog, msg: str) -> bool:
    if (m := _REQUESTED.match(msg)):
        t.requested = m["value"].rstrip()
    elif (m := _USING.match(msg)):
        t.name = m["old"] or m["name"]
        t.abi = int(m["abi"]) if m["abi"] else None
    elif (m := _LOADED.match(msg)):
        t.library = m["path"]
    elif _UNSUPPORTED.match(msg):
        t.load_errors.append(msg)
    elif (m := _NOT_FOUND.match(msg)):
        # also printed when nothing was asked for (NCCL looks for libnccl-tuner.so): kept, judged by `wanted`
        t.load_errors.append(msg)
    elif _CLOSING.match(msg):
        t.closed = True
    elif _DLERROR.match(msg):
        t.load_errors.append(msg)
    else:
        return False
    return True


def parse(text: str) -> dict[int, TunerLog]:
    """pid -> TunerLog for every NCCL process with a tuner line in ``text`` (other lines ignored); one
    host's log (``parse_records`` keys by host and pid)."""
    return {pid: t for (_, pid), t in
            parse_records(r for line in text.splitlines() for r in ncclog.records(line)).items()}


def parse_records(recs) -> dict[tuple[str, int | None], TunerLog]:
    """(host, pid) -> TunerLog for every NCCL process with a tuner line (``ncclog.Record``)."""
    out: dict[tuple[str, int | None], TunerLog] = {}
    for r in recs:
        key = r.proc
        t = out.get(key) or TunerLog(key[0], key[1], r.dev if r.dev is not None else -1)
        if r.msg.startswith(_CT):
            _plugin_line(t, r.msg, r.level)
        elif not _nccl_line(t, r.msg):
            continue
        out[key] = t
    return out


def merge_load(whole: TunerLog | None, part: TunerLog | None) -> TunerLog | None:
    """The per-communicator part of ``part`` (rules, events, counts) with the per-process load facts of
    ``whole``: NCCL loads the library once per process, so with several runs in one process only the
    first run's log slice holds the load lines."""
    if whole is None or part is None:
        return part or whole
    return TunerLog(whole.host, whole.pid, whole.device, whole.requested, whole.name, whole.abi, whole.library,
                    list(whole.load_errors), part.closed, part.rules, part.rules_warnings, part.events,
                    part.counts, part.notes)
