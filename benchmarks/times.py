"""How long each shipped spec takes: the one table (docs/times.md) that the README, ``--help`` and the
specs' comments quote, so that a time stated anywhere is a time measured once, here.

    .venv/bin/python benchmarks/times.py [--runs 3] [--only cpu-smoke,cpu-aa] [--no-write]

The CPU rows are measured: each spec runs ``--runs`` times as shipped (a fresh ``commdiag`` process,
its own run folder in a temporary directory), alternated so that no spec always runs on a warmer
machine.  A row gives the median wall time (the commdiag process, start to exit) with the min-max over
the runs, the launches per run (stage 2's rounds depend on what screening nominates) and the load
average around the runs.  The GPU rows are not measured here (no GPU on the CPU machine): each quotes
benchmarks/README.md with its date and machine, or says it is an estimate and from what.

It rewrites docs/times.md between its markers (a run with ``--only`` keeps the other rows' cells);
tests/test_first_use.py checks that the README, ``commdiag --help`` and every spec's comment state
exactly the table's time, so a refreshed table shows every place that needs the new number.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "docs" / "times.md"
BEGIN, END = "<!-- times.py: begin -->", "<!-- times.py: end -->"
HEADER = "| spec | command | time | spread, launches | measured |"

# spec -> the command as a user types it (the run folder goes to a temporary --out)
CPU = {
    "cpu-smoke": ["sweep", "sweeps/cpu-smoke.yaml"],
    "cpu-aa": ["sweep", "sweeps/cpu-aa.yaml"],
    "cpu-step": ["step", "sweeps/cpu-step.yaml"],
    "ab/cpu-toy": ["ab", "ab/cpu-toy.yaml"],
}

# The GPU rows: (spec, command, time, spread and launches, where it comes from).  Launch times are the
# recorded ones (benchmarks/README.md); an estimate says so and from what.
GPU = [
    ("nvlink2-aa", "commdiag sweep sweeps/nvlink2-aa.yaml", "about 2 min",
     "9 screening + at most 39 stage-2 launches (13 rounds); estimate",
     "estimate (`--dry-run`, measure/eta.py): 1.55 s a forked launch (1x H200, benchmarks/README.md) + "
     "every all-reduce of 25 ms a size and mode, counted at 10 GB/s (NVLink is faster); with launch: torchrun "
     "8.6 min (the launches recorded 2026-11-30 on 2x H200, 250 ms and both call paths: 9.4 min)"),
    ("nvlink2", "commdiag sweep sweeps/nvlink2.yaml", "about 3.5 min",
     "24 screening + at most 52 stage-2 launches (13 rounds); estimate",
     "estimate (`--dry-run`, measure/eta.py): 1.55 s a forked launch (1x H200, benchmarks/README.md) + "
     "every all-reduce of 25 ms a size and mode, counted at 10 GB/s (NVLink is faster); with launch: torchrun "
     "13.8 min (the launches recorded 2026-11-30 on 2x H200, 250 ms and both call paths: 9-15 min)"),
    ("pcie8", "commdiag sweep sweeps/pcie8.yaml", "7-9 min",
     "81 screening + at most 70 stage-2 launches (14 rounds); estimate",
     "estimate from measured components (benchmarks/pcie8_estimate.py): 1.55 s a forked launch (1x "
     "H200), 1.4-2.7 s of measuring a screening launch (every all-reduce of 25 ms a size and mode, counted) "
     "at an assumed 25-10 GB/s PCIe bus, stage 2's most launches; launch: torchrun 27-30 min; not run "
     "yet on an 8-GPU box"),
    ("step-moe-tp2", "commdiag step sweeps/step-moe-tp2.yaml", "15-20 min",
     "estimate; decode only (`--set 'sizes.tokens=[1,2,3]' --set trials=2`): 4.1 min, 16 launches",
     "decode only measured on 2x H200 (benchmarks/README.md, 2026-11-30); as shipped the 256-token "
     "size runs all 256 experts, about 1 min a launch: estimate"),
    ("step-moe-tp8", "commdiag step sweeps/step-moe-tp8.yaml", "10-15 min",
     "estimate", "not run yet (no 8-GPU machine): estimate from the TP=2 run"),
    ("step-dense70b-tp2", "commdiag step sweeps/step-dense70b-tp2.yaml", "6-8 min",
     "estimate", "not run yet: estimate from the MoE run on 2x H200"),
    ("step-dense70b-tp8", "commdiag step sweeps/step-dense70b-tp8.yaml", "6-10 min",
     "estimate", "not run yet: estimate from the MoE run"),
    ("ab/sglang-seed", "commdiag ab ab/sglang-seed.yaml", "22 x (server start + benchmark)",
     "22 launches (11 rounds x 2 arms)", "depends on your server, model and benchmark"),
]


def short(seconds: float) -> str:
    """The time cell: whole seconds under 100 s, else minutes to one decimal."""
    return f"{seconds:.0f} s" if seconds < 100 else f"{seconds / 60:.1f} min"


def one_run(cmd: list[str], out: Path) -> tuple[float, int]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "commdiag.cli", *cmd, "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    run = json.loads((out / "run.json").read_text())
    return wall, len(run.get("launches", []))


def measure(names: list[str], runs: int) -> dict[str, tuple[str, str, str]]:
    """spec -> (time, spread and launches, measured) for each CPU spec in ``names``."""
    walls: dict[str, list[float]] = {n: [] for n in names}
    launches: dict[str, list[int]] = {n: [] for n in names}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="commdiag-times-") as tmp:
        for r in range(runs):
            for name in (names if r % 2 == 0 else names[::-1]):
                wall, n = one_run(CPU[name], Path(tmp) / f"{name.replace('/', '-')}-{r}")
                walls[name].append(wall)
                launches[name].append(n)
                loads.append(os.getloadavg()[0])
                print(f"{name} run {r + 1}: {wall:.1f} s, {n} launches", file=sys.stderr)
    machine = f"{os.cpu_count()} cores, {platform.machine()}, load {min(loads):.1f}-{max(loads):.1f}"
    day = datetime.date.today().isoformat()
    rows = {}
    for name in names:
        w, n = walls[name], launches[name]
        ln = f"{min(n)}" if min(n) == max(n) else f"{min(n)}-{max(n)}"
        rows[name] = (short(statistics.median(w)), f"{min(w):.1f}-{max(w):.1f} s over {len(w)} runs, {ln} launches",
                      f"measured {day} by benchmarks/times.py ({machine})")
    return rows


def read_rows(text: str) -> dict[str, list[str]]:
    """The table's rows: spec -> its five cells (the spec's name without backticks)."""
    rows = {}
    for line in text.split(BEGIN, 1)[-1].split(END, 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells
    return rows


def render(rows: dict[str, list[str]]) -> str:
    lines = [HEADER, "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows.values()]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default=",".join(CPU), help="comma-separated CPU specs to measure")
    ap.add_argument("--no-write", action="store_true", help="print the table, leave docs/times.md")
    a = ap.parse_args()
    names = [n for n in a.only.split(",") if n]
    unknown = [n for n in names if n not in CPU]
    if unknown:
        ap.error(f"not a CPU spec here: {', '.join(unknown)} (one of {', '.join(CPU)})")
    text = TABLE.read_text()
    old = read_rows(text)
    new = measure(names, a.runs)
    rows = {}
    for name, cmd in CPU.items():
        if name in new:
            rows[name] = [f"`{name}`", f"`commdiag {' '.join(cmd)}`", *new[name]]
        elif name in old:
            rows[name] = old[name]
    for spec, cmd, t, spread, where in GPU:
        rows[spec] = [f"`{spec}`", f"`{cmd}`", t, spread, where]
    table = render(rows)
    print(table)
    if not a.no_write:
        head, rest = text.split(BEGIN, 1)
        TABLE.write_text(head + BEGIN + "\n" + table + "\n" + END + rest.split(END, 1)[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
