"""One rank's synthetic tensor-parallel step (``commdiag step``), timed three ways.

Why: a faster all-reduce only matters in proportion to its share of a step.  The
step here runs, per layer, the GEMMs a TP-sharded layer runs on one rank (stepspec.py
gives the shapes) and its two all-reduces at their true size (tokens x hidden), so
the NCCL settings under test act on the same calls, interleaved with the same
compute, as in a serving framework's decode step.

Series (``via``), each timed per size (tokens) and mode:

* ``step``: the whole step: compute and all-reduces.  Verdicts are about this one.
* ``step-compute``: the same step with the all-reduces removed.  ``1 - compute/step``
  is the all-reduces' share of the step: what removing communication would save.
* ``step-comm``: the all-reduces alone (2 per layer, same sizes, back to back).

Modes: ``graph`` captures the whole step in one CUDA graph and replays it (decode
with CUDA graphs); ``eager`` calls it op by op (the verify/prefill path that cannot
use graphs).  On gloo (CPU) only eager, timed by the wall clock.  A sample is one
step, in microseconds; the launch folder's result.json has the same shape as a
sweep's, so summaries, verdicts and confirmation are the sweep's own.
"""

from __future__ import annotations

import math
import time

from ..formats.stepspec import StepModel

SERIES = ("step", "step-compute", "step-comm")


def method_text(spec) -> dict:
    m = StepModel(**spec.model)
    shape = (f"{m.kind} layer: hidden {m.hidden}, heads {m.heads} (KV {m.kv_heads}, head_dim {m.head_dim}), "
             f"context {m.context}, " + (f"intermediate {m.intermediate}" if m.kind == "dense" else
                                         f"{m.experts} experts top-{m.top_k}, expert_intermediate "
                                         f"{m.expert_intermediate}, shared {m.shared_experts}")
             + f"; {m.layers} layers; TP = world size")
    out = {"step": ("a sample is one step of the synthetic TP model (" + shape + "): per layer QKV, attention over "
                    "the KV cache, output projection, all-reduce, MLP/MoE, all-reduce (tokens x hidden bytes each)"),
           "series": "step = compute + all-reduces; step-compute = all-reduces removed; step-comm = the all-reduces "
                     "alone; comm share = 1 - step-compute / step"}
    if spec.backend == "gloo":
        out["eager"] = "each step's wall time on a monotonic clock (gloo, CPU)"
    else:
        if "graph" in spec.modes:
            out["graph"] = (f"the whole step captured in one CUDA graph; {spec.iters} replays back to back on a "
                            "side stream, a CUDA event between replays")
        if "eager" in spec.modes:
            out["eager"] = f"{spec.iters} steps called op by op on the current stream, a CUDA event between steps"
    return out


class Weights:
    """One layer's weights on this rank (the TP shard) and its KV cache."""

    def __init__(self, torch, m: StepModel, tp: int, dtype, device, n_experts: int):
        def w(*shape):
            return (torch.randn(*shape, dtype=torch.float32, device=device) * 0.02).to(dtype)

        nq, nkv, hd = m.q_heads(tp), m.kv_heads_rank(tp), m.head_dim
        self.qkv = w(m.hidden, (nq + 2 * nkv) * hd)
        self.o = w(nq * hd, m.hidden)
        self.k_cache = w(1, nkv, m.context, hd)
        self.v_cache = w(1, nkv, m.context, hd)
        if m.kind == "dense":
            self.gate_up = w(m.hidden, 2 * (m.intermediate // tp))
            self.down = w(m.intermediate // tp, m.hidden)
        else:
            ei = m.expert_intermediate // tp
            self.router = w(m.hidden, m.experts)
            self.e_gate_up = w(n_experts, m.hidden, 2 * ei)
            self.e_down = w(n_experts, ei, m.hidden)
            if m.shared_experts:
                self.gate_up = w(m.hidden, 2 * ei * m.shared_experts)
                self.down = w(ei * m.shared_experts, m.hidden)


class Step:
    """The step's callables for one token count: full, compute only, all-reduces only."""

    def __init__(self, torch, F, m: StepModel, tp: int, layers: list[Weights], tokens: int, dtype, device, op_for):
        self.torch, self.F, self.m, self.tp, self.layers, self.T = torch, F, m, tp, layers, tokens
        self.x = torch.randn(tokens, m.hidden, dtype=torch.float32, device=device).to(dtype)
        self.ar = [torch.zeros(tokens, m.hidden, dtype=dtype, device=device) for _ in range(2)]
        self.op_for = op_for
        if m.kind == "moe":
            n = m.active_experts(tokens)
            per = math.ceil(tokens * m.top_k / n)
            # token i of expert e: a static gather (graph-capturable) standing in for the router's permutation
            self.n_active, self.per_expert = n, per
            self.route = torch.arange(n * per, device=device) % tokens

    def _attn(self, w: Weights, h):
        m, tp, T = self.m, self.tp, self.T
        nq, nkv, hd = m.q_heads(tp), m.kv_heads_rank(tp), m.head_dim
        qkv = h @ w.qkv
        q = qkv[:, : nq * hd].reshape(1, T, nq, hd).transpose(1, 2)
        a = self.F.scaled_dot_product_attention(q, w.k_cache, w.v_cache, enable_gqa=nq != nkv)
        return a.transpose(1, 2).reshape(T, nq * hd) @ w.o

    def _mlp(self, w: Weights, h):
        F, m = self.F, self.m
        out = None
        if m.kind == "moe":
            logits = h @ w.router
            self.torch.topk(logits, m.top_k, dim=-1)  # the router's work; the assignment is static
            n, per = self.n_active, self.per_expert
            xe = h.index_select(0, self.route).view(n, per, m.hidden)
            gu = self.torch.bmm(xe, w.e_gate_up[:n])
            g, u = gu.chunk(2, dim=-1)
            ye = self.torch.bmm(F.silu(g) * u, w.e_down[:n])
            out = self.torch.zeros_like(h).index_add_(0, self.route, ye.reshape(n * per, m.hidden))
            if not m.shared_experts:
                return out
        g, u = (h @ w.gate_up).chunk(2, dim=-1)
        dense = (F.silu(g) * u) @ w.down
        return dense if out is None else out + dense

    def _norm(self, x):
        return x * self.torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)

    def full(self, comm: bool = True):
        x = self.x
        ar0, ar1 = self.op_for(self.ar[0]), self.op_for(self.ar[1])
        for i in range(self.m.layers):
            w = self.layers[i % len(self.layers)]
            self.ar[0].copy_(self._attn(w, self._norm(x)))
            if comm:
                ar0()
            x = x + self.ar[0]
            self.ar[1].copy_(self._mlp(w, self._norm(x)))
            if comm:
                ar1()
            x = x + self.ar[1]
        return x

    def compute(self):
        return self.full(comm=False)

    def comm(self):
        ar0, ar1 = self.op_for(self.ar[0]), self.op_for(self.ar[1])
        for _ in range(self.m.layers):
            ar0()
            ar1()


def _graph(torch, fn):
    """Capture ``fn`` once warmed up outside capture; returns (graph, side stream)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        fn()
    torch.cuda.synchronize()
    return g, stream


def _time_cuda(torch, fn, stream, warmup: int, iters: int) -> list[float]:
    with torch.cuda.stream(stream):
        for _ in range(max(1, warmup)):
            fn()
        stream.synchronize()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
        events[0].record(stream)
        for i in range(iters):
            fn()
            events[i + 1].record(stream)
    stream.synchronize()
    return [events[i].elapsed_time(events[i + 1]) * 1000.0 for i in range(iters)]


def _time_wall(dist, fn, warmup: int, iters: int) -> list[float]:
    for _ in range(max(1, warmup)):
        fn()
    dist.barrier()
    clock, out = time.perf_counter_ns, []
    for _ in range(iters):
        t0 = clock()
        fn()
        out.append((clock() - t0) / 1000.0)
    return out


def measure(torch, dist, plan, path, agree, dtype, device, rank, world, backend, info) -> dict:
    """Every size (tokens), series and mode of one launch; the sweep's result shape (via = series)."""
    from . import worker
    import torch.nn.functional as F

    m = StepModel(**plan["model"])
    tokens = {int(k): int(v) for k, v in plan["tokens"].items()}
    vias = [v for v in plan.get("vias", SERIES) if v in SERIES]
    max_tokens = max(tokens[s] for s in plan["sizes"])
    elem = torch.tensor([], dtype=dtype).element_size()
    n_experts = m.active_experts(max_tokens) if m.kind == "moe" else 0
    torch.manual_seed(1234 + rank)
    t0 = time.monotonic()
    layers = [Weights(torch, m, world, dtype, device, n_experts)
              for _ in range(m.distinct_layers(world, elem, max_tokens))]
    info["step_build_s"] = round(time.monotonic() - t0, 3)
    info["step_distinct_layers"] = len(layers)
    wrong = {v: {} for v in vias}
    samples = {v: {mode: {} for mode in plan["modes"]} for v in vias}
    batches = {v: {mode: {} for mode in plan["modes"]} for v in vias}
    cuda = backend == "nccl"
    t_measure = time.monotonic()
    with torch.no_grad():
        for size_bytes in plan["sizes"]:
            key = str(size_bytes)
            wrong["step"][key] = worker._check(torch, path, size_bytes // elem, dtype, device, rank, world, plan)
            step = Step(torch, F, m, world, layers, tokens[size_bytes], dtype, device, path.op)
            fns = {"step": step.full, "step-compute": step.compute, "step-comm": step.comm}
            for via in vias:
                for mode in plan["modes"]:
                    dist.barrier()
                    if not cuda:
                        times = _time_wall(dist, fns[via], plan["warmup"], plan["iters"])
                    elif mode == "graph":
                        g, stream = _graph(torch, fns[via])
                        times = _time_cuda(torch, g.replay, stream, plan["warmup"], plan["iters"])
                        del g
                    else:
                        times = _time_cuda(torch, fns[via], torch.cuda.current_stream(), plan["warmup"], plan["iters"])
                    samples[via][mode][key], batches[via][mode][key] = times, 1
            del step
    info["measure_s"] = round(time.monotonic() - t_measure, 3)
    return {**info, "wrong": wrong, "samples": samples, "enqueue_us": {}, "batch": batches}
