"""The probe process of ``commdiag p2p``: ``main(["--fd", N, "--plan", JSON])`` in a child that
supervise.py starts (``python -c``, see PROBE_CODE there).

It owns every CUDA and NVML call, so that whatever hangs, hangs here and not in commdiag
(supervise.py kills it and starts another for the jobs left).  It reports on file
descriptor N, one JSON object per line:

    {"event": "hello", "count": 2, "devices": [...], "peer": [[...]], "nvml": {...}, ...}
    {"event": "job", "id": "0-1"}                       a job starts (its deadline starts)
    {"event": "phase", "id": "0-1", "phase": "P2P 0->1"} where it is (named if it hangs)
    {"event": "result", "id": "0-1", "record": {...}, "wall_s": 0.8}
    {"event": "error", "id": "0-1", "phase": "...", "error": "..."}   then it exits 1

The jobs, in this order (``jobs_for``): ``gpu<i>`` per GPU (host copies, link under load),
``<a>-<b>`` per pair (peer access, data check, P2P and through-host bandwidth and latency),
``final`` (NVML's PCIe replay counters after everything).  The plan says which to skip
(done by an earlier probe).

Test-only switch, honoured only when set: ``COMMDIAG_TEST_FAULT``, comma-separated:
``p2p-fake:N`` (N fake GPUs with constant numbers: no torch, no CUDA, no NVML),
``p2p-hang:JOB`` (sleep forever when JOB starts), ``p2p-crash:JOB`` (exit 3 when JOB starts),
``p2p-raise:JOB`` (an exception in JOB: reported, then the probe ends), ``p2p-hang-start`` (sleep
forever before the hello).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

FINAL = "final"


def jobs_for(count: int) -> list[str]:
    """Every job for ``count`` GPUs, in the order they run (parent and probe share it)."""
    if count <= 0:
        return []
    pairs = [f"{a}-{b}" for a in range(count) for b in range(a + 1, count)]
    return [f"gpu{i}" for i in range(count)] + pairs + [FINAL]


def parse_faults(value: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (v.strip() for v in value.split(","))):
        key, _, arg = item.partition(":")
        out[key] = arg
    return out


# --------------------------------------------------------------------------- NVML (probe side only)

def _nvml_call(fn, *args):
    try:
        v = fn(*args)
    except Exception as e:  # NotSupported on some GPUs and in VMs: record why, go on
        return f"err: {type(e).__name__}: {e}"
    return v.decode() if isinstance(v, bytes) else v


def read_nvml_extras() -> list[dict]:
    """Per NVML GPU what topology.read_nvml does not read: UUID and the PCIe replay counter."""
    import pynvml

    pynvml.nvmlInit()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            out.append({"index": i, "uuid": _nvml_call(pynvml.nvmlDeviceGetUUID, h),
                        "replays": _nvml_call(pynvml.nvmlDeviceGetPcieReplayCounter, h)})
        return out
    finally:
        pynvml.nvmlShutdown()


class LinkReader:
    """NVML's current PCIe generation and width of CUDA devices, matched by UUID."""

    def __init__(self, uuids: dict[int, str]):
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handles = {}
        for i, u in uuids.items():
            try:
                self.handles[i] = pynvml.nvmlDeviceGetHandleByUUID(u)
            except Exception:
                continue

    def __call__(self, gpus) -> dict:
        out = {}
        for i in gpus:
            h = self.handles.get(i)
            if h is None:
                continue
            gen = _nvml_call(self.nvml.nvmlDeviceGetCurrPcieLinkGeneration, h)
            width = _nvml_call(self.nvml.nvmlDeviceGetCurrPcieLinkWidth, h)
            if isinstance(gen, int) and isinstance(width, int):
                out[str(i)] = [gen, width]
        return out


# --------------------------------------------------------------------------- backends

class CudaBackend:
    """The real measurements (copies.py) on the GPUs torch sees."""

    def __init__(self, settings: dict):
        self.settings = settings
        self.copies = None
        self.links = None

    def hello(self) -> dict:
        import torch

        out = {"torch": torch.__version__, "cuda": torch.version.cuda, "count": 0, "devices": [], "peer": []}
        if torch.version.cuda is None:
            out["reason"] = f"this torch ({torch.__version__}) is built without CUDA"
            return out
        if not torch.cuda.is_available():
            vis = os.environ.get("CUDA_VISIBLE_DEVICES")
            out["reason"] = ("torch finds no CUDA GPU (no driver for it, or none visible"
                             + (f": CUDA_VISIBLE_DEVICES={vis!r})" if vis is not None else ")"))
            return out
        n = torch.cuda.device_count()
        out["count"] = n
        for i in range(n):
            p = torch.cuda.get_device_properties(i)
            uuid = str(getattr(p, "uuid", "") or "")
            bus = None
            if getattr(p, "pci_bus_id", None) is not None:
                bus = f"{getattr(p, 'pci_domain_id', 0):08x}:{p.pci_bus_id:02x}:{getattr(p, 'pci_device_id', 0):02x}.0"
            out["devices"].append({"index": i, "name": p.name, "bus_id": bus,
                                   "uuid": (uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}") if uuid else None,
                                   "memory": p.total_memory, "capability": f"{p.major}.{p.minor}"})
        out["peer"] = [[None if i == j else bool(torch.cuda.can_device_access_peer(i, j)) for j in range(n)]
                       for i in range(n)]
        from ..environment import topology

        try:
            out["nvml"] = topology.read_nvml()
            out["nvml_extras"] = read_nvml_extras()
            out["driver"] = out["nvml"].get("driver")
        except Exception as e:  # NvmlUnavailable, or a driver without NVML
            out["nvml_error"] = f"{type(e).__name__}: {e}"
        try:
            self.links = LinkReader({d["index"]: d["uuid"] for d in out["devices"] if d["uuid"]})
        except Exception:
            self.links = None
        s = self.settings
        from .copies import Copies

        self.copies = Copies(s["size_bytes"], s["repeats"], s["latency_copies"], s["latency_repeats"],
                             read_links=self.links)
        return out

    def run(self, job: str, phase) -> dict:
        if job == FINAL:
            extras = read_nvml_extras()
            return {"replays": {str(e["index"]): e["replays"] for e in extras}}
        if job.startswith("gpu"):
            return self.gpu(int(job[3:]), phase)
        a, b = (int(x) for x in job.split("-"))
        return self.pair(a, b, phase)

    def _links(self, readings: list) -> dict:
        """{CUDA index: [[gen, width], ...]} from readings taken under load."""
        out: dict = {}
        for r in readings:
            for i, gw in r.items():
                out.setdefault(i, []).append(gw)
        return out

    def gpu(self, i: int, phase) -> dict:
        c = self.copies
        idle = self.links([i]) if self.links else {}
        phase("allocate")
        src, dst, s0, s1 = c.dev(i)
        h0, h1 = c.host()
        rec: dict = {"link_idle": idle, "link_load": {}}
        loads = []
        phase("host to GPU")
        rec["h2d"], l1 = c.timed([(c.leg(dst.data_ptr(), h0.data_ptr()), s0)], gpus=[i])
        phase("GPU to host")
        rec["d2h"], l2 = c.timed([(c.leg(h1.data_ptr(), src.data_ptr()), s0)], gpus=[i])
        phase("host both ways")
        rec["host_bidir"], l3 = c.timed([(c.leg(dst.data_ptr(), h0.data_ptr()), s0),
                                             (c.leg(h1.data_ptr(), src.data_ptr()), s1)], gpus=[i])
        loads += l1 + l2 + l3
        phase("copy within the GPU")
        rec["local"], _ = c.timed([(c.leg(dst.data_ptr(), src.data_ptr()), s0)], counted=2 * c.size)
        phase("latency host to GPU")
        rec["lat_h2d"], r1 = c.latency(c.small_copy(dst.data_ptr(), h0.data_ptr(), s0), s0)
        phase("latency GPU to host")
        rec["lat_d2h"], r2 = c.latency(c.small_copy(h1.data_ptr(), src.data_ptr(), s0), s0)
        rec["latency_redone"] = r1 + r2
        rec["spin_cycles"] = dict(c.spins)
        rec["link_load"] = self._links(loads)
        return rec

    def pair(self, a: int, b: int, phase) -> dict:
        import torch

        c = self.copies
        rec: dict = {"link_load": {}}
        phase("peer access")
        pab, pba = (bool(torch.cuda.can_device_access_peer(a, b)), bool(torch.cuda.can_device_access_peer(b, a)))
        rec["peer_ab"], rec["peer_ba"] = pab, pba
        src_a, dst_a, sa0, sa1 = c.dev(a)
        src_b, dst_b, sb0, sb1 = c.dev(b)
        h0, h1 = c.host()
        if pab:
            c.enable_peer(a, b)
        if pba:
            c.enable_peer(b, a)
        phase(f"data check {a}->{b}")
        rec["check_ab"] = c.check(a, b, seed=2 * a + 1, peer=pab)
        phase(f"data check {b}->{a}")
        rec["check_ba"] = c.check(b, a, seed=2 * b + 2, peer=pba)
        loads = []
        if pab:
            phase(f"P2P {a}->{b}")
            rec["p2p_ab"], l1 = c.timed([(c.leg(dst_b.data_ptr(), src_a.data_ptr()), sa0)], gpus=[a, b])
            loads += l1
        if pba:
            phase(f"P2P {b}->{a}")
            rec["p2p_ba"], l2 = c.timed([(c.leg(dst_a.data_ptr(), src_b.data_ptr()), sb0)], gpus=[a, b])
            loads += l2
        if pab and pba:
            phase("P2P both ways")
            rec["p2p_bidir"], l3 = c.timed([(c.leg(dst_b.data_ptr(), src_a.data_ptr()), sa0),
                                                (c.leg(dst_a.data_ptr(), src_b.data_ptr()), sb0)], gpus=[a, b])
            loads += l3
        phase(f"through host {a}->{b}")
        rec["host_ab"], l4 = c.timed([(c.staged_leg(dst_b.data_ptr(), h0.data_ptr(), src_a.data_ptr(), sb0),
                                           sa0)], gpus=[a, b], kind="staged")
        phase(f"through host {b}->{a}")
        rec["host_ba"], l5 = c.timed([(c.staged_leg(dst_a.data_ptr(), h1.data_ptr(), src_b.data_ptr(), sa1),
                                           sb1)], gpus=[a, b], kind="staged")
        phase("through host both ways")
        rec["host_bidir"], l6 = c.timed(
            [(c.staged_leg(dst_b.data_ptr(), h0.data_ptr(), src_a.data_ptr(), sb0), sa0),
             (c.staged_leg(dst_a.data_ptr(), h1.data_ptr(), src_b.data_ptr(), sa1), sb1)], gpus=[a, b],
            kind="staged")
        loads += l4 + l5 + l6
        redone = 0
        if pab:
            phase(f"P2P latency {a}->{b}")
            rec["lat_p2p_ab"], r = c.latency(c.small_copy(dst_b.data_ptr(), src_a.data_ptr(), sa0), sa0)
            redone += r
        if pba:
            phase(f"P2P latency {b}->{a}")
            rec["lat_p2p_ba"], r = c.latency(c.small_copy(dst_a.data_ptr(), src_b.data_ptr(), sb0), sb0)
            redone += r
        phase(f"latency through host {a}->{b}")
        rec["lat_host_ab"], r = c.latency(c.small_staged(dst_b.data_ptr(), h0.data_ptr(), src_a.data_ptr(), sa0, sb0),
                                          sa0, kind="latency-staged")
        redone += r
        phase(f"latency through host {b}->{a}")
        rec["lat_host_ba"], r = c.latency(c.small_staged(dst_a.data_ptr(), h1.data_ptr(), src_b.data_ptr(), sb1, sa1),
                                          sb1, kind="latency-staged")
        rec["latency_redone"] = redone + r
        rec["spin_cycles"] = dict(c.spins)
        rec["link_load"] = self._links(loads)
        return rec


class FakeBackend:
    """COMMDIAG_TEST_FAULT=p2p-fake:N: N GPUs that answer with constant numbers at once (tests of the
    supervision: deadlines, kills, restarts; the measurements are tested elsewhere)."""

    def __init__(self, count: int):
        self.count = count

    def hello(self) -> dict:
        n = self.count
        return {"torch": None, "cuda": None, "count": n,
                "devices": [{"index": i, "name": f"fake GPU {i}", "uuid": f"GPU-fake-{i}", "bus_id": None}
                            for i in range(n)],
                "peer": [[None if i == j else True for j in range(n)] for i in range(n)],
                "nvml_error": "fake GPUs (COMMDIAG_TEST_FAULT)"}

    def run(self, job: str, phase) -> dict:
        time.sleep(0.02)
        if job == FINAL:
            return {"replays": {}}
        if job.startswith("gpu"):
            phase("host to GPU")
            return {"h2d": [50.0, 50.5, 51.0], "d2h": [49.0, 49.5, 50.0]}
        phase("P2P")
        return {"peer_ab": True, "peer_ba": True, "check_ab": {"bytes": 64, "mismatches": 0},
                "check_ba": {"bytes": 64, "mismatches": 0}, "p2p_ab": [40.0, 41.0, 42.0],
                "p2p_ba": [40.0, 41.0, 42.0], "host_ab": [20.0, 20.5, 21.0], "host_ba": [20.0, 20.5, 21.0]}


# --------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    fd = int(argv[argv.index("--fd") + 1])
    plan = json.loads(argv[argv.index("--plan") + 1])
    out = os.fdopen(fd, "w", buffering=1)

    def emit(**event):
        out.write(json.dumps(event) + "\n")

    faults = parse_faults(os.environ.get("COMMDIAG_TEST_FAULT", ""))
    if "p2p-hang-start" in faults:
        time.sleep(10**6)
    backend = FakeBackend(int(faults["p2p-fake"])) if "p2p-fake" in faults else CudaBackend(plan["settings"])
    hello = backend.hello()
    emit(event="hello", **hello)
    skip = set(plan.get("skip", []))
    where = {"phase": None}

    def phase(name):
        where["phase"] = name
        emit(event="phase", id=job, phase=name)

    for job in jobs_for(hello["count"]):
        if job in skip:
            continue
        where["phase"] = None
        emit(event="job", id=job)
        if faults.get("p2p-hang") == job:
            time.sleep(10**6)
        if faults.get("p2p-crash") == job:
            print(f"commdiag test fault: crashing in job {job} on purpose", file=sys.stderr, flush=True)
            os._exit(3)
        t0 = time.monotonic()
        try:
            if faults.get("p2p-raise") == job:
                raise RuntimeError(f"commdiag test fault: an error in job {job}")
            record = backend.run(job, phase)
        except Exception as e:  # a CUDA error can leave the context unusable: report, end this probe
            traceback.print_exc()
            frame = traceback.extract_tb(e.__traceback__)[-1]
            at = f" (at {os.path.basename(frame.filename)}:{frame.lineno} in {frame.name})"
            emit(event="error", id=job, phase=where["phase"], error=f"{type(e).__name__}: {e}"[:1500] + at)
            return 1
        emit(event="result", id=job, record=record, wall_s=round(time.monotonic() - t0, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
