"""Which node or link is slower than the rest, certified: the statistics of ``commdiag nodes``.

Pure functions over ``values[round][pair]``: each entry the launch value of one pair's all-reduce in
one round (the trimmed mean of ln(time) of its calls; every round is one fresh launch, and the order
of the pairs inside it is shuffled independently per round).

The test is a within-round randomization test.  Under "no node differs", the shuffled order makes
the pairs' values exchangeable inside each round, whatever the noise's shape (drift between rounds,
a slow first pair, heavy tails, two states): permuting the pair labels within every round gives the
exact null distribution of any statistic.  For node k the statistic is the sum over rounds of
(mean of the pairs that contain k) - (mean of the pairs that do not), after the pairs that contain
k are made ``min_effect`` faster: so a certified node is slower than the rest by more than
``min_effect`` (the boundary of that null is exchangeable again).  Links (one pair against the
others) are tested the same way.  p is the Monte Carlo permutation p, (1 + #{S* >= S}) / (B + 1),
which is a valid p for any B; Bonferroni over every node and link tested keeps the family-wise
error at ``alpha`` (1%) in all.  An A/A fleet names nobody with probability >= 99%.

With two nodes there is one pair and nothing to compare it with: the link is reported with its
spread, no node is named.  Slower only: a faster node is no alarm.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

ALPHA = 0.01
MIN_EFFECT = 0.03
DRAWS = 20000


@dataclass(frozen=True)
class Finding:
    """One node or link against the rest: its typical ratio and the certified verdict."""

    kind: str  # "node" or "link"
    name: str
    ratio: float  # exp(median over rounds of its within-round log difference): >1 slower
    p: float
    threshold: float
    slow: bool

    def to_json(self) -> dict:
        return {"kind": self.kind, "name": self.name, "ratio": round(self.ratio, 4), "p": self.p,
                "threshold": self.threshold, "slow": self.slow}


def pairs_of(n_nodes: int, ring: bool | None = None) -> list[tuple[int, int]]:
    """Every pair up to 8 nodes (28 pairs); ring neighbours beyond (n pairs, each node in two)."""
    if n_nodes < 2:
        return []
    if ring is None:
        ring = n_nodes > 8
    if ring and n_nodes > 2:
        return [tuple(sorted((i, (i + 1) % n_nodes))) for i in range(n_nodes)]
    return [(a, b) for a in range(n_nodes) for b in range(a + 1, n_nodes)]


def family(n_nodes: int, pairs: list[tuple[int, int]]) -> int:
    """Claims tested: every node (from 3 nodes) and every link (from 3 pairs)."""
    return (n_nodes if n_nodes >= 3 else 0) + (len(pairs) if len(pairs) >= 3 else 0)


def rounds_needed(n_nodes: int, pairs: list[tuple[int, int]], alpha: float = ALPHA, spare: int = 2) -> int:
    """The rounds at which the most extreme outcome reaches alpha/family, plus ``spare``.

    For one claim the most extreme outcome is the one where, in every round, the claim's pairs hold
    the largest values: its probability per round is 1 / C(P, m) (m pairs of P in the claim)."""
    claims = _masks(n_nodes, pairs)
    if not claims:
        return 3
    per_round = min(math.comb(len(pairs), sum(mask)) for _, _, mask in claims)
    level = alpha / len(claims)
    rounds = 1
    while float(per_round) ** -rounds > level:
        rounds += 1
    return rounds + spare


def _masks(n_nodes: int, pairs: list[tuple[int, int]]):
    claims = []
    if n_nodes >= 3:
        claims += [("node", k, [k in p for p in pairs]) for k in range(n_nodes)]
    if len(pairs) >= 3:
        claims += [("link", i, [j == i for j in range(len(pairs))]) for i in range(len(pairs))]
    return claims


def judge(values, n_nodes: int, pairs: list[tuple[int, int]], names: list[str], *,
          alpha: float = ALPHA, min_effect: float = MIN_EFFECT, draws: int = DRAWS, seed: int = 0) -> list[Finding]:
    """Every node and link against the rest (see the module docstring); rounds with a missing value
    (a failed launch) are dropped by the caller, never imputed."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    if v.ndim != 2 or v.shape[1] != len(pairs) or not np.isfinite(v).all():
        raise ValueError("values must be finite, one row per round and one column per pair")
    claims = _masks(n_nodes, pairs)
    if not claims or v.shape[0] == 0:
        return []
    level = alpha / len(claims)
    rng = np.random.default_rng(seed)
    # the same within-round permutations for every claim: each claim's test is exact on its own
    pairs_n = v.shape[1]
    if pairs_n <= 6:  # every ordering listed once (at most 720), a draw picks one per round
        orders = np.array(list(itertools.permutations(range(pairs_n))))
        perm = orders[rng.integers(0, len(orders), (draws, v.shape[0]))]
    else:
        perm = np.argsort(rng.random((draws, v.shape[0], pairs_n)), axis=2)
    permuted = np.take_along_axis(np.broadcast_to(v, perm.shape), perm, axis=2)
    # per draw, summed over rounds: each position's value, and how often each pair landed there
    value_sum = permuted.sum(axis=1)  # (draws, position)
    landed = np.eye(pairs_n)[perm].sum(axis=1)  # (draws, position, pair)
    shift = math.log1p(min_effect)
    found = []
    for kind, index, mask in claims:
        m = np.asarray(mask)
        # the statistic is a weighted sum: +1/|m| on the claim's pairs, -1/|not m| on the others
        w = np.where(m, 1.0 / m.sum(), -1.0 / (~m).sum())
        shifted = v - shift * m  # the claim's pairs made min_effect faster: H0 "at most min_effect slower"
        observed = float((shifted @ w).sum())
        # a permuted value keeps its own shift: the value from pair j moved with its -shift*m[j]
        null = value_sum @ w - shift * ((landed @ m) @ w)
        p = float((1 + np.count_nonzero(null >= observed - 1e-12)) / (draws + 1))
        ratio = float(np.exp(np.median(v @ w)))
        name = names[index] if kind == "node" else f"{names[pairs[index][0]]}-{names[pairs[index][1]]}"
        found.append(Finding(kind, name, ratio, p, level, p <= level))
    return found
