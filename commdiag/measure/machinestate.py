"""The machine during each launch: per-GPU NVML readings before, during and after it.

The sweep's parent process (it holds no CUDA context, so NVML is safe there) opens one
``Sampler`` per run and wraps every torchrun launch in ``Sampler.watch``: a full reading
just before the launch, a quick one every ``PERIOD_S`` while it runs (in a thread: the
launch never waits on it), and a full one just after.  Read per GPU: SM and memory
clocks, clock-event (throttle) reasons, temperature, power, energy, the PCIe link's
generation and width, the PCIe replay and recovery counters, NVML's violation
(throttled-time) counters, utilization, and the compute processes on the GPU.

Clocks and the link mean something only under load: an idle GPU drops its clocks and an
idle link downtrains (a 1x H200 read 1980 MHz just after a CUDA init and 345 MHz idle a
moment later).  So a launch's record keeps the clock and link ranges of the quick
readings taken under load (utilization above 0), and counters as deltas over the launch.

Reading: one small ``collect_*`` function per source; each writes the raw values in the
recording layout (the field names of tests/fixtures/h200x1/nvml-capture.json) and skips
silently what it cannot read; a source NVML reports as not supported is not asked again
in the run.  ``nvml`` is the pynvml module or any object with its function names
(``nvmlreplay.ReplayNvml`` replays a recording).

Writes run.json's ``machine_state`` (once per run: the GPUs read, or why nothing was)
and each launch's ``machine`` (``launch_record``; docs/formats.md).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

from ..errors import terminal_safe

# Readings while a launch runs: one a second.  Stage-2 launches measure for a few seconds
# only, so a sparser period could miss their loaded part; a quick reading costs about a
# millisecond per GPU in the parent (benchmarks/machine_state_cost.py measures it).
PERIOD_S = 1.0
# NVML calls normally return in microseconds; a GPU that fell off the bus can make them
# block.  Past this the launch goes on without the reading and the run stops reading NVML.
READ_DEADLINE_S = 5.0

CLOCK_SM, CLOCK_MEM = 1, 2  # nvml.h nvmlClockType_t
TEMPERATURE_GPU = 0  # nvml.h nvmlTemperatureSensors_t
VIOLATION_POLICIES = {"power": 0, "thermal": 1}  # nvml.h nvmlPerfPolicyType_t
FIELD_PCIE_RECOVERY = 169  # nvml.h NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER
# nvml.h nvmlClocksEventReason* bits (nvidia-smi -q's "Clocks Event Reasons")
CLOCK_EVENT_REASONS = {
    0x1: "GPU_IDLE", 0x2: "APPLICATIONS_CLOCKS_SETTING", 0x4: "SW_POWER_CAP", 0x8: "HW_SLOWDOWN",
    0x10: "SYNC_BOOST", 0x20: "SW_THERMAL_SLOWDOWN", 0x40: "HW_THERMAL_SLOWDOWN",
    0x80: "HW_POWER_BRAKE_SLOWDOWN", 0x100: "DISPLAY_CLOCK_SETTING"}
GPU_IDLE = 0x1
# Errors after which a source is not asked again on that GPU in this run (it will not change).
PERMANENT_ERRORS = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoPermission",
                    "AttributeError", "NotRecorded")

FULL, QUICK = "full", "quick"  # before/after a launch; while it runs


def decode_reasons(mask) -> list[str]:
    """Clock-event bitmask -> names (nvml.h); an unknown bit is named by its value."""
    if not isinstance(mask, int) or isinstance(mask, bool):
        return []
    names, bit = [], 1
    while bit <= mask:
        if mask & bit:
            names.append(CLOCK_EVENT_REASONS.get(bit, f"0x{bit:x}"))
        bit <<= 1
    return names


# --------------------------------------------------------------------------- sources (one each)


def _source(*fields: str, phases=(FULL, QUICK)):
    """Mark a collect function with the fields it writes and the readings it belongs to."""
    def mark(fn):
        fn.fields, fn.phases = fields, phases
        return fn
    return mark


def _text(v) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


@_source("name", "pci_bus_id", "pcie_max_gen", "pcie_max_width", phases=())
def collect_identity(nvml, h, out: dict) -> None:
    """Once per run: what the GPU is and the most its link can do (NVML: this device and system)."""
    out["name"] = _text(nvml.nvmlDeviceGetName(h))
    out["pci_bus_id"] = _text(nvml.nvmlDeviceGetPciInfo(h).busId)
    out["pcie_max_gen"] = int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(h))
    out["pcie_max_width"] = int(nvml.nvmlDeviceGetMaxPcieLinkWidth(h))


@_source("sm_clock", "mem_clock")
def collect_clocks(nvml, h, out: dict) -> None:
    out["sm_clock"] = int(nvml.nvmlDeviceGetClockInfo(h, CLOCK_SM))
    out["mem_clock"] = int(nvml.nvmlDeviceGetClockInfo(h, CLOCK_MEM))


@_source("clocks_event_reasons")
def collect_clock_events(nvml, h, out: dict) -> None:
    """The raw bitmask; drivers before r535 only have the older ThrottleReasons name."""
    try:
        mask = nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
    except Exception:
        mask = nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
    out["clocks_event_reasons"] = int(mask)


@_source("temperature")
def collect_temperature(nvml, h, out: dict) -> None:
    out["temperature"] = int(nvml.nvmlDeviceGetTemperature(h, TEMPERATURE_GPU))


@_source("power_mw")
def collect_power(nvml, h, out: dict) -> None:
    out["power_mw"] = int(nvml.nvmlDeviceGetPowerUsage(h))


@_source("energy_mj", phases=(FULL,))
def collect_energy(nvml, h, out: dict) -> None:
    out["energy_mj"] = int(nvml.nvmlDeviceGetTotalEnergyConsumption(h))


@_source("pcie_gen", "pcie_width")
def collect_link(nvml, h, out: dict) -> None:
    out["pcie_gen"] = int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(h))
    out["pcie_width"] = int(nvml.nvmlDeviceGetCurrPcieLinkWidth(h))


@_source("pcie_replay_counter", phases=(FULL,))
def collect_replays(nvml, h, out: dict) -> None:
    out["pcie_replay_counter"] = int(nvml.nvmlDeviceGetPcieReplayCounter(h))


_FIELD_VALUE = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


@_source("pcie_recovery_counter", phases=(FULL,))
def collect_recoveries(nvml, h, out: dict) -> None:
    """Link recoveries (L0 -> Recovery transitions), a field value on recent drivers."""
    (v,) = nvml.nvmlDeviceGetFieldValues(h, [FIELD_PCIE_RECOVERY])
    if int(v.nvmlReturn) == 0:
        out["pcie_recovery_counter"] = int(getattr(v.value, _FIELD_VALUE.get(int(v.valueType), "ullVal")))


@_source("violation_ns", phases=(FULL,))
def collect_violations(nvml, h, out: dict) -> None:
    """Time the driver held clocks down for power or thermal reasons, in ns (a counter)."""
    got, error = {}, None
    for name, policy in VIOLATION_POLICIES.items():
        try:
            got[name] = int(nvml.nvmlDeviceGetViolationStatus(h, policy).violationTime)
        except Exception as e:
            error = e
    if not got and error is not None:
        raise error
    out["violation_ns"] = got


@_source("utilization")
def collect_utilization(nvml, h, out: dict) -> None:
    u = nvml.nvmlDeviceGetUtilizationRates(h)
    out["utilization"] = {"gpu": int(u.gpu), "memory": int(u.memory)}


@_source("processes")
def collect_processes(nvml, h, out: dict) -> None:
    out["processes"] = [{"pid": int(p.pid), "used_memory": getattr(p, "usedGpuMemory", None)}
                        for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)]


SOURCES = (collect_clocks, collect_clock_events, collect_temperature, collect_power, collect_energy,
           collect_link, collect_replays, collect_recoveries, collect_violations, collect_utilization,
           collect_processes)


def error_text(e: BaseException) -> str:
    return f"err: {type(e).__name__}: {e}" if str(e) else f"err: {type(e).__name__}"


def run_source(fn, nvml, h, out: dict, skip: set | None = None, key=None, record_errors: bool = False) -> None:
    """One source into ``out``; a failure skips it (and, if permanent, adds ``key`` to ``skip``).
    ``record_errors``: write ``"err: ..."`` into the fields it could not read (recordings)."""
    if skip is not None and key in skip and not record_errors:
        return
    try:
        fn(nvml, h, out)
    except Exception as e:  # every NVML call may be unsupported on some GPU, driver or VM
        if skip is not None and type(e).__name__ in PERMANENT_ERRORS:
            skip.add(key)
        if record_errors:
            for f in fn.fields:
                out.setdefault(f, error_text(e))


# --------------------------------------------------------------------------- one run's access


class Sampler:
    """NVML access for one run: the GPUs, their static facts, and readings on demand."""

    def __init__(self, nvml=None, reason: str | None = None, *, period_s: float = PERIOD_S,
                 owns_init: bool = False):
        self.nvml = nvml
        self.reason = reason  # why nothing is read (None: available)
        self.stopped: str | None = None  # set when NVML stopped answering mid-run
        self.period_s = period_s
        self._owns_init = owns_init
        self.handles: list = []
        self.gpus: list[dict] = []
        self._skip: set = set()
        self._names: dict[int, str] = {}
        self._watches: list["Watch"] = []  # whose reading thread may still be inside NVML
        if nvml is not None and reason is None:
            self._identify()

    @property
    def available(self) -> bool:
        return self.reason is None and self.stopped is None

    def _identify(self) -> None:
        try:
            n = int(self.nvml.nvmlDeviceGetCount())
            self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        except Exception as e:
            self.reason = f"NVML could not list the GPUs ({type(e).__name__}: {str(e)[:120]})"
            return
        if not self.handles:
            self.reason = "NVML sees no GPU on this machine"
            return
        for i, h in enumerate(self.handles):
            g = {"index": i}
            run_source(collect_identity, self.nvml, h, g)
            self.gpus.append(g)

    def describe(self) -> dict:
        """run.json's ``machine_state``: what is read, or why nothing is."""
        if self.reason is not None:
            return {"available": False, "reason": self.reason}
        out = {"available": True, "source": "NVML, read by the launching process on this node",
               "period_s": self.period_s, "gpus": self.gpus}
        if self.stopped:
            out["stopped"] = self.stopped
        return out

    def read(self, phase: str, record_errors: bool = False) -> list[dict]:
        """One reading per GPU: the ``phase``'s sources (FULL or QUICK), raw values."""
        out = []
        for i, h in enumerate(self.handles):
            g = {"index": i}
            for fn in SOURCES:
                if phase in fn.phases:
                    run_source(fn, self.nvml, h, g, self._skip, (fn.__name__, i), record_errors)
            out.append(g)
        return out

    def process_name(self, pid: int) -> str:
        """What NVML calls process ``pid`` (its executable's name; control characters written out,
        since any process can name itself anything), cached for the run."""
        if pid not in self._names:
            try:
                name = os.path.basename(_text(self.nvml.nvmlSystemGetProcessName(pid)))[:64]
                self._names[pid] = terminal_safe(name) or "?"
            except Exception:
                self._names[pid] = "?"
        return self._names[pid]

    def watch(self, is_own: Callable[[int], bool] = lambda pid: False) -> "Watch":
        return Watch(self, is_own)

    def close(self) -> None:
        """Stop every reading thread, then shut NVML down, never under a thread still inside it
        (nvmlShutdown during another thread's NVML call crashed commdiag with SIGSEGV when Ctrl-C
        came while a launch's first reading was under way)."""
        live = [w for w in self._watches if w.halt()]
        self._watches = live  # kept: a second close() must not shut NVML down under them either
        if live:
            return  # a thread stuck in NVML: leave NVML up; the process ends soon after anyway
        if self._owns_init and self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
            self._owns_init = False


def open_sampler(backend: str, nvml=None, period_s: float = PERIOD_S) -> Sampler:
    """The run's sampler.  ``nvml``: an NVML-like object to read (a replay, or pynvml in a benchmark),
    used whatever the backend; default pynvml, for nccl runs only (gloo launches use no GPU)."""
    if nvml is not None:
        return Sampler(nvml, period_s=period_s)
    if backend != "nccl":
        return Sampler(None, f"backend {backend}: the launches use no GPU, so no GPU state is read")
    try:
        import pynvml
    except ImportError as e:
        return Sampler(None, f"nvidia-ml-py is not installed ({e})")
    try:
        pynvml.nvmlInit()
    except Exception as e:
        return Sampler(None, f"NVML did not initialise ({type(e).__name__}: {str(e)[:120]}): "
                             "no NVIDIA driver here?")
    return Sampler(pynvml, period_s=period_s, owns_init=True)


# --------------------------------------------------------------------------- one launch


class Watch:
    """Readings around one launch, taken by a thread: ``with sampler.watch(is_own) as w: launch()``,
    then ``w.record()``.  The launch waits only for the reading before it (and the one after it,
    on exit), each at most READ_DEADLINE_S."""

    def __init__(self, sampler: Sampler, is_own: Callable[[int], bool]):
        self.sampler, self.is_own = sampler, is_own
        self.before: list[dict] | None = None
        self.during: list[list[dict]] = []
        self.after: list[dict] | None = None
        self.others: list[dict] = []
        self.own_gpus: list[int] = []  # GPUs NVML listed one of the launch's own processes on
        self.cost_s = 0.0  # what the launch waited for
        self.cpu_s = 0.0  # the reading thread's CPU time
        self.error: str | None = None
        self._started, self._stop, self._done = threading.Event(), threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Watch":
        if not self.sampler.available:
            return self
        t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="commdiag-machine-state", daemon=True)
        self._thread.start()
        self.sampler._watches.append(self)
        try:
            if not self._started.wait(READ_DEADLINE_S):
                self._stuck("before")
        except BaseException:  # Ctrl-C while the first reading is under way: __exit__ will not run
            self.halt()
            raise
        self.cost_s += time.perf_counter() - t0
        return self

    def halt(self) -> bool:
        """Ask the reading thread to stop and wait for it (at most READ_DEADLINE_S); True when it is
        still running after that."""
        if self._thread is None or self._thread.ident is None:  # never started: nothing inside NVML
            return False
        self._stop.set()
        self._thread.join(READ_DEADLINE_S)
        return self._thread.is_alive()

    def _run(self) -> None:
        cpu0 = time.thread_time()
        log = ProcessLog(self.is_own, self.sampler.process_name)
        try:
            self.before = self.sampler.read(FULL)
            self._started.set()
            log.add("before", self.before)
            while not self._stop.wait(self.sampler.period_s):
                self.during.append(self.sampler.read(QUICK))
                log.add("during", self.during[-1])
            self.after = self.sampler.read(FULL)
            log.add("after", self.after)
            self.others = log.entries()
            self.own_gpus = sorted(log.own_gpus)
        except Exception as e:  # never into the sweep: the launch goes on, the record says why
            self.error = f"{type(e).__name__}: {str(e)[:160]}"
        finally:
            self.cpu_s = time.thread_time() - cpu0
            self._started.set()
            self._done.set()

    def __exit__(self, *exc) -> bool:
        if self._thread is not None:
            self._stop.set()  # always: a thread stuck in NVML ends when NVML answers again, not polls on
        if self._thread is not None and not self._done.is_set() and self.error is None:
            t0 = time.perf_counter()
            if not self._done.wait(READ_DEADLINE_S):
                self._stuck("after")
            self.cost_s += time.perf_counter() - t0
        if self._done.is_set() and self in self.sampler._watches:
            self.sampler._watches.remove(self)  # out of NVML for good: close() need not wait for it
        return False

    def _stuck(self, when: str) -> None:
        self.error = f"NVML did not answer within {READ_DEADLINE_S:g} s ({when} the launch)"
        self.sampler.stopped = f"{self.error}; not read since"

    def record(self) -> dict:
        """The launch's ``machine`` entry in run.json."""
        if self._thread is None:  # nothing read: run.json's machine_state says why, once
            return {"available": False}
        if self.error or self.before is None or self.after is None or not self._done.is_set():
            return {"available": False, "error": self.error or "readings incomplete"}
        return launch_record(self.sampler.gpus, self.before, self.during, self.after, self.others,
                             period_s=self.sampler.period_s, cost_s=self.cost_s, cpu_s=self.cpu_s,
                             own_gpus=self.own_gpus)


class ProcessLog:
    """Compute processes seen on each GPU that are not the launch's own, and when; a name is read
    when its process is first seen (one that ended during the launch has none to read after it)."""

    def __init__(self, is_own: Callable[[int], bool], name_of: Callable[[int], str]):
        self.is_own, self.name_of = is_own, name_of
        self._own: dict[int, bool] = {}
        self.own_gpus: set[int] = set()  # where the launch's own processes were seen
        self._names: dict[int, str] = {}
        self._seen: dict[tuple[int, int], list[str]] = {}

    def add(self, phase: str, reading: list[dict] | None) -> None:
        for g in reading or []:
            for p in g.get("processes") if isinstance(g.get("processes"), list) else []:
                pid = p.get("pid") if isinstance(p, dict) else None
                if not isinstance(pid, int):
                    continue
                if pid not in self._own:
                    self._own[pid] = pid == os.getpid() or bool(self.is_own(pid))
                if self._own[pid]:
                    if pid != os.getpid():  # commdiag itself holds no GPU; its launch's processes do
                        self.own_gpus.add(g["index"])
                    continue
                if pid not in self._names:
                    self._names[pid] = self.name_of(pid)
                when = self._seen.setdefault((g["index"], pid), [])
                if phase not in when:
                    when.append(phase)

    def entries(self) -> list[dict]:
        return [{"gpu": gpu, "pid": pid, "name": self._names[pid], "seen": when}
                for (gpu, pid), when in sorted(self._seen.items())]


# --------------------------------------------------------------------------- the record (pure)


def _num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def loaded(reading: dict) -> bool:
    """Was the GPU busy at this reading: utilization above 0, else (unreadable) no GPU_IDLE event."""
    u = reading.get("utilization")
    if isinstance(u, dict) and _num(u.get("gpu")) is not None:
        return u["gpu"] > 0
    mask = _num(reading.get("clocks_event_reasons"))
    return mask is not None and not mask & GPU_IDLE


_POINT = ("sm_clock", "mem_clock", "clocks_event_reasons", "temperature", "power_mw", "pcie_gen", "pcie_width")


def _point(r: dict) -> dict:
    out = {k: r[k] for k in _POINT if _num(r.get(k)) is not None}
    if "clocks_event_reasons" in out:
        out["reasons"] = decode_reasons(out["clocks_event_reasons"])
    u = r.get("utilization")
    if isinstance(u, dict) and _num(u.get("gpu")) is not None:
        out["utilization_gpu"] = u["gpu"]
    return out


def _span(values):
    vals = [v for v in values if v is not None]
    return [min(vals), max(vals)] if vals else None


def _during(readings: list[dict]) -> dict:
    busy = [r for r in readings if loaded(r)]
    out: dict = {"samples": len(readings), "loaded": len(busy)}
    for k in ("sm_clock", "mem_clock"):
        span = _span(_num(r.get(k)) for r in busy)
        if span:
            out[k] = span
    for k in ("pcie_gen", "pcie_width"):
        span = _span(_num(r.get(k)) for r in busy)
        if span:
            out[f"{k}_min"] = span[0]
    reasons: dict[str, int] = {}
    for r in readings:
        for name in decode_reasons(r.get("clocks_event_reasons")):
            reasons[name] = reasons.get(name, 0) + 1
    out["reasons"] = reasons
    for k in ("temperature", "power_mw"):
        span = _span(_num(r.get(k)) for r in readings)
        if span:
            out[f"{k}_max"] = span[1]
    return out


def _delta(a, b):
    a, b = _num(a), _num(b)
    return None if a is None or b is None else b - a


def launch_record(gpus: list[dict], before: list[dict], during: list[list[dict]], after: list[dict],
                  others: list[dict], *, period_s: float, cost_s: float, cpu_s: float,
                  own_gpus: list[int] | None = None) -> dict:
    """One launch's ``machine`` entry from its raw readings: points before and after, the range
    under load while it ran, counters as deltas, and the other processes seen."""
    out_gpus = []
    for i, g in enumerate(gpus):
        b = before[i] if i < len(before) else {}
        a = after[i] if i < len(after) else {}
        rec: dict = {"index": g["index"], "pci_bus_id": g.get("pci_bus_id"),
                     "before": _point(b), "during": _during([d[i] for d in during if i < len(d)]),
                     "after": _point(a)}
        for name, key in (("pcie_replay_delta", "pcie_replay_counter"),
                          ("pcie_recovery_delta", "pcie_recovery_counter")):
            d = _delta(b.get(key), a.get(key))
            if d is not None:
                rec[name] = d
        energy = _delta(b.get("energy_mj"), a.get("energy_mj"))
        if energy is not None:
            rec["energy_j"] = round(energy / 1000, 3)
        vb, va = b.get("violation_ns"), a.get("violation_ns")
        if isinstance(vb, dict) and isinstance(va, dict):
            rec["violation_ms"] = {k: round(d / 1e6, 3) for k in va
                                   if (d := _delta(vb.get(k), va.get(k))) is not None}
        out_gpus.append(rec)
    return {"available": True, "period_s": period_s, "samples": len(during), "cost_s": round(cost_s, 6),
            "cpu_s": round(cpu_s, 6), "gpus": out_gpus, "others": others,
            **({"own_gpus": list(own_gpus)} if own_gpus else {})}
