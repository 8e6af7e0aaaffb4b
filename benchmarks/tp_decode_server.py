"""A tensor-parallel decode "server" for commdiag ab on a multi-GPU machine: started with torchrun,
it holds a model-shaped TP layer stack (Megatron-style: QKV and MLP-up column-parallel, attention
output and MLP-down row-parallel, so two all-reduces per layer, as in an inference server's decode
step) and answers HTTP on rank 0:

    GET /health            200 once every rank has warmed up (NCCL initialised, kernels loaded)
    GET /decode?steps=N    every rank runs N decode steps (one token per sequence each); the answer
                           is rank 0's tokens/s over them, timed with CUDA synchronisation

    torchrun --standalone --nproc-per-node 2 benchmarks/tp_decode_server.py --port P
        [--hidden 4096] [--layers 16] [--batch 8] [--device cuda|cpu]

The number a benchmark reads comes from here, measured by the server's own clock, like any
server's.  NCCL reads its environment at init: a fresh server per arm is what makes an NCCL
setting reach it (commdiag ab's ``server:`` block).  ``--device cpu`` runs the same protocol on
gloo (a check of the plumbing, not a measurement).

Stop: SIGINT or SIGTERM ends every rank at once (the default action; a rank blocked inside a
collective could not run a Python handler anyway), so commdiag ab's stop never needs SIGKILL.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import torch
import torch.distributed as dist

STOP, RUN = 0, 1


def build(hidden: int, layers: int, tp: int, dev, dtype):
    h, f = hidden, 4 * hidden
    g = torch.Generator(device="cpu").manual_seed(1234 + dist.get_rank())

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.01).to(dev, dtype)

    return [(w(h, 3 * h // tp), w(h // tp, h), w(h, f // tp), w(f // tp, h)) for _ in range(layers)]


def step(x, layers, hidden: int, tp: int):
    hl = hidden // tp
    for qkv, o, up, down in layers:
        a = (x @ qkv)[:, :hl] @ o  # this rank's heads, then its share of the output projection
        dist.all_reduce(a)
        x = x + a
        m = torch.nn.functional.silu(x @ up) @ down
        dist.all_reduce(m)
        x = torch.nn.functional.layer_norm(x + m, (hidden,))
    return x


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    a = ap.parse_args()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if a.device == "cuda":
        torch.cuda.set_device(local)
        dev, dtype, backend = torch.device("cuda", local), torch.bfloat16, "nccl"
    else:
        dev, dtype, backend = torch.device("cpu"), torch.float32, "gloo"
    dist.init_process_group(backend, device_id=dev if a.device == "cuda" else None)
    rank, tp = dist.get_rank(), dist.get_world_size()
    if a.hidden % tp:
        raise SystemExit(f"--hidden {a.hidden} is not divisible by the {tp} ranks")
    layers = build(a.hidden, a.layers, tp, dev, dtype)
    x = torch.randn(a.batch, a.hidden, generator=torch.Generator().manual_seed(7)).to(dev, dtype)

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize(dev)

    def run(steps: int) -> float:
        nonlocal x
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in range(steps):
                x = step(x, layers, a.hidden, tp)
        sync()
        return time.perf_counter() - t0

    run(20)  # warmup: NCCL's communicator, kernels, allocator
    cmd = torch.zeros(2, dtype=torch.int64, device=dev)
    if rank != 0:
        while True:  # follow rank 0's commands
            dist.broadcast(cmd, 0)
            if int(cmd[0]) == STOP:
                break
            run(int(cmd[1]))
        dist.destroy_process_group()
        return

    from http.server import BaseHTTPRequestHandler, HTTPServer
    from urllib.parse import parse_qs, urlparse

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            url = urlparse(self.path)
            if url.path == "/health":
                self._send(200, {"ranks": tp})
            elif url.path == "/decode":
                steps = int(parse_qs(url.query).get("steps", ["200"])[0])
                cmd.copy_(torch.tensor([RUN, steps], dtype=torch.int64))
                dist.broadcast(cmd, 0)
                dt = run(steps)
                self._send(200, {"steps": steps, "batch": a.batch, "seconds": dt, "ranks": tp,
                                 "tokens_per_s": steps * a.batch / dt})
            else:
                self._send(404, {})

    httpd = HTTPServer(("127.0.0.1", a.port), Handler)  # one request at a time: ranks stay in step
    print(f"tp decode server ready: {tp} ranks, port {a.port}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
