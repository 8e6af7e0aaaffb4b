"""Replay a recording of NVML readings as an NVML-like object, for the machine-state sampler.

A recording (tests/fixtures/h200x1/nvml-capture.json, or what benchmarks/gpu_machine_state.sh
writes) holds per GPU the raw values in the field names ``machinestate``'s collectors write:
``sm_clock``, ``clocks_event_reasons`` (the raw bitmask), ``power_mw``, ``processes`` ...;
a failed call is stored as ``"err: <error type>: <message>"``.  A recording with
``snapshots`` (idle, under load, after) holds several readings; one without is one reading.

``ReplayNvml`` answers the pynvml calls the collectors make from the selected snapshot:
a recorded error is raised as an exception of the recorded type's name, a field the
recording lacks as ``NotRecorded``.  So the collectors run unchanged on a GPU machine's
readings, on a machine without a GPU.
"""

from __future__ import annotations

from types import SimpleNamespace

# pynvml function (and its arguments after the handle) -> recorded field
CALLS = {
    ("nvmlDeviceGetName", ()): "name",
    ("nvmlDeviceGetClockInfo", (1,)): "sm_clock",
    ("nvmlDeviceGetClockInfo", (2,)): "mem_clock",
    ("nvmlDeviceGetMaxClockInfo", (1,)): "max_sm_clock",
    ("nvmlDeviceGetCurrentClocksEventReasons", ()): "clocks_event_reasons",
    ("nvmlDeviceGetCurrentClocksThrottleReasons", ()): "clocks_throttle_reasons",
    ("nvmlDeviceGetSupportedClocksEventReasons", ()): "supported_clocks_event_reasons",
    ("nvmlDeviceGetTemperature", (0,)): "temperature",
    ("nvmlDeviceGetPowerUsage", ()): "power_mw",
    ("nvmlDeviceGetTotalEnergyConsumption", ()): "energy_mj",
    ("nvmlDeviceGetCurrPcieLinkGeneration", ()): "pcie_gen",
    ("nvmlDeviceGetCurrPcieLinkWidth", ()): "pcie_width",
    ("nvmlDeviceGetMaxPcieLinkGeneration", ()): "pcie_max_gen",
    ("nvmlDeviceGetMaxPcieLinkWidth", ()): "pcie_max_width",
    ("nvmlDeviceGetPcieReplayCounter", ()): "pcie_replay_counter",
}
VIOLATION_FIELDS = {0: "power", 1: "thermal"}  # nvmlPerfPolicyType_t -> violation_ns key
FIELD_PCIE_RECOVERY = 169


class NotRecorded(Exception):
    """The recording has no value for this call."""


_ERRORS: dict[str, type] = {}


def _error(text: str) -> Exception:
    """``"err: NVMLError_NotSupported: Not Supported"`` -> an NVMLError_NotSupported exception."""
    body = text[len("err:"):].strip()
    name, _, message = body.partition(":")
    name = name.strip() if name.strip().isidentifier() else "RecordedError"
    if name not in _ERRORS:
        _ERRORS[name] = type(name, (Exception,), {})
    return _ERRORS[name](message.strip())


class _Handle:
    def __init__(self, index: int):
        self.index = index


class ReplayNvml:
    """pynvml's calls answered from a recording (module docstring)."""

    def __init__(self, recording: dict, snapshot: int | str = 0):
        snaps = recording.get("snapshots")
        self.snapshots = snaps if isinstance(snaps, list) else [{"label": "capture", "gpus": recording.get("gpus", [])}]
        self.recording = recording
        self.calls = 0
        self.use(snapshot)

    def use(self, snapshot: int | str) -> "ReplayNvml":
        """Answer from snapshot ``snapshot`` (its index or label) from now on."""
        if isinstance(snapshot, str):
            snapshot = next(i for i, s in enumerate(self.snapshots) if s.get("label") == snapshot)
        self.current = self.snapshots[snapshot]
        return self

    @property
    def labels(self) -> list[str]:
        return [s.get("label") for s in self.snapshots]

    # ------------------------------------------------------------------ the calls

    def nvmlInit(self):
        return None

    def nvmlShutdown(self):
        return None

    def nvmlDeviceGetCount(self):
        return len(self.current["gpus"])

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.current["gpus"]):
            raise _error("err: NVMLError_InvalidArgument: Invalid Argument")
        return _Handle(i)

    def _field(self, h: _Handle, name: str):
        self.calls += 1
        gpu = self.current["gpus"][h.index]
        if name not in gpu:
            raise NotRecorded(f"{name} of GPU {h.index}")
        value = gpu[name]
        if isinstance(value, str) and value.startswith("err:"):
            raise _error(value)
        return value

    def __getattr__(self, fn: str):
        keys = [k for k in CALLS if k[0] == fn]
        if not keys:
            raise AttributeError(fn)

        def call(h, *args):
            field = CALLS.get((fn, tuple(args)))
            if field is None:
                raise NotRecorded(f"{fn}{args}")
            return self._field(h, field)
        return call

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self._field(h, "pci_bus_id"))

    def nvmlDeviceGetUtilizationRates(self, h):
        u = self._field(h, "utilization")
        return SimpleNamespace(gpu=u.get("gpu"), memory=u.get("memory"))

    def nvmlDeviceGetViolationStatus(self, h, policy):
        v = self._field(h, "violation_ns")
        key = VIOLATION_FIELDS.get(policy)
        if key not in v:
            raise NotRecorded(f"violation_ns.{key}")
        if isinstance(v[key], str) and v[key].startswith("err:"):
            raise _error(v[key])
        return SimpleNamespace(referenceTime=0, violationTime=v[key])

    def nvmlDeviceGetFieldValues(self, h, ids):
        if list(ids) != [FIELD_PCIE_RECOVERY]:
            raise NotRecorded(f"field values {ids}")
        value = self._field(h, "pcie_recovery_counter")
        return [SimpleNamespace(fieldId=FIELD_PCIE_RECOVERY, nvmlReturn=0, valueType=3,
                                value=SimpleNamespace(ullVal=value))]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=p["pid"], usedGpuMemory=p.get("used_memory"))
                for p in self._field(h, "processes")]

    def nvmlSystemGetProcessName(self, pid):
        self.calls += 1
        for g in self.current["gpus"]:
            for p in g.get("processes") if isinstance(g.get("processes"), list) else []:
                if p.get("pid") == pid and "name" in p:
                    if isinstance(p["name"], str) and p["name"].startswith("err:"):
                        raise _error(p["name"])
                    return p["name"]
        raise NotRecorded(f"name of pid {pid}")
