"""Time to a certified answer against screening-only time, from one finished run folder.

    python benchmarks/certify_cost.py RUN_DIR

Both numbers come from the same run: the reference is stage 1 (the interleaved trials, what
``--no-confirm`` stops after), the target adds stage 2 (fresh rounds of default and the claims).
Each stage's time is the sum of its launches' wall times (start, measuring, teardown; with
reuse_process each process counted once), so idle time between resumed calls does not count.
Target: ratio <= 1.3 for an nvlink2-shaped sweep on 2 GPUs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from commdiag.formats import results  # noqa: E402
from commdiag.analyse import verdict  # noqa: E402

TARGET = 1.3


def stage_wall(run: dict, stage: int) -> tuple[float, int]:
    seen, total, n = set(), 0.0, 0
    for l in run["launches"]:
        if int(l.get("stage", 1)) != stage or l.get("status") == "pending":
            continue
        n += 1
        if "process" in l:  # reuse_process: one process, several launches
            if l["process"] in seen:
                continue
            seen.add(l["process"])
            total += l.get("process_wall_s", l.get("wall_s", 0.0))
        else:
            total += l.get("wall_s", 0.0)
    return total, n


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip())
        return 2
    data = results.load_run(argv[0])
    run = data.run
    s1, n1 = stage_wall(run, 1)
    s2, n2 = stage_wall(run, 2)
    v = verdict.evaluate_run(data)
    print(f"run: {argv[0]}  ({run['spec']['name']}, {run.get('world_size')} ranks)")
    print(f"stage 1 (screening):    {n1:3d} launches, {s1:7.1f} s")
    print(f"stage 2 (confirmation): {n2:3d} launches, {s2:7.1f} s  ({v.family_size} claims, "
          f"{sum(lk['rounds'] for lk in (v.confirmation or {}).get('looks', []))} rounds)")
    ratio = (s1 + s2) / s1 if s1 else float("nan")
    print(f"time to a certified answer / screening-only time = {ratio:.2f} (target <= {TARGET}: "
          f"{'met' if ratio <= TARGET else 'NOT met'})")
    for c in v.certifications:
        print(f"  {c.claim.config} {c.claim.where}: {c.text}")
    for w in v.band_winners:
        print(f"  winner {w.mode} band {w.band}: {w.text}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
