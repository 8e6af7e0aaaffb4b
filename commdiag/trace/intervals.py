"""Time intervals on the GPU: union, overlap and difference of sorted, merged ``(start, end)`` lists.

Pure functions: what the time split of a step is made of (analysis.py).  A union is a sorted list of
disjoint intervals; lengths are in the trace's microseconds.
"""

from __future__ import annotations


def union(intervals) -> list[tuple[float, float]]:
    """The merged, sorted union of ``(start, end)`` pairs (empty ones dropped)."""
    out: list[list[float]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(u) -> float:
    return sum(e - s for s, e in u)


def overlap(a, b) -> float:
    """The length of ``a`` ∩ ``b`` (both unions)."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            total += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def minus(a, b) -> float:
    """The length of ``a`` \\ ``b`` (both unions)."""
    return length(a) - overlap(a, b)


def difference(a, b) -> list[tuple[float, float]]:
    """The union ``a`` less the union ``b``, as a union (one pass over both)."""
    out, j = [], 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k, t = j, s
        while k < len(b) and b[k][0] < e:
            if b[k][0] > t:
                out.append((t, b[k][0]))
            t = max(t, b[k][1])
            k += 1
        if t < e:
            out.append((t, e))
    return out


def gaps(u, start: float, end: float) -> list[tuple[float, float]]:
    """The parts of [start, end] that ``u`` does not cover."""
    out, t = [], start
    for s, e in u:
        if s > t:
            out.append((t, min(s, end)))
        t = max(t, e)
        if t >= end:
            break
    if t < end:
        out.append((t, end))
    return [g for g in out if g[1] > g[0]]
