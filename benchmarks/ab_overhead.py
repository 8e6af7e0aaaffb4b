"""commdiag ab's own cost per launch, besides the user's command: a run of N launches of a tiny command
through runner.run_ab, against the same command run bare with subprocess in the same process, in
alternation.  Cost per launch = (ab's wall per launch) - (bare wall per run).  Target: <= 0.5 s.

    python benchmarks/ab_overhead.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from commdiag.ab import runner, spec as ab_spec  # noqa: E402

CMD = [sys.executable, "-c", "print('toks: 1')"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    s = ab_spec.resolve({"name": "overhead", "command": CMD, "rounds": a.rounds,
                         "metrics": [{"name": "toks", "regex": r"toks: (?P<value>[0-9.]+)", "better": "higher"}],
                         "configs": {"b": {}}})
    bare = []
    for _ in range(2 * a.rounds):
        t = time.perf_counter()
        subprocess.run(CMD, stdout=subprocess.DEVNULL, check=True)
        bare.append(time.perf_counter() - t)
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        runner.run_ab(s, run_dir=Path(d) / "run")
        total = time.perf_counter() - t
        run = runner.load(Path(d) / "run")
    walls = [l["wall_s"] for l in run["launches"]]
    n = len(walls)
    per = total / n
    cost = [w - statistics.median(bare) for w in walls]
    print(f"launches: {n} (ab) + {len(bare)} (bare subprocess), {sys.platform}, python {sys.version.split()[0]}")
    print(f"bare command: median {statistics.median(bare) * 1000:.0f} ms [{min(bare) * 1000:.0f}-{max(bare) * 1000:.0f}]")
    print(f"ab launch wall: median {statistics.median(walls) * 1000:.0f} ms [{min(walls) * 1000:.0f}-"
          f"{max(walls) * 1000:.0f}]; whole run {per * 1000:.0f} ms per launch incl. run.json writes")
    print(f"commdiag's cost per launch: median {statistics.median(cost) * 1000:.0f} ms "
          f"[{min(cost) * 1000:.0f}-{max(cost) * 1000:.0f}], whole-run {1000 * (per - statistics.median(bare)):.0f} ms "
          f"(target <= 500 ms): {'ok' if per - statistics.median(bare) <= 0.5 else 'OVER'}")


if __name__ == "__main__":
    main()
