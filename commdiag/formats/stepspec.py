"""The ``model:`` block of a step spec (``commdiag step``): the shape of one tensor-parallel layer.

A step spec is a sweep spec plus ``model``.  Everything else (configs, grid, trials,
interleaving, bands, confirmation) means what it means for ``sweep``; the sizes are
token counts, and each all-reduce of the step is ``tokens x hidden x dtype`` bytes per
rank, which is exactly what ``sizes.tokens`` with ``sizes.hidden`` gives a sweep.

The layer is what a TP-sharded transformer layer runs per rank (Megatron/vLLM layout):
QKV projection (column-parallel), attention over a KV cache of ``context`` tokens,
output projection (row-parallel) -> all-reduce, then the MLP (dense: gate/up
column-parallel and down row-parallel; MoE: router, the active experts' gate/up and
down with each expert's intermediate split over TP, plus shared experts) -> all-reduce.
The TP degree is the world size.  What is not modelled (MLA's low-rank projections,
norms' fused kernels, sampling, the LM head) is listed in docs/step.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..errors import SpecError, brief

KINDS = ("dense", "moe")
# key -> (required for kinds, default)
_KEYS = {
    "kind": (KINDS, None),
    "hidden": (KINDS, None),
    "heads": (KINDS, None),
    "kv_heads": ((), None),          # default: heads (no GQA)
    "head_dim": ((), None),          # default: hidden // heads
    "layers": (KINDS, None),
    "context": ((), 4096),           # KV-cache tokens each decode token attends to
    "intermediate": (("dense",), None),
    "experts": (("moe",), None),
    "top_k": (("moe",), None),
    "expert_intermediate": (("moe",), None),
    "shared_experts": ((), 0),
    "weight_pool_gib": ((), 8),      # per rank: distinct layer weights up to this, then reused
}
LIMIT = 1 << 20  # any one dimension: far above real models, low enough to catch a typo


@dataclass(frozen=True)
class StepModel:
    kind: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    context: int
    intermediate: int
    experts: int
    top_k: int
    expert_intermediate: int
    shared_experts: int
    weight_pool_gib: float

    def to_json(self) -> dict:
        return asdict(self)

    # Per-rank shapes under TP degree ``tp``.
    def q_heads(self, tp: int) -> int:
        return self.heads // tp

    def kv_heads_rank(self, tp: int) -> int:
        """KV heads per rank: split when there are at least tp of them, else replicated (one per rank)."""
        return max(1, self.kv_heads // tp)

    def active_experts(self, tokens: int) -> int:
        """Distinct experts a step of ``tokens`` tokens runs: every routed token-expert pair on its own
        expert until all experts are busy (the upper bound; a real router may repeat experts)."""
        return min(self.experts, tokens * self.top_k)

    def layer_weight_bytes(self, tp: int, elem: int, max_tokens: int) -> int:
        hd = self.head_dim
        attn = self.hidden * (self.q_heads(tp) + 2 * self.kv_heads_rank(tp)) * hd + self.q_heads(tp) * hd * self.hidden
        if self.kind == "dense":
            mlp = 3 * self.hidden * (self.intermediate // tp)
        else:
            per_expert = 3 * self.hidden * (self.expert_intermediate // tp)
            mlp = (self.hidden * self.experts + per_expert * self.active_experts(max_tokens)
                   + per_expert * self.shared_experts)
        kv = 2 * self.context * self.kv_heads_rank(tp) * hd
        return (attn + mlp + kv) * elem

    def distinct_layers(self, tp: int, elem: int, max_tokens: int) -> int:
        """How many layers get their own weights within ``weight_pool_gib``; the rest reuse them in turn."""
        per = self.layer_weight_bytes(tp, elem, max_tokens)
        return max(1, min(self.layers, int(self.weight_pool_gib * (1 << 30) // max(per, 1))))


def _int(path, fld, v, lo=1, hi=LIMIT) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise SpecError(path, fld, f"{brief(v)} must be an integer {lo}..{hi}")
    return v


def resolve_model(path, raw, *, tp: int | None, tokens: list[int]) -> StepModel:
    """Validate ``model:``; ``tp`` is the world size when the spec fixes it (nproc_per_node x nnodes)."""
    if not isinstance(raw, dict):
        raise SpecError(path, "model", "must be a mapping (kind, hidden, heads, layers, ...; docs/step.md)")
    for key in raw:
        if key not in _KEYS:
            raise SpecError(path, f"model.{key}", f"unknown key (allowed: {', '.join(_KEYS)})")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise SpecError(path, "model.kind", f"{brief(kind)} is not one of {', '.join(KINDS)}")
    for key, (needed, _) in _KEYS.items():
        if kind in needed and raw.get(key) is None:
            raise SpecError(path, f"model.{key}", f"required for kind: {kind}")
    v = {k: raw.get(k, d) for k, (_, d) in _KEYS.items()}
    hidden = _int(path, "model.hidden", v["hidden"])
    heads = _int(path, "model.heads", v["heads"])
    kv_heads = _int(path, "model.kv_heads", heads if v["kv_heads"] is None else v["kv_heads"], hi=heads)
    if heads % kv_heads:
        raise SpecError(path, "model.kv_heads", f"{kv_heads} must divide heads ({heads})")
    head_dim = v["head_dim"]
    if head_dim is None:
        if hidden % heads:
            raise SpecError(path, "model.head_dim", f"required: hidden ({hidden}) is not a multiple of heads ({heads})")
        head_dim = hidden // heads
    head_dim = _int(path, "model.head_dim", head_dim, hi=4096)
    layers = _int(path, "model.layers", v["layers"], hi=1000)
    context = _int(path, "model.context", v["context"], lo=1)
    intermediate = experts = top_k = expert_inter = 0
    if kind == "dense":
        intermediate = _int(path, "model.intermediate", v["intermediate"])
    else:
        experts = _int(path, "model.experts", v["experts"], hi=4096)
        top_k = _int(path, "model.top_k", v["top_k"], hi=experts)
        expert_inter = _int(path, "model.expert_intermediate", v["expert_intermediate"])
    shared = _int(path, "model.shared_experts", v["shared_experts"], lo=0, hi=64)
    if shared and kind != "moe":
        raise SpecError(path, "model.shared_experts", "only for kind: moe")
    pool = v["weight_pool_gib"]
    if isinstance(pool, bool) or not isinstance(pool, (int, float)) or not 0 < pool <= 1024 or math.isnan(pool):
        raise SpecError(path, "model.weight_pool_gib", f"{brief(pool)} must be a number of GiB in (0, 1024]")
    model = StepModel(kind, hidden, heads, kv_heads, head_dim, layers, context, intermediate, experts, top_k,
                      expert_inter, shared, float(pool))
    if tp is not None:
        check_tp(path, model, tp)
    return model


def check_tp(path, model: StepModel, tp: int) -> None:
    """Every sharded dimension must split evenly over the TP degree (the world size)."""
    if model.heads % tp:
        raise SpecError(path, "model.heads", f"{model.heads} heads do not split over TP={tp} ranks")
    if model.kv_heads % tp and tp % model.kv_heads:
        raise SpecError(path, "model.kv_heads", f"{model.kv_heads} KV heads neither split over nor divide TP={tp}")
    for key in ("intermediate", "expert_intermediate"):
        n = getattr(model, key)
        if n and n % tp:
            raise SpecError(path, f"model.{key}", f"{n} does not split over TP={tp} ranks")
