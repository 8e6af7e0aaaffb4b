"""The timed copies of ``commdiag p2p``, in the probe process (needs torch with CUDA).

torch owns memory, streams and events; every timed copy is one call of the driver's
``cuMemcpyAsync`` (libcuda.so.1, the library torch itself runs on) on a stream we choose,
which infers the direction from the pointers (unified addressing).  torch's own cross-device
``copy_`` brackets every copy with event barriers on both devices' current streams: harmless
for 256 MiB, but a 16-byte latency would measure the barriers.  So the copies here are exactly
what cuda-samples' p2pBandwidthLatencyTest issues (``cudaMemcpyPeerAsync`` on the source's
stream: a peer write), and nothing else runs on those streams.

Timing: CUDA events around each repeat, bandwidth = bytes / elapsed (GB/s = 10^9 B/s); a spin
kernel holds the stream until the repeat's copies are all queued, so host-side queueing is never
timed (a repeat whose queueing outlasted the spin is redone with a longer spin).
Latency: a spin kernel (``torch.cuda._sleep``) holds the stream while ``copies`` small copies
are queued behind it, then the elapsed time over them / copies, as p2pBandwidthLatencyTest
does with its delay kernel.

Through host memory: D2H into pinned memory on the source's stream, then H2D from it on the
destination's stream, in 4 MiB chunks (NCCL's default buffer size) so that both run at once,
as NCCL's SHM transport and the driver's staged peer copy do.
"""

from __future__ import annotations

import ctypes
import time

CHUNK = 4 << 20  # through-host pipeline chunk: NCCL_BUFFSIZE's default
SMALL = 16  # latency copy: one int4, as p2pBandwidthLatencyTest
CHECK_BYTES = (32 << 20) + 13  # data check: 32 MiB and an odd tail (not a multiple of any vector width)
SPIN_START = 1_000_000  # spin-kernel cycles for a latency repeat (about 0.5-1 ms); doubled when too short
SPIN_MAX = 64_000_000  # about 30 ms at 2 GHz: queueing that takes longer is not waited for
LINK_POLL_S = 0.002  # NVML link readings while copies run: every 2 ms (a 256 MiB PCIe copy takes 5)


class Driver:
    """``cuMemcpyAsync`` from libcuda.so.1; raises on any CUresult other than success."""

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        self._copy = lib.cuMemcpyAsync
        self._copy.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
        self._copy.restype = ctypes.c_int
        self._name = lib.cuGetErrorName
        self._name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self._name.restype = ctypes.c_int

    def copy(self, dst: int, src: int, nbytes: int, stream) -> None:
        rc = self._copy(dst, src, nbytes, stream.cuda_stream)
        if rc:
            name = ctypes.c_char_p()
            self._name(rc, ctypes.byref(name))
            raise RuntimeError(f"cuMemcpyAsync of {nbytes} bytes failed: CUresult {rc} "
                               f"({(name.value or b'?').decode()})")


class Copies:
    """Buffers per GPU (two of ``size`` bytes), two streams per GPU, two pinned host buffers."""

    def __init__(self, size: int, repeats: int, latency_copies: int, latency_repeats: int, read_links=None):
        import torch

        self.torch = torch
        self.size, self.repeats = size, repeats
        self.latency_copies, self.latency_repeats = latency_copies, latency_repeats
        self.driver = Driver()
        self.read_links = read_links  # callable(list of CUDA indices) while copies run, or None
        self.spins: dict[str, int] = {}  # spin-kernel cycles per kind of repeat, grown as needed
        self._dev: dict[int, tuple] = {}
        self._host = None

    # ------------------------------------------------------------------ resources
    def dev(self, i: int):
        """(src, dst, stream0, stream1) of GPU i, made on first use."""
        if i not in self._dev:
            t = self.torch
            src = t.empty(self.size, dtype=t.uint8, device=i).fill_(0x5A)
            dst = t.zeros(self.size, dtype=t.uint8, device=i)
            self._dev[i] = (src, dst, t.cuda.Stream(device=i), t.cuda.Stream(device=i))
        return self._dev[i]

    def host(self):
        """Two pinned host buffers (one per direction of a through-host pair copy)."""
        if self._host is None:
            t = self.torch
            self._host = (t.empty(self.size, dtype=t.uint8, pin_memory=True),
                          t.empty(self.size, dtype=t.uint8, pin_memory=True))
        return self._host

    def enable_peer(self, a: int, b: int) -> None:
        """Peer access a -> b as torch enables it (its first copy between them): the P2P path."""
        t = self.torch
        x = t.ones(1, dtype=t.uint8, device=a)
        t.empty(1, dtype=t.uint8, device=b).copy_(x)
        t.cuda.synchronize(a)
        t.cuda.synchronize(b)

    def _event(self, timing: bool = False):
        return self.torch.cuda.Event(enable_timing=timing)

    def _wait_with_link_reads(self, last_event, gpus) -> list:
        """Poll NVML's link state until ``last_event`` completes: readings taken under load."""
        readings = []
        while True:
            if self.read_links is not None and gpus:
                readings.append(self.read_links(gpus))
            if last_event.query():
                return readings
            time.sleep(LINK_POLL_S)

    # ------------------------------------------------------------------ bandwidth
    def timed(self, legs, gpus=(), counted: int | None = None, kind: str = "copy") -> tuple[list[float], list]:
        """GB/s per repeat of ``legs`` running at once (after one untimed repeat).

        ``legs``: [(issue, stream)], ``issue(stream)`` enqueues one leg.  A spin kernel holds the
        first leg's stream while everything is queued (as p2pBandwidthLatencyTest's delay kernel),
        the others start on its start event and it waits for their ends, so the events span exactly
        the copies.  ``counted``: bytes per repeat (default: ``self.size`` per leg); ``kind`` keys the
        spin length (a staged leg queues 64 chunks, a plain one a single copy).  Returns the values and
        NVML link readings taken while the copies ran."""
        t = self.torch
        s0 = legs[0][1]
        counted = counted or len(legs) * self.size
        vals, links, warm = [], [], True
        while len(vals) < self.repeats:
            spin_start, start, stop = self._event(True), self._event(True), self._event(True)
            with t.cuda.device(s0.device):
                spin_start.record(s0)
                with t.cuda.stream(s0):
                    t.cuda._sleep(self.spins.setdefault(kind, SPIN_START))
                start.record(s0)
            for _, s in legs[1:]:
                s.wait_event(start)
            t0 = time.perf_counter()
            for issue, s in legs:
                issue(s)
            queued_ms = (time.perf_counter() - t0) * 1e3
            for _, s in legs[1:]:
                done = self._event()
                done.record(s)
                s0.wait_event(done)
            stop.record(s0)
            links += self._wait_with_link_reads(stop, gpus)
            for _, s in legs:
                s.synchronize()
            if self._too_short(kind, spin_start, start, queued_ms):
                continue  # the copies started before all were queued: redone with a longer spin
            if warm:
                warm = False
                continue
            vals.append(counted / (start.elapsed_time(stop) * 1e-3) / 1e9)
        return vals, links

    def leg(self, dst: int, src: int, nbytes: int | None = None):
        """One copy on the leg's stream."""
        n = nbytes or self.size

        def issue(stream):
            with self.torch.cuda.device(stream.device):
                self.driver.copy(dst, src, n, stream)
        return issue

    def staged_leg(self, dst: int, host: int, src: int, s_dst):
        """A leg through host memory: D2H chunks on the leg's (source) stream, each chunk's H2D on
        ``s_dst`` as soon as it has landed; the source stream then waits for the last H2D, so the
        leg ends when the data has arrived."""
        def issue(s_src):
            for off in range(0, self.size, CHUNK):
                n = min(CHUNK, self.size - off)
                with self.torch.cuda.device(s_src.device):
                    self.driver.copy(host + off, src + off, n, s_src)
                    landed = self._event()
                    landed.record(s_src)
                s_dst.wait_event(landed)
                with self.torch.cuda.device(s_dst.device):
                    self.driver.copy(dst + off, host + off, n, s_dst)
            arrived = self._event()
            arrived.record(s_dst)
            s_src.wait_event(arrived)
        return issue

    # ------------------------------------------------------------------ latency
    def _too_short(self, kind: str, spin_start, start, queued_ms: float) -> bool:
        """Whether the spin ended before the host had queued everything; if so it is doubled."""
        if spin_start.elapsed_time(start) > queued_ms or self.spins[kind] >= SPIN_MAX:
            return False
        self.spins[kind] *= 2
        return True

    def latency(self, issue_one, stream, kind: str = "latency") -> tuple[list[float], int]:
        """Microseconds per small copy: ``latency_copies`` calls of ``issue_one()`` queued behind a
        spin kernel on ``stream``; returns (per-repeat values, repeats redone with a longer spin)."""
        t = self.torch
        out, redone = [], 0
        with t.cuda.device(stream.device):
            issue_one()  # untimed: first-use costs
            stream.synchronize()
            while len(out) < self.latency_repeats:
                spin_start, start, stop = self._event(True), self._event(True), self._event(True)
                spin_start.record(stream)
                with t.cuda.stream(stream):
                    t.cuda._sleep(self.spins.setdefault(kind, SPIN_START))
                start.record(stream)
                t0 = time.perf_counter()
                for _ in range(self.latency_copies):
                    issue_one()
                queued_ms = (time.perf_counter() - t0) * 1e3
                stop.record(stream)
                stop.synchronize()
                if self._too_short(kind, spin_start, start, queued_ms):
                    redone += 1  # the queue drained before it was full: the host would be timed
                    continue
                out.append(start.elapsed_time(stop) * 1e3 / self.latency_copies)
        return out, redone

    def small_copy(self, dst: int, src: int, stream):
        return lambda: self.driver.copy(dst, src, SMALL, stream)

    def small_staged(self, dst: int, host: int, src: int, s_src, s_dst):
        """One small copy through host memory: D2H on s_src, H2D on s_dst, and back to s_src, so
        that the next one starts after this one ends (a chain, as a round of NCCL SHM waits)."""
        landed, arrived = self._event(), self._event()
        t = self.torch

        def issue():
            self.driver.copy(host, src, SMALL, s_src)
            landed.record(s_src)
            s_dst.wait_event(landed)
            with t.cuda.device(s_dst.device):
                self.driver.copy(dst, host, SMALL, s_dst)
                arrived.record(s_dst)
            s_src.wait_event(arrived)
        return issue

    # ------------------------------------------------------------------ data check
    def check(self, src_dev: int, dst_dev: int, seed: int, peer: bool = True) -> dict:
        """A known pattern copied src_dev -> dst_dev (the same copy as the timed ones), compared byte
        for byte on the destination against the same pattern made there (DCGM's broken_p2p).
        Without peer access the copy is torch's (cudaMemcpyPeerAsync, which the driver stages
        through host memory): the check then covers the path NCCL would not take P2P."""
        t = self.torch
        n = CHECK_BYTES
        src = _pattern(t, n, seed, src_dev)
        expected = _pattern(t, n, seed, dst_dev)
        dst = t.bitwise_not(expected)  # a copy that never lands cannot pass
        stream = self.dev(src_dev)[2]
        t.cuda.synchronize(src_dev)  # the patterns are made on the default streams; ours does not wait for them
        t.cuda.synchronize(dst_dev)
        if peer:
            with t.cuda.device(src_dev):
                self.driver.copy(dst.data_ptr(), src.data_ptr(), n, stream)
            stream.synchronize()
        else:
            dst.copy_(src)
            t.cuda.synchronize(dst_dev)
        diff = dst != expected
        bad = int(diff.sum().item())
        first = int(diff.nonzero()[0, 0].item()) if bad else None
        del src, expected, dst, diff
        return {"bytes": n, "mismatches": bad, "first_offset": first}


def _pattern(t, n: int, seed: int, device: int):
    """Bytes that repeat nowhere short: a multiplicative hash of the offset, seeded per direction."""
    i = t.arange(n, dtype=t.int64, device=device)
    return (((i * 2654435761 + seed * 40503) >> 11) & 255).to(t.uint8)
