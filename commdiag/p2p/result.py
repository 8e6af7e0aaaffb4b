"""What ``commdiag p2p`` found: result dataclasses and the versioned JSON envelope.

Every value is a ``Stat``: the median over repeats with its spread (min-max) and count, and
the samples themselves; bandwidths in GB/s (10^9 bytes per second, as nvbandwidth and
cuda-samples' p2pBandwidthLatencyTest count them), latencies in microseconds per copy.

Pair fields name directions from GPU ``a`` to GPU ``b`` (``a < b``): ``p2p_ab`` is a copy
from a's memory to b's, issued on a's stream (a peer write, as p2pBandwidthLatencyTest does).

Format history of ``commdiag-p2p`` (bump P2P_FORMAT_VERSION on any change that removes or
retypes a key; readers ignore keys they do not know):
    1  first version (docs/formats.md, "commdiag p2p").
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from .. import readfile
from ..errors import CommdiagError, brief

P2P_FORMAT = "commdiag-p2p"
P2P_FORMAT_VERSION = 1

# job statuses: a GPU's host-link job or a pair's job
OK, HUNG, FAILED, NOT_RUN = "ok", "hung", "failed", "not-run"
# flag severities: fail and warn make the command exit 1; info is a fact worth knowing
FAIL, WARN, INFO = "fail", "warn", "info"


@dataclass(frozen=True)
class Stat:
    """Median over repeats, its spread (min-max) and count, and the samples."""

    median: float
    lo: float
    hi: float
    n: int
    samples: tuple[float, ...] = ()

    @classmethod
    def of(cls, samples) -> "Stat | None":
        vals = [float(v) for v in samples or () if v is not None and v == v and v > 0]
        if not vals:
            return None
        return cls(statistics.median(vals), min(vals), max(vals), len(vals), tuple(vals))

    @property
    def spread_pct(self) -> float:
        """Half the min-max range as a percentage of the median: the ``±`` of the matrices."""
        return 50.0 * (self.hi - self.lo) / self.median if self.median else 0.0

    def text(self, unit: str = "") -> str:
        """``54.8 GB/s (54.1-55.0, n=9)``: every number with its spread and count."""
        u = f" {unit}" if unit else ""
        return f"{num(self.median)}{u} ({num(self.lo)}-{num(self.hi)}, n={self.n})"


def num(v: float) -> str:
    """3 significant digits, no exponent for the ranges we print (0.001 us to 9999 GB/s)."""
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


@dataclass(frozen=True)
class Check:
    """One direction's data check: a known pattern copied, then compared byte for byte."""

    bytes: int
    mismatches: int
    first_offset: int | None = None

    @property
    def ok(self) -> bool:
        return self.mismatches == 0


@dataclass(frozen=True)
class Link:
    """One GPU's PCIe link as NVML reports it: under load (read while copies ran: idle links
    train down to save power), the most this device and system allow, and idle (before load)."""

    gen: int | None = None
    width: int | None = None
    gen_max: int | None = None
    width_max: int | None = None
    gen_idle: int | None = None
    width_idle: int | None = None

    @property
    def below_max(self) -> bool:
        return ((self.gen is not None and self.gen_max is not None and self.gen < self.gen_max)
                or (self.width is not None and self.width_max is not None and self.width < self.width_max))


@dataclass(frozen=True)
class Ceiling:
    """What one direction of a link can carry at most (GB/s), and from what."""

    gbps: float
    basis: str  # "PCIe gen5 x16 (both ends, under load)", "NVLink v4 x18"


@dataclass(frozen=True)
class Gpu:
    index: int  # CUDA device index (as CUDA_VISIBLE_DEVICES numbers them)
    name: str | None = None
    uuid: str | None = None
    bus_id: str | None = None
    nvml_index: int | None = None
    status: str = NOT_RUN  # the host-link job: ok, hung, failed, not-run
    phase: str | None = None  # where it hung or failed
    error: str | None = None
    wall_s: float | None = None
    h2d: Stat | None = None  # pinned host -> GPU, GB/s
    d2h: Stat | None = None
    host_bidir: Stat | None = None  # both at once, GB/s summed
    lat_h2d: Stat | None = None  # 16-byte copies, us each
    lat_d2h: Stat | None = None
    local: Stat | None = None  # a copy within the GPU, read + write counted (p2pBandwidthLatencyTest's diagonal)
    link: Link | None = None
    ceiling: Ceiling | None = None  # of the PCIe link, one direction
    replays_before: int | None = None
    replays_after: int | None = None
    capability: str | None = None  # CUDA compute capability, "9.0": the NVLink generation

    @property
    def replay_delta(self) -> int | None:
        if self.replays_before is None or self.replays_after is None:
            return None
        return self.replays_after - self.replays_before


@dataclass(frozen=True)
class Pair:
    a: int
    b: int
    status: str = NOT_RUN
    phase: str | None = None
    error: str | None = None
    wall_s: float | None = None
    peer_ab: bool | None = None  # CUDA: can a access b's memory (cudaDeviceCanAccessPeer)
    peer_ba: bool | None = None
    nvml_p2p: dict = field(default_factory=dict)  # NVML's P2P status a->b per capability (READ, WRITE, ...)
    path: str | None = None  # PCIe distance as nvidia-smi names it (PIX ... SYS), or NV<n>
    nvlinks: int = 0
    check_ab: Check | None = None
    check_ba: Check | None = None
    p2p_ab: Stat | None = None  # GB/s
    p2p_ba: Stat | None = None
    p2p_bidir: Stat | None = None  # both directions at once, summed
    host_ab: Stat | None = None  # through pinned host memory (D2H then H2D, pipelined)
    host_ba: Stat | None = None
    host_bidir: Stat | None = None
    lat_p2p_ab: Stat | None = None  # us per 16-byte copy
    lat_p2p_ba: Stat | None = None
    lat_host_ab: Stat | None = None
    lat_host_ba: Stat | None = None
    ceiling: Ceiling | None = None  # one direction

    @property
    def name(self) -> str:
        return f"{self.a}-{self.b}"

    def get(self, what: str, src: int, dst: int) -> Stat | None:
        """``what`` in p2p, host, lat_p2p, lat_host for the direction src -> dst of this pair."""
        return getattr(self, f"{what}_{'ab' if (src, dst) == (self.a, self.b) else 'ba'}")


@dataclass(frozen=True)
class Flag:
    """One finding: which check (code), how bad, about what, the numbers, the rule, what to do."""

    code: str
    severity: str
    subject: str  # "pair 0-1", "0->1", "GPU 3"
    evidence: str
    criterion: str
    action: str


@dataclass(frozen=True)
class Settings:
    size_bytes: int = 256 << 20
    repeats: int = 7
    latency_copies: int = 100
    latency_repeats: int = 5
    pair_timeout_s: float = 30.0
    min_fraction: float = 0.6


@dataclass(frozen=True)
class P2PResult:
    gpus: tuple[Gpu, ...]
    pairs: tuple[Pair, ...]
    flags: tuple[Flag, ...] = ()
    notes: tuple[str, ...] = ()
    settings: Settings = Settings()
    environment: dict = field(default_factory=dict)  # host, torch, cuda, driver, nvml_error, started
    wall_s: float | None = None

    @property
    def ok(self) -> bool:
        return not any(f.severity in (FAIL, WARN) for f in self.flags)

    def pair(self, i: int, j: int) -> Pair | None:
        a, b = min(i, j), max(i, j)
        return next((p for p in self.pairs if (p.a, p.b) == (a, b)), None)

    def gpu(self, i: int) -> Gpu | None:
        return next((g for g in self.gpus if g.index == i), None)

    def to_json(self) -> dict:
        return {"format": P2P_FORMAT, "version": P2P_FORMAT_VERSION, "ok": self.ok, **asdict(self)}


# --------------------------------------------------------------------------- loading a saved result

def _stat(d):
    return None if d is None else Stat(float(d["median"]), float(d["lo"]), float(d["hi"]), int(d["n"]),
                                       tuple(float(x) for x in d.get("samples") or ()))


_NESTED = {Stat: _stat, Check: lambda d: None if d is None else Check(**_known(Check, d)),
           Link: lambda d: None if d is None else Link(**_known(Link, d)),
           Ceiling: lambda d: None if d is None else Ceiling(**_known(Ceiling, d))}


def _known(cls, d: dict) -> dict:
    """The keys of ``d`` that ``cls`` has (a newer minor addition is ignored, as documented)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


_SCALARS = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "dict": (dict,)}


def _check(cls, d, where: str) -> None:
    """A saved record's scalar fields have their declared type (``gpus[0].replays_before``: an integer
    or null): a damaged or hand-edited file is one error naming the field, not a TypeError later."""
    if not isinstance(d, dict):
        raise ValueError(f"{where}: not a mapping")
    hints = {f.name: f.type for f in fields(cls)}
    for name, value in _known(cls, d).items():
        base, _, none = hints[name].partition(" | ")
        if base not in _SCALARS or (value is None and none == "None"):
            continue
        ok = isinstance(value, _SCALARS[base]) and (base == "bool" or not isinstance(value, bool))
        if not ok or (base == "float" and value != value):  # NaN never comes from a measurement
            allowed = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
                       "dict": "a mapping"}[base] + (" or null" if none == "None" else "")
            raise ValueError(f"{where + '.' if where else ''}{name}: {brief(value)} is not {allowed}")


def _list(data: dict, key: str) -> list:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise ValueError(f"{key}: {brief(value)} is not a list")
    return value


def _build(cls, d: dict, where: str = ""):
    _check(cls, d, where or cls.__name__)
    kw = _known(cls, d)
    hints = {f.name: f.type for f in fields(cls)}
    for name, value in list(kw.items()):
        for typ, conv in _NESTED.items():
            if hints[name].startswith(typ.__name__ + " "):  # "Stat | None"
                kw[name] = conv(value)
    return cls(**kw)


def from_json(data: dict, source: str = "result") -> P2PResult:
    """A result saved with ``commdiag p2p --json`` back into dataclasses; refuses other formats and
    newer versions (with the file, field and what is allowed)."""
    if not isinstance(data, dict) or data.get("format") != P2P_FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise CommdiagError(f"{source}: format: {brief(got)} is not a commdiag p2p result "
                            f"(allowed: {P2P_FORMAT}, written by commdiag p2p --json)")
    version = data.get("version")
    if not isinstance(version, int) or version > P2P_FORMAT_VERSION or version < 1:
        raise CommdiagError(f"{source}: version: {brief(version)} is not one this commdiag reads "
                            f"(allowed: 1 to {P2P_FORMAT_VERSION}; a newer file needs a newer commdiag)")
    try:
        _check(P2PResult, data, "")
        flags = _list(data, "flags")
        for i, f in enumerate(flags):
            _check(Flag, f, f"flags[{i}]")
        _check(Settings, data.get("settings") or {}, "settings")
        return P2PResult(
            gpus=tuple(_build(Gpu, g, f"gpus[{i}]") for i, g in enumerate(_list(data, "gpus"))),
            pairs=tuple(_build(Pair, p, f"pairs[{i}]") for i, p in enumerate(_list(data, "pairs"))),
            flags=tuple(Flag(**_known(Flag, f)) for f in flags),
            notes=tuple(str(n) for n in _list(data, "notes")),
            settings=Settings(**_known(Settings, data.get("settings") or {})),
            environment=dict(data.get("environment") or {}),
            wall_s=data.get("wall_s"))
    except ValueError as e:
        raise CommdiagError(f"{source}: {e}; not a valid {P2P_FORMAT} v{version} result") from None
    except (KeyError, TypeError) as e:
        raise CommdiagError(f"{source}: not a valid {P2P_FORMAT} v{version} result: {brief(str(e))}") from None


def load(path: str | Path) -> P2PResult:
    try:
        data = json.loads(readfile.read_text(path, 64 << 20, what="p2p result"))
    except (OSError, ValueError) as e:
        raise CommdiagError(f"{path}: cannot read a p2p result: {e}") from None
    return from_json(data, str(path))
