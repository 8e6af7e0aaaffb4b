"""The machine-state sampler (measure/machinestate.py) on recorded NVML readings, replayed.

There is no NVML here, so the collectors run against ``nvmlreplay.ReplayNvml`` built from
recordings made on the GPU machine: tests/fixtures/h200x1/nvml-capture.json (one reading of a
1x H200, idle) and, where committed, nvml-machine-state.json (benchmarks/gpu_machine_state.sh:
idle, under load with another process, after).  Readings a GPU machine could not be made to
show on demand (throttling, a downtrained link, replays) are constructed to the exact format of
the capture: its fields, with values changed (``constructed``).
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from commdiag.measure import launcher, machinestate as ms, nvmlreplay

FIX = Path(__file__).parent / "fixtures" / "h200x1"
CAPTURE = json.loads((FIX / "nvml-capture.json").read_text())
RECORDINGS = sorted(p.name for p in FIX.glob("nvml-*.json"))
OWN, OTHER = 1111, 4242


def constructed() -> dict:
    """Snapshots built from the real capture's GPU 0 (fields as recorded, values changed), plus a
    second GPU on another bus: idle; under load (the launch's own process); hot (thermal slowdown,
    lower SM clock); beside another process; with the link downtrained; after, quiet; after a rough
    launch (3 more PCIe replays, 250 ms of thermal violation time)."""
    g0 = copy.deepcopy(CAPTURE["gpus"][0])
    g0.update(energy_mj=1_000_000, violation_ns={"power": 0, "thermal": 0}, pcie_recovery_counter=0)
    g1 = dict(copy.deepcopy(g0), index=1, pci_bus_id="00000000:00:07.0")

    def snap(label, **changes):
        gpus = [copy.deepcopy(g0), copy.deepcopy(g1)]
        for g in gpus:
            g.update(copy.deepcopy(changes))
        return {"label": label, "gpus": gpus}

    busy = dict(utilization={"gpu": 90, "memory": 40}, power_mw=350000, temperature=45,
                processes=[{"pid": OWN, "used_memory": 1 << 30, "name": "/usr/bin/python3"}])
    return {"snapshots": [
        snap("idle", clocks_event_reasons=1, sm_clock=345),
        snap("load", **busy),
        snap("hot", **dict(busy, clocks_event_reasons=0x48, sm_clock=1755, temperature=88)),
        snap("other", **dict(busy, processes=busy["processes"] + [{"pid": OTHER, "used_memory": 1 << 20,
                                                                    "name": "/opt/venv/bin/python"}])),
        snap("gen4", **dict(busy, pcie_gen=4)),
        snap("after", clocks_event_reasons=1, energy_mj=1_300_000),
        snap("after-hot", clocks_event_reasons=1, pcie_replay_counter=4, energy_mj=1_300_000,
             violation_ns={"power": 0, "thermal": 250_000_000}),
    ]}


def readings(replay: nvmlreplay.ReplayNvml, sampler: ms.Sampler, during: list[str], is_own=lambda pid: pid == OWN,
             before="idle", after="after"):
    """(before, during, after, other processes) as a watch takes them, from the named snapshots."""
    log = ms.ProcessLog(is_own, sampler.process_name)
    replay.use(before)
    b = sampler.read(ms.FULL)
    log.add("before", b)
    d = []
    for label in during:
        replay.use(label)
        d.append(sampler.read(ms.QUICK))
        log.add("during", d[-1])
    replay.use(after)
    a = sampler.read(ms.FULL)
    log.add("after", a)
    return b, d, a, log.entries()


def record(rec: dict, during: list[str], after: str = "after", is_own=lambda pid: pid == OWN) -> dict:
    replay = nvmlreplay.ReplayNvml(rec)
    sampler = ms.open_sampler("gloo", nvml=replay)
    b, d, a, others = readings(replay, sampler, during, is_own, after=after)
    return ms.launch_record(sampler.gpus, b, d, a, others, period_s=1.0, cost_s=0.001, cpu_s=0.002)


# ------------------------------------------------------------------ real recordings


@pytest.mark.parametrize("name", RECORDINGS)
def test_every_recording_replays_through_the_collectors_unchanged(name):
    rec = json.loads((FIX / name).read_text())
    replay = nvmlreplay.ReplayNvml(rec)
    sampler = ms.open_sampler("gloo", nvml=replay)
    assert sampler.available and [g["name"] for g in sampler.gpus] == ["NVIDIA H200"]
    assert sampler.gpus[0]["pci_bus_id"] == "00000000:00:06.0"
    assert (sampler.gpus[0]["pcie_max_gen"], sampler.gpus[0]["pcie_max_width"]) == (5, 16)
    for snap in replay.snapshots:
        replay.use(snap["label"])
        got = sampler.read(ms.FULL)[0]
        raw = snap["gpus"][0]
        for f in ("sm_clock", "mem_clock", "clocks_event_reasons", "temperature", "power_mw", "pcie_gen",
                  "pcie_width", "pcie_replay_counter", "utilization", "energy_mj", "pcie_recovery_counter"):
            if isinstance(raw.get(f), (int, dict)):
                assert got[f] == raw[f], (snap["label"], f)
            else:  # not recorded, or an error NVML gave there: skipped, never a made-up value
                assert f not in got, (snap["label"], f)
        assert [p["pid"] for p in got["processes"]] == [p["pid"] for p in raw["processes"]]
    if "load_pids" in rec:  # gpu_machine_state.sh: a child ran matmuls on GPU 0 in the load snapshots
        load = [l for l in replay.labels if l.startswith("load")]
        b, d, a, others = readings(replay, sampler, load, lambda pid: False)
        assert all(ms.loaded(r[0]) for r in d) and not ms.loaded(b[0])
        assert {(o["pid"], o["gpu"], "during" in o["seen"]) for o in others} >= {(rec["load_pids"][0], 0, True)}
        assert next(o["name"] for o in others if o["pid"] == rec["load_pids"][0]).startswith("python")
        assert not readings(replay, sampler, load, lambda pid: pid in rec["load_pids"])[3]


def test_the_h200_capture_reads_what_nvidia_smi_showed_and_skips_what_it_lacks():
    replay = nvmlreplay.ReplayNvml(CAPTURE)
    sampler = ms.open_sampler("gloo", nvml=replay)
    got = sampler.read(ms.FULL)[0]
    assert got == {"index": 0, "sm_clock": 1980, "mem_clock": 3201, "clocks_event_reasons": 0, "temperature": 38,
                   "power_mw": 126047, "pcie_gen": 5, "pcie_width": 16, "pcie_replay_counter": 1,
                   "utilization": {"gpu": 0, "memory": 0}, "processes": []}
    # nvidia-smi -q on that machine listed nine clock-event reasons: the supported mask decodes to them
    assert ms.decode_reasons(CAPTURE["gpus"][0]["supported_clocks_event_reasons"]) == list(
        ms.CLOCK_EVENT_REASONS.values())
    # energy, violation and recovery were not captured: asked once, then never again in the run
    calls = replay.calls
    sampler.read(ms.FULL)
    assert replay.calls - calls == 10  # 2 clocks, events, temperature, power, 2 link, replays, util, processes
    assert not sampler.read(ms.QUICK)[0].keys() - {"index", "sm_clock", "mem_clock", "clocks_event_reasons",
                                                    "temperature", "power_mw", "pcie_gen", "pcie_width",
                                                    "utilization", "processes"}


def test_clock_event_reasons_decode_and_fall_back_to_the_older_throttle_call():
    assert ms.decode_reasons(0) == [] and ms.decode_reasons(None) == []
    assert ms.decode_reasons(0x41) == ["GPU_IDLE", "HW_THERMAL_SLOWDOWN"]
    assert ms.decode_reasons(0x204) == ["SW_POWER_CAP", "0x200"]  # a bit nvml.h does not name yet
    old = copy.deepcopy(CAPTURE)  # a driver before r535: only nvmlDeviceGetCurrentClocksThrottleReasons
    old["gpus"][0]["clocks_event_reasons"] = "err: NVMLError_FunctionNotFound: Function Not Found"
    old["gpus"][0]["clocks_throttle_reasons"] = 0x20
    got = ms.open_sampler("gloo", nvml=nvmlreplay.ReplayNvml(old)).read(ms.QUICK)[0]
    assert got["clocks_event_reasons"] == 0x20


def test_a_recorded_error_is_raised_by_its_type_skipped_in_readings_and_kept_in_recordings():
    broken = copy.deepcopy(CAPTURE)
    broken["gpus"][0]["temperature"] = "err: NVMLError_NotSupported: Not Supported"
    sampler = ms.open_sampler("gloo", nvml=nvmlreplay.ReplayNvml(broken))
    assert "temperature" not in sampler.read(ms.FULL)[0]
    kept = sampler.read(ms.FULL, record_errors=True)[0]
    assert kept["temperature"] == "err: NVMLError_NotSupported: Not Supported"
    with pytest.raises(Exception) as e:
        nvmlreplay.ReplayNvml(broken).nvmlDeviceGetTemperature(nvmlreplay._Handle(0), 0)
    assert type(e.value).__name__ == "NVMLError_NotSupported"


# ------------------------------------------------------------------ the launch record


def test_a_launch_record_keeps_load_ranges_counter_deltas_and_other_processes():
    m = record(constructed(), ["idle", "load", "hot", "other", "gen4"], after="after-hot")
    assert m["available"] and m["samples"] == 5 and len(m["gpus"]) == 2
    g = m["gpus"][0]
    assert g["before"]["reasons"] == ["GPU_IDLE"] and g["before"]["sm_clock"] == 345
    d = g["during"]
    # the idle reading is not under load: clocks and link come from the four busy ones
    assert d["samples"] == 5 and d["loaded"] == 4
    assert d["sm_clock"] == [1755, 1980] and d["mem_clock"] == [3201, 3201]
    assert (d["pcie_gen_min"], d["pcie_width_min"]) == (4, 16)
    assert d["reasons"] == {"GPU_IDLE": 1, "HW_SLOWDOWN": 1, "HW_THERMAL_SLOWDOWN": 1}
    assert d["temperature_max"] == 88 and d["power_mw_max"] == 350000
    assert g["pcie_replay_delta"] == 3 and g["pcie_recovery_delta"] == 0
    assert g["energy_j"] == 300.0 and g["violation_ms"] == {"power": 0.0, "thermal": 250.0}
    # the launch's own process is left out; the other one is named (basename), per GPU, when seen
    assert m["others"] == [{"gpu": 0, "pid": OTHER, "name": "python", "seen": ["during"]},
                           {"gpu": 1, "pid": OTHER, "name": "python", "seen": ["during"]}]
    json.dumps(m)  # what run.json stores


def test_a_launch_process_is_recognised_by_its_marker():
    marker = launcher.new_marker()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             env={**os.environ, launcher.MARKER: marker})
    try:
        time.sleep(0.2)
        assert launcher.carries_marker(child.pid, marker)
        assert not launcher.carries_marker(child.pid, launcher.new_marker())
        assert not launcher.carries_marker(os.getpid(), marker)
        assert not launcher.carries_marker(2 ** 22 + 7, marker)  # no such process
        assert launcher.marked_pids(marker) == [child.pid]
        # the sweep's watch, as sweep._one_process sets it up: NVML lists the launch's worker and a stranger
        rec = constructed()
        for g in rec["snapshots"][1]["gpus"]:
            g["processes"] = [{"pid": child.pid, "name": "python3"}, {"pid": OTHER, "name": "/usr/bin/stranger"}]
        sampler = ms.open_sampler("gloo", nvml=nvmlreplay.ReplayNvml(rec, "load"), period_s=0.02)
        with sampler.watch(lambda pid: launcher.carries_marker(pid, marker)) as w:
            time.sleep(0.1)
        assert {(o["pid"], o["name"]) for o in w.record()["others"]} == {(OTHER, "stranger")}
    finally:
        child.kill()
        child.wait()


# ------------------------------------------------------------------ the watch around a launch


def test_a_watch_reads_before_during_and_after_in_a_thread(monkeypatch):
    sampler = ms.open_sampler("gloo", nvml=nvmlreplay.ReplayNvml(constructed(), "load"), period_s=0.02)
    with sampler.watch(lambda pid: pid == OWN) as w:
        time.sleep(0.3)  # the launch
    m = w.record()
    assert m["available"] and m["samples"] >= 3 and m["gpus"][0]["during"]["loaded"] == m["samples"]
    assert m["others"] == [] and 0 < m["cost_s"] < 0.3 and m["cpu_s"] > 0
    assert not [t for t in threading.enumerate() if t.name == "commdiag-machine-state"]


class BlockingNvml(nvmlreplay.ReplayNvml):
    """A replay whose clock call blocks until released: a GPU that stopped answering."""

    release = threading.Event()

    def nvmlDeviceGetClockInfo(self, h, clock):
        self.release.wait(30)
        return 1980


def test_nvml_that_stops_answering_never_holds_up_a_launch(monkeypatch):
    monkeypatch.setattr(ms, "READ_DEADLINE_S", 0.3)
    sampler = ms.open_sampler("gloo", nvml=BlockingNvml(CAPTURE))
    try:
        t0 = time.monotonic()
        with sampler.watch() as w:
            pass
        assert time.monotonic() - t0 < 1.5
        assert w.record() == {"available": False, "error": "NVML did not answer within 0.3 s (before the launch)"}
        assert not sampler.available and "not read since" in sampler.describe()["stopped"]
        with sampler.watch() as w2:  # the next launch does not ask NVML again
            pass
        assert w2.record() == {"available": False}
    finally:
        BlockingNvml.release.set()


def test_without_nvml_the_reason_is_said_once_per_run():
    gloo = ms.open_sampler("gloo")
    assert not gloo.available and gloo.describe() == {
        "available": False, "reason": "backend gloo: the launches use no GPU, so no GPU state is read"}
    with gloo.watch() as w:
        pass
    assert w.record() == {"available": False}  # per launch: no reason repeated, no cost
    nccl = ms.open_sampler("nccl")  # this machine: nvidia-ml-py installed, no NVIDIA driver
    if nccl.available:
        nccl.close()
        pytest.skip("NVML works on this machine")
    assert nccl.describe()["reason"].startswith("NVML did not initialise (NVMLError_")

    class NoGpus:
        def nvmlDeviceGetCount(self):
            return 0

    assert ms.Sampler(NoGpus()).describe() == {"available": False, "reason": "NVML sees no GPU on this machine"}


class SlowNvml(nvmlreplay.ReplayNvml):
    """A replay whose readings take a while, and which notes an nvmlShutdown that comes while a
    reading is still inside it (on real NVML: the SIGSEGV seen on the 1x H200)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.inside, self.shut, self.shut_while_inside = 0, False, False

    def nvmlDeviceGetClockInfo(self, h, clock):
        self.inside += 1
        try:
            time.sleep(0.3)
            return 1980
        finally:
            self.inside -= 1

    def nvmlShutdown(self):
        self.shut = True
        self.shut_while_inside = self.inside > 0


def test_ctrl_c_during_the_first_reading_stops_the_thread_before_nvml_shuts_down():
    nvml = SlowNvml(constructed(), "load")
    sampler = ms.Sampler(nvml, owns_init=True)
    before = set(threading.enumerate())
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            with sampler.watch():  # Ctrl-C arrives while __enter__ waits for the reading before
                time.sleep(5)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, old)
    sampler.close()
    assert nvml.shut and not nvml.shut_while_inside
    assert not [t for t in set(threading.enumerate()) - before if t.name == "commdiag-machine-state"]


def test_close_waits_for_a_reading_interrupted_in_the_launch_and_never_shuts_down_under_a_stuck_one(
        monkeypatch):
    nvml = SlowNvml(constructed(), "load")
    sampler = ms.Sampler(nvml, owns_init=True, period_s=0.01)
    w = sampler.watch()
    w.__enter__()  # a launch whose __exit__ never ran (its wait was interrupted)
    sampler.close()
    assert nvml.shut and not nvml.shut_while_inside

    monkeypatch.setattr(ms, "READ_DEADLINE_S", 0.3)
    stuck = BlockingNvml(CAPTURE)
    stuck.shut = False
    stuck.nvmlShutdown = lambda: setattr(stuck, "shut", True)
    BlockingNvml.release.clear()
    sampler = ms.Sampler(stuck, owns_init=True)
    try:
        with sampler.watch():
            pass
        sampler.close()
        sampler.close()  # however often close() is called
        assert not stuck.shut  # a thread still inside NVML: NVML stays up
    finally:
        BlockingNvml.release.set()
    deadline = time.monotonic() + 10  # and once NVML answers, the thread ends: it does not poll on
    while [t for t in threading.enumerate() if t.name == "commdiag-machine-state"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [t for t in threading.enumerate() if t.name == "commdiag-machine-state"]


def test_a_watch_whose_thread_never_started_is_not_waited_for(monkeypatch):
    def no_thread(self):
        raise RuntimeError("can't start new thread")

    nvml = SlowNvml(constructed(), "load")
    sampler = ms.Sampler(nvml, owns_init=True)
    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        with sampler.watch():
            pass
    monkeypatch.undo()
    sampler.close()  # no join of a thread that never started
    assert nvml.shut
