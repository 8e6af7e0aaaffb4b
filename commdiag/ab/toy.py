"""A tiny stdlib HTTP "inference server" and its benchmark client, for trying ``commdiag ab`` on CPU
(ab/cpu-toy.yaml) and for its tests.  Not a model: the server's token rate is TOY_RATE (tokens/s,
from its environment, like an NCCL setting), times a per-start launch factor exp(N(0, TOY_NOISE)):
each fresh server lands in its own state, as real launches do.

    python -m commdiag.ab.toy server --port P [--mode ok|never-ready|crash|hang-on-stop]
    python -m commdiag.ab.toy client --port P [--requests N] [--tokens T] [--output-file F]

The client writes one JSON line in sglang.bench_serving's --output-file format (the fields of its
BenchmarkMetrics: output_throughput, median_itl_ms, ...) and prints its "Output token throughput"
line.  Throughput is computed from the service time the server reports, so CPU load on a shared
test machine does not blur the effect a test asks for.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sys
import time


def serve(port: int, mode: str) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # only what this side needs: starts fast

    rate = float(os.environ.get("TOY_RATE", "1000"))
    noise = float(os.environ.get("TOY_NOISE", "0.01"))
    factor = math.exp(random.SystemRandom().gauss(0.0, noise)) if noise > 0 else 1.0
    if mode == "hang-on-stop":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for k in sorted(os.environ):  # NCCL-style init lines, in the format NCCL prints them (when asked)
        if k.startswith("NCCL_") and os.environ.get("NCCL_DEBUG") == "INFO" and os.environ.get("TOY_NCCL_LOG"):
            print(f"toyhost:{os.getpid()}:{os.getpid()} [0] NCCL INFO {k} set by environment to {os.environ[k]}",
                  flush=True)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_GET(self):
            if self.path.startswith("/health"):
                self.send_response(503 if mode == "never-ready" else 200)
                self.end_headers()
                return
            if self.path.startswith("/generate"):
                if mode == "crash":
                    os._exit(3)
                n = int(self.path.partition("n=")[2] or 16)
                service = n / (rate * factor)
                time.sleep(min(service, 0.002))
                body = json.dumps({"tokens": n, "service_s": service}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(404)
            self.end_headers()

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"toy server ready on port {port}", flush=True)
    try:
        httpd.serve_forever(poll_interval=0.05)
    except KeyboardInterrupt:
        pass


def client(port: int, requests: int, tokens: int, output_file: str | None) -> int:
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    services, t0 = [], time.perf_counter()
    for _ in range(requests):
        with opener.open(f"http://127.0.0.1:{port}/generate?n={tokens}", timeout=10) as r:
            services.append(json.loads(r.read())["service_s"])
    dur = sum(services)
    itl = sorted(s / tokens * 1000 for s in services)
    result = {"backend": "toy", "dataset_name": "random", "request_rate": float("inf"), "duration": dur,
              "completed": requests, "total_input": 0, "total_output": requests * tokens,
              "request_throughput": requests / dur, "input_throughput": 0.0,
              "output_throughput": requests * tokens / dur, "total_throughput": requests * tokens / dur,
              "median_itl_ms": itl[len(itl) // 2], "mean_itl_ms": sum(itl) / len(itl),
              "median_e2e_latency_ms": sorted(services)[len(services) // 2] * 1000,
              "wall_s": time.perf_counter() - t0}
    if output_file:
        with open(output_file, "a") as f:
            f.write(json.dumps(result) + "\n")
    print(f"{'Output token throughput (tok/s):':<40} {result['output_throughput']:.2f}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m commdiag.ab.toy")
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("server")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--mode", default="ok", choices=("ok", "never-ready", "crash", "hang-on-stop"))
    c = sub.add_parser("client")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--requests", type=int, default=8)
    c.add_argument("--tokens", type=int, default=32)
    c.add_argument("--output-file")
    a = ap.parse_args(argv)
    if a.what == "server":
        serve(a.port, a.mode)
        return 0
    return client(a.port, a.requests, a.tokens, a.output_file)


if __name__ == "__main__":
    sys.exit(main())
