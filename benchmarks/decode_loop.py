"""A model-shaped single-GPU decode loop that prints its own tokens/s (the number commdiag ab reads,
like any user's benchmark).  TP=1: no all-reduce, so NCCL is not exercised by this loop; NCCL
settings can only matter through what they change at process start.

    python benchmarks/decode_loop.py [--hidden 4096] [--layers 16] [--batch 8] [--seconds 1.5]
"""

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=1.5)
    a = ap.parse_args()
    dev = torch.device("cuda")
    h, f = a.hidden, 4 * a.hidden
    layers = [(torch.randn(h, 3 * h, device=dev, dtype=torch.bfloat16) * 0.01,
               torch.randn(h, h, device=dev, dtype=torch.bfloat16) * 0.01,
               torch.randn(h, f, device=dev, dtype=torch.bfloat16) * 0.01,
               torch.randn(f, h, device=dev, dtype=torch.bfloat16) * 0.01) for _ in range(a.layers)]
    x = torch.randn(a.batch, h, device=dev, dtype=torch.bfloat16)

    @torch.no_grad()
    def step(x):
        for qkv, o, up, down in layers:  # attention projections and MLP of one token per sequence
            x = x + (x @ qkv)[:, :h] @ o
            x = x + torch.nn.functional.silu(x @ up) @ down
            x = torch.nn.functional.layer_norm(x, (h,))
        return x

    for _ in range(20):
        x = step(x)
    torch.cuda.synchronize()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        for _ in range(10):
            x = step(x)
        torch.cuda.synchronize()
        steps += 10
    dt = time.perf_counter() - t0
    print(f"decode tokens/s: {steps * a.batch / dt:.2f}")


if __name__ == "__main__":
    main()
