"""The few distributions the verdicts need, without importing scipy.stats.

``import scipy.stats`` costs about 2.8 s of CPU (every distribution it defines is built at import),
and every ``report``, ``compare``, ``explain`` and sweep paid it for four functions.  These are those
four, each equal to scipy's answer (tests/test_exact.py compares them on random and tied data):

- ``trim_mean``: scipy.stats.trim_mean's cut and mean, step for step;
- ``mann_whitney_p``: mannwhitneyu(method="exact")'s p, from the exact null distribution of U (the
  coefficients of a Gaussian binomial, counted in integers, so the p of one arrangement in C(n1+n2, n1)
  is that fraction rounded once);
- ``spearman``: spearmanr's rho and two-sided p (Student's t with n-2 degrees of freedom, from
  scipy.special, which is what scipy.stats uses);
- ``normal_cdf``, ``normal_isf``, ``normal_ppf``: the standard normal, from the standard library.
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

_NORMAL = NormalDist()


def trim_mean(a, proportion: float) -> float:
    """Mean of the 1-D ``a`` after cutting int(proportion * n) values from each end (nan with a NaN)."""
    import numpy as np

    a = np.asarray(a, dtype=float).reshape(-1)
    if np.isnan(a).any():
        return math.nan  # as scipy: a NaN is not trimmed away
    low = int(proportion * len(a))
    high = len(a) - low
    if low > high:
        raise ValueError("proportion too big")
    part = np.partition(a, (low, high - 1))
    return float(np.mean(part[low:high]))


@lru_cache(maxsize=256)
def u_tail(n1: int, n2: int):
    """tail[k] = P(U >= k) under "no difference", for k = 0 .. n1*n2 + 1, as floats.

    The number of arrangements with U = u is the coefficient of q^u in the Gaussian binomial
    [n1+n2 choose m]_q = prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i) (m <= n), built factor by factor in
    integers (numpy object arrays: exact at any size)."""
    import numpy as np

    m, n = sorted((n1, n2))
    top = m * n
    counts = np.zeros(top + 1, dtype=object)  # Python ints
    counts[0] = 1
    for i in range(1, m + 1):
        step = n + i
        if step <= top:
            counts[step:] = counts[step:] - counts[:top + 1 - step]  # times (1 - q^(n+i))
        pad = (-len(counts)) % i
        grid = np.concatenate([counts, np.zeros(pad, dtype=object)]).reshape(-1, i)
        counts = np.cumsum(grid, axis=0).reshape(-1)[:top + 1]  # over (1 - q^i): b[k] = a[k] + b[k-i]
    total = math.comb(m + n, m)
    tail = np.cumsum(counts[::-1])[::-1]
    out = np.array([int(c) / total for c in tail] + [0.0])
    out.flags.writeable = False  # cached and shared: a caller's in-place change would change every p
    return out


def mann_whitney_p(x, y, alternative: str):
    """Exact Wilcoxon-Mann-Whitney p of x against y along the last axis (``less``: x tends to be
    smaller; ``greater``; ``two-sided``); ties count half, as scipy counts them, with no correction
    to the exact distribution.  A float for 1-D input, else an array over the leading axes."""
    import numpy as np

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    batch = np.broadcast_shapes(x.shape[:-1], y.shape[:-1])
    x, y = np.broadcast_to(x, batch + x.shape[-1:]), np.broadcast_to(y, batch + y.shape[-1:])
    n1, n2 = x.shape[-1], y.shape[-1]
    if n1 == 0 or n2 == 0:
        raise ValueError("each sample needs at least one value")
    xi, yj = x[..., :, None], y[..., None, :]
    u1 = (xi > yj).sum(axis=(-2, -1)) + 0.5 * (xi == yj).sum(axis=(-2, -1))
    u2 = n1 * n2 - u1
    if alternative == "greater":
        u, factor = u1, 1.0
    elif alternative == "less":
        u, factor = u2, 1.0
    elif alternative == "two-sided":
        u, factor = np.maximum(u1, u2), 2.0
    else:
        raise ValueError(f"alternative must be less, greater or two-sided, not {alternative!r}")
    p = np.clip(factor * u_tail(n1, n2)[np.asarray(u, dtype=np.int64)], 0.0, 1.0)
    nan = np.isnan(x).any(axis=-1) | np.isnan(y).any(axis=-1)
    p = np.where(nan, np.nan, p)
    return float(p) if np.ndim(p) == 0 else p


def _average_ranks(v):
    import numpy as np

    v = np.asarray(v, dtype=float)
    less = (v[:, None] > v[None, :]).sum(axis=1)
    equal = (v[:, None] == v[None, :]).sum(axis=1)
    return less + (equal + 1) / 2.0


def spearman(x, y) -> tuple[float, float]:
    """Spearman's rho of two equal-length sequences and its two-sided p (nan, nan when either is
    constant), as scipy.stats.spearmanr gives them."""
    import numpy as np

    if np.isnan(np.asarray(x, dtype=float)).any() or np.isnan(np.asarray(y, dtype=float)).any():
        return math.nan, math.nan  # as scipy: nan_policy="propagate"
    rx, ry = _average_ranks(x), _average_ranks(y)
    if len(rx) != len(ry) or len(rx) < 2:
        raise ValueError("spearman needs two sequences of the same length, at least 2")
    if np.all(rx == rx[0]) or np.all(ry == ry[0]):
        return math.nan, math.nan
    rho = float(np.clip(np.corrcoef(rx, ry)[0, 1], -1.0, 1.0))
    dof = len(rx) - 2
    if dof <= 0:
        return rho, math.nan
    if abs(rho) == 1.0:
        return rho, 0.0
    from scipy.special import stdtr

    t = rho * math.sqrt(dof / ((rho + 1.0) * (1.0 - rho)))
    return rho, float(2.0 * stdtr(dof, -abs(t)))


def normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def normal_isf(tail: float) -> float:
    """z with P(Z > z) = tail."""
    return -_NORMAL.inv_cdf(tail)


def normal_ppf(q: float) -> float:
    return _NORMAL.inv_cdf(q)
