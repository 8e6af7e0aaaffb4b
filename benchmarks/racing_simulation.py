"""How often racing (commdiag/analyse/racing.py) drops a winner, and how many launches it saves: seeded
simulation through the shipped decision function.

Each simulated run is shaped like sweeps/pcie8.yaml: default + 26 configs, 15 sizes (1-8192 tokens),
bands decode (1-64) and prefill (256+), modes graph and eager, 3 screening trials in the shipped launch
order (formats.spec.launch_order).  Config 1 is the winner to protect, shaped like LL on a PCIe box:
10% faster in decode, 50% slower in prefill (so only its decode band keeps it).  Configs 2-9 are real
losers, 2x slower everywhere; the rest are A/A twins of default.  A launch's noise (one draw shared by
all its sizes and both modes: the worst case for an every-band, every-mode rule) follows the launch-noise
models of tests/test_certify_simulation.py, plus the position effects (a launch's place in its round).
After trials 1 and 2 the sweep's own path runs: analyse.screening.screen on the stage-1 values so far,
then racing.decide; dropped configs get no further launches.

What is counted: runs in which the winner is dropped (an upper bound on "a config that would have been
certified is dropped": the winner is certified in at most all runs), and the share of the losers and
of all screening launches dropped.

    .venv/bin/python benchmarks/racing_simulation.py [RUNS]      # default 2000 runs per model
"""

from __future__ import annotations

import math
import sys
import time
from types import SimpleNamespace

import numpy as np

from commdiag.analyse import racing, screening
from commdiag.analyse.stats import DEFAULT, LaunchValue
from commdiag.formats.spec import launch_order

TOKENS = [1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
BANDS = {"decode": [1, 64], "prefill": [256, None]}
MODES = ("graph", "eager")
TRIALS = 3
CONFIGS = 27
WINNER, LOSERS = 1, range(2, 10)
PER_SIZE_SD = 0.005

MODELS = ["lognormal3", "lognormal10", "two-state-gpu-eager", "two-state-cpu", "rare-slow", "t3",
          "first-in-round+10%", "first-in-round-10%", "alternating10%", "linear-position5%", "drift5"]


def launch_noise(model: str, rng) -> float:
    """ln-scale noise of one launch (shared by its sizes and modes); the verdict simulation's models."""
    if model in ("lognormal3", "drift5"):
        return rng.normal(0, 0.03)
    if model == "lognormal10":
        return rng.normal(0, 0.10)
    if model == "two-state-gpu-eager":  # 60% of launches 1.7x slower (2x H200 eager, 14 KB)
        return (math.log(1.7) if rng.random() < 0.6 else 0.0) + rng.normal(0, 0.01)
    if model == "two-state-cpu":  # half the launches 3.25x slower (gloo on 2 CPU cores)
        return (math.log(3.25) if rng.random() < 0.5 else 0.0) + rng.normal(0, 0.05)
    if model == "rare-slow":
        return (math.log(1.10) if rng.random() < 0.1 else 0.0) + rng.normal(0, 0.005)
    if model == "t3":
        return 0.03 * rng.standard_t(3)
    return rng.normal(0, 0.01)  # position models: quiet launches, the place moves them


def place_effect(model: str, pos: int, index: int, total: int) -> float:
    if model == "first-in-round+10%":
        return math.log(1.10) if pos == 0 else 0.0
    if model == "first-in-round-10%":
        return math.log(0.90) if pos == 0 else 0.0
    if model == "alternating10%":
        return math.log(1.05) if index % 2 else math.log(0.95)
    if model == "linear-position5%":
        return pos * math.log(1.05)
    if model == "drift5":
        return index / total * math.log(1.05)
    return 0.0


def effect(config: int, tokens: int) -> float:
    if config == WINNER:
        return math.log(0.90) if tokens <= 64 else math.log(1.50)
    if config in LOSERS:
        return math.log(2.0)
    return 0.0


def one_run(model: str, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    names = [DEFAULT] + [f"c{i}" for i in range(1, CONFIGS)]
    spec = SimpleNamespace(trials=TRIALS, configs=[SimpleNamespace(name=n) for n in names])
    order = launch_order(spec, seed)
    sizes = {t: t * 7168 * 2 for t in TOKENS}
    tokens_by_size = {b: t for t, b in sizes.items()}
    base = {t: math.log(10 + t * 0.5) for t in TOKENS}
    values: list[LaunchValue] = []
    dropped: dict[str, int] = {}
    launched = 0
    total = len(order)
    for trial in range(TRIALS):
        for launch in (l for l in order if l.trial == trial):
            if launch.config in dropped:
                continue
            launched += 1
            c = names.index(launch.config)
            pos = launch.index - trial * CONFIGS
            shared = launch_noise(model, rng) + place_effect(model, pos, launch.index, total)
            for md in MODES:
                for t in TOKENS:
                    v = base[t] + effect(c, t) + shared + rng.normal(0, PER_SIZE_SD)
                    values.append(LaunchValue(launch.config, launch.index, sizes[t], md, v, 1))
        if trial < TRIALS - 1:  # the sweep races after every screening trial but the last
            scr = screening.screen(values, configs=names, modes=list(MODES), tokens_by_size=tokens_by_size,
                                   bands=BANDS)
            for d in racing.decide(scr, after_trial=trial + 1, already=dropped):
                dropped[d.config] = trial + 1
    losers = {names[i] for i in LOSERS}
    return {"winner_dropped": names[WINNER] in dropped, "losers_dropped": len(losers & set(dropped)),
            "aa_dropped": len(set(dropped) - losers - {names[WINNER]}), "launched": launched, "planned": total}


def simulate(model: str, runs: int, seed0: int = 0) -> dict:
    out = [one_run(model, seed0 + r) for r in range(runs)]
    return {"model": model, "runs": runs,
            "winner_dropped": sum(o["winner_dropped"] for o in out),
            "aa_dropped": sum(o["aa_dropped"] for o in out),
            "loser_drop_rate": sum(o["losers_dropped"] for o in out) / (runs * len(LOSERS)),
            "launch_share": sum(o["launched"] for o in out) / sum(o["planned"] for o in out)}


def main(runs: int) -> None:
    t0 = time.monotonic()
    print(f"racing simulation: {runs} runs per model, pcie8 shape ({CONFIGS} configs, {len(TOKENS)} sizes, "
          f"{len(MODES)} modes, {TRIALS} trials); winner -10% decode / +50% prefill, {len(LOSERS)} losers 2x")
    print(f"{'model':22} {'winner dropped':>16} {'A/A dropped':>12} {'losers dropped':>15} {'launches run':>13}")
    for model in MODELS:
        r = simulate(model, runs)
        print(f"{model:22} {r['winner_dropped']:>6} ({r['winner_dropped'] / runs:6.2%}) {r['aa_dropped']:>12} "
              f"{r['loser_drop_rate']:>15.1%} {r['launch_share']:>13.1%}")
    print(f"({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
