"""commdiag p2p beside cuda-samples' p2pBandwidthLatencyTest, value by value (ground truth).

    python3 benchmarks/p2p_reference.py P2P_JSON REF_OUTPUT

P2P_JSON: ``commdiag p2p --json``; REF_OUTPUT: p2pBandwidthLatencyTest's stdout.  Prints one
line per comparable value: ours (median, range, n), the reference's (one timing of 5 copies of
40M ints, or 100 copies of 16 B for latency), the ratio, and for P2P and local-copy bandwidth
whether ours is within 10% (the acceptance bar).  Through-host numbers differ in method (ours:
pinned D2H + H2D in 4 MiB chunks; the sample's P2P=Disabled: the driver's staged peer copy),
so they are shown beside each other without a bar.
"""

from __future__ import annotations

import json
import re
import sys

TITLES = {
    "Unidirectional P2P=Disabled Bandwidth Matrix (GB/s)": "uni_off",
    "Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)": "uni_on",
    "Bidirectional P2P=Disabled Bandwidth Matrix (GB/s)": "bi_off",
    "Bidirectional P2P=Enabled Bandwidth Matrix (GB/s)": "bi_on",
    "P2P=Disabled Latency Matrix (us)": "lat_off",
    "P2P=Enabled Latency (P2P Writes) Matrix (us)": "lat_on",
}
ROW = re.compile(r"^\s*(\d+)\s+((?:-?[\d.]+\s*)+)$")


def parse(text: str) -> dict[str, list[list[float]]]:
    """The sample's matrices by name; a latency block's first (GPU-timed) matrix only."""
    out: dict[str, list[list[float]]] = {}
    name = None
    for line in text.splitlines():
        title = line.strip()
        if title in TITLES:
            name = TITLES[title]
            out[name] = []
            continue
        if name is None:
            continue
        if line.strip().startswith("CPU") or not line.strip():
            if out[name]:
                name = None  # the CPU-timed latency matrix and anything after a blank line: not ours
            continue
        m = ROW.match(line)
        if m and not line.strip().startswith(("D\\D", "GPU")):
            out[name].append([float(v) for v in m.group(2).split()])
    return out


def _stat(s) -> str:
    if not s:
        return "-"
    return f"{s['median']:.2f} ({s['lo']:.2f}-{s['hi']:.2f}, n={s['n']})"


def rows(res: dict, ref: dict) -> list[tuple[str, str, float | None, bool]]:
    """(label, ours, reference, gated) per comparable value."""
    out = []
    for g in res["gpus"]:
        i = g["index"]
        on = ref.get("uni_on") or []
        if i < len(on):
            out.append((f"GPU{i} local copy GB/s", g.get("local"), on[i][i], True))
    for p in res["pairs"]:
        a, b = p["a"], p["b"]
        for key, mat, (x, y), gated in (("p2p_ab", "uni_on", (a, b), True), ("p2p_ba", "uni_on", (b, a), True),
                                        ("p2p_bidir", "bi_on", (a, b), True),
                                        ("host_ab", "uni_off", (a, b), False), ("host_ba", "uni_off", (b, a), False),
                                        ("host_bidir", "bi_off", (a, b), False),
                                        ("lat_p2p_ab", "lat_on", (a, b), False),
                                        ("lat_p2p_ba", "lat_on", (b, a), False),
                                        ("lat_host_ab", "lat_off", (a, b), False),
                                        ("lat_host_ba", "lat_off", (b, a), False)):
            m = ref.get(mat) or []
            val = m[x][y] if x < len(m) and y < len(m[x]) else None
            unit = "us" if key.startswith("lat") else "GB/s"
            out.append((f"{x}->{y} {key.rsplit('_', 1)[0]} {unit}", p.get(key), val, gated))
    return out


def main(argv: list[str]) -> int:
    res = json.load(open(argv[1]))
    ref = parse(open(argv[2]).read())
    if not ref:
        print("no matrix found in the reference output")
        return 1
    print(f"{'value':<28}{'commdiag p2p (median, range, n)':<36}{'reference':>10}{'ratio':>8}  within 10%")
    bad = 0
    for label, ours, theirs, gated in rows(res, ref):
        ratio = ours["median"] / theirs if ours and theirs else None
        verdict = "" if not gated or ratio is None else ("yes" if abs(ratio - 1) <= 0.10 else "NO")
        bad += verdict == "NO"
        print(f"{label:<28}{_stat(ours):<36}{'-' if theirs is None else f'{theirs:.2f}':>10}"
              f"{'-' if ratio is None else f'{ratio:.3f}':>8}  {verdict}")
    print(f"{bad} gated value(s) outside 10% of the reference" if bad else "every gated value within 10%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
