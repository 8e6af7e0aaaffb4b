"""How much does `commdiag check-env` cost at the top of a worker?  Its start time vs a bare interpreter's.

Measured in one run, interleaved (bare, check-env, API, bare, ...) so machine drift hits all three alike;
reports the median of N starts each and the ratios.  Usage:

    python benchmarks/check_env_startup.py [-n 30] > benchmarks/check_env_startup.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

CASES = {
    "bare: python -c pass": [sys.executable, "-c", "pass"],
    "commdiag check-env (CLI)": [sys.executable, "-m", "commdiag.cli", "check-env"],
    "python -c 'import commdiag; commdiag.check_env()' (API)":
        [sys.executable, "-c", "import commdiag; commdiag.check_env()"],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=30)
    n = ap.parse_args().n
    times: dict[str, list[float]] = {k: [] for k in CASES}
    for _ in range(n):
        for name, argv in CASES.items():
            t0 = time.perf_counter()
            cp = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
            times[name].append(time.perf_counter() - t0)
            if cp.returncode not in (0, 1):  # 1: check-env found a mismatch, still a full run; else it broke
                sys.exit(f"{name} failed with exit {cp.returncode}: {cp.stderr.decode()[-500:]}")
    bare = statistics.median(times["bare: python -c pass"])
    print(f"# check-env start-up cost, {n} starts each, interleaved")
    print(f"# python {platform.python_version()} {sys.executable}; {platform.platform()}; "
          f"{os.cpu_count()} CPUs; console script: {shutil.which('commdiag')}")
    for name, ts in times.items():
        med = statistics.median(ts)
        q = statistics.quantiles(ts, n=10)
        print(f"{name:58} median {med * 1000:7.1f} ms  p10-p90 {q[0] * 1000:6.1f}-{q[-1] * 1000:6.1f} ms  "
              f"ratio to bare {med / bare:5.2f}")


if __name__ == "__main__":
    main()
