"""Issue #37's audit, rerun at 4000 runs per model: every false-certification rate with its 95% Wilson
interval, through the shipped functions (the same models and code as tests/test_familywise.py, which runs
them at fewer runs where a run goes through the whole claim function).

    .venv/bin/python benchmarks/familywise.py [RUNS]      # about 10 minutes on 2 busy CPU cores

Prints one line per case: the rate, [Wilson 95%], and whether the upper end is within 1%.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import test_familywise as tf  # noqa: E402  (the models and helpers of the test suite)
from commdiag.ab import verdict as abv  # noqa: E402
from commdiag.analyse import certify, paired  # noqa: E402
from commdiag.analyse.stats import ALPHA, DEFAULT, LESS, TWO_SIDED  # noqa: E402
from commdiag.measure import sweep  # noqa: E402


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - half) / (1 + z * z / n)), (centre + half) / (1 + z * z / n)


def line(name: str, k: int, n: int) -> None:
    lo, hi = wilson(k, n)
    print(f"{name:<58} {k / n:7.2%} [{lo:.2%}, {hi:.2%}]  {'ok' if hi <= ALPHA else 'ABOVE 1%'}  ({n} runs)",
          flush=True)


def stage2_aa(runs: int) -> None:
    k2 = certify.rounds_needed(tf.TWIN_CLAIMS)
    pos, index = tf.stage2_places(runs, k2, 37)
    for m, model in enumerate(tf.MODELS):
        rng = np.random.default_rng(m + 7300)
        v = tf.launch_values(model, rng, pos, index)
        xs, ys, ds = [], [], []
        for _ in tf.TWIN_CLAIMS:
            band = v + rng.normal(0, 0.003, v.shape)
            xs.append(band[:, 1])
            ys.append(band[:, 0])
            ds.append(band[:, 1] - band[:, 0])
        false = tf.stage2_false(ds, xs, ys, certify.threshold(ALPHA, len(tf.TWIN_CLAIMS)))
        line(f"stage 2 A/A, twin named in 2 bands, {k2} rounds: {model}", int(false.sum()), runs)


def looks(runs: int, extra: int = 4, count: int = 6) -> None:
    plan = certify.confirmation_plan(tf.TWIN_CLAIMS, None, 9, "t")
    for k in range(count - 1):
        certify.add_look(plan, extra, f"t{k}")
    rng = np.random.default_rng(2)
    rounds = certify.total_rounds(plan)
    base = rng.normal(0, 0.05, (runs, 2, rounds))
    d = [base[:, 1] - base[:, 0] + rng.normal(0, 0.003, base[:, 0].shape) for _ in tf.TWIN_CLAIMS]
    false = np.zeros(runs, dtype=bool)
    for i, lk in enumerate(plan["looks"]):
        n = certify.total_rounds(plan, i + 1)
        for db in d:
            p = paired.signed_rank_p(db[:, :n], TWO_SIDED)
            ratio = np.exp(paired.hodges_lehmann(db[:, :n]))
            false |= (p <= lk["threshold"]) & ((ratio <= 0.97) | (ratio >= 1.03))
        line(f"further looks: after look {i + 1} ({n} rounds, +{extra} each)", int(false.sum()), runs)


def reuse(runs: int) -> None:
    claims = [certify.Claim("twin", "graph", "decode", None, TWO_SIDED, "confirm.configs", 1.0)]
    for rounds in (certify.rounds_needed(claims), 20):
        thr = certify.threshold(ALPHA, len(claims))
        rng = np.random.default_rng(11 + rounds)
        false = 0
        for r in range(runs):
            run = {"seed": r, "launches": []}
            sweep._add_rounds(run, {"looks": [{"rounds": rounds}], "configs": list(tf.REUSE_CONFIGS)},
                              SimpleNamespace(trials=0), rounds)
            value = {}
            for batch in sweep.process_batches(run["launches"], tf.REUSE_CONFIGS, True):
                for n, l in enumerate(batch):
                    value[(l["config"], l["round"])] = rng.normal(0, 0.01) + (math.log(1.10) if n == 0 else 0.0)
            c = certify.test_claim(claims[0], {k: value[("twin", k)] for k in range(rounds)},
                                   {k: value[(DEFAULT, k)] for k in range(rounds)}, thr=thr, look=1, eligible=True)
            false += c.certified
        line(f"reuse_process, first run in a process +10%, {rounds} rounds", false, runs)


def sweep_failures(runs: int) -> None:
    claim = certify.Claim("x", "graph", "decode", None, LESS, "screening", 0.9)
    thr = certify.threshold(ALPHA, 1)
    rng = np.random.default_rng(12)
    false = 0
    for _ in range(runs):
        slow = rng.random((2, 20)) < 0.3
        v = np.where(slow, math.log(1.5), 0.0) + rng.normal(0, 0.01, (2, 20))
        xs = {r: (None if slow[1, r] else float(v[1, r])) for r in range(20)}
        c = certify.test_claim(claim, xs, {r: float(v[0, r]) for r in range(20)}, thr=thr, look=1, eligible=True,
                               planned=20)
        false += c.certified
    line("sweep: slow launches of the config time out (30%), 20 rounds", false, runs)


def ab_failures(runs: int) -> None:
    for share, rounds in ((0.2, 11), (0.2, 20), (0.3, 20)):
        rng = np.random.default_rng(13)
        eq = eq_failed = failed_runs = 0
        for _ in range(runs):
            launches = []
            for r in range(rounds):
                for config in (DEFAULT, "arm"):
                    fail = config == "arm" and rng.random() < share
                    launches.append({"config": config, "round": r, "status": "failed" if fail else "ok",
                                     "values": None if fail else {"tok_s": 1000 * math.exp(rng.normal(0, 0.01))}})
            said = abv.judge(launches, ["arm"], [("tok_s", "higher")], 0.03)[0].verdict == abv.EQUIVALENT
            failed = any(l["status"] == "failed" for l in launches)
            eq += said
            failed_runs += failed
            eq_failed += said and failed
        print(f"ab: arm fails {share:.0%} of launches, {rounds} rounds: EQUIVALENT in {eq / runs:.2%} of runs, "
              f"= the runs where it never failed ({(1 - share) ** rounds:.2%} expected): nothing to see", flush=True)
        line(f"ab: the same, runs where the arm failed at least once: EQUIVALENT", eq_failed, failed_runs)


def ab_coarse(runs: int) -> None:
    for effect, wrong in ((1.035, abv.EQUIVALENT), (1.02, abv.BETTER)):
        vs = tf._ab_runs(math.log(effect), runs, 14)
        line(f"ab: integers around 20, true {effect - 1:+.1%}: {wrong.upper()}", sum(v.verdict == wrong for v in vs),
             runs)


def ab_aa(runs: int) -> None:
    for model in ("normal", "t1", "two-state", "quantised5"):
        rng = np.random.default_rng(17)
        false = 0
        for _ in range(runs):
            launches = []
            for r in range(12):
                for config in (DEFAULT, "aa"):
                    if model == "t1":
                        e = 0.01 * rng.standard_t(1)
                    elif model == "two-state":
                        e = (math.log(1.7) if rng.random() < 0.5 else 0.0) + rng.normal(0, 0.01)
                    else:
                        e = rng.normal(0, 0.02)
                    v = 20 * math.exp(e)
                    if model == "quantised5":
                        v = round(v)
                    launches.append({"config": config, "round": r, "status": "ok", "values": {"m": v}})
            false += abv.judge(launches, ["aa"], [("m", "higher")], 0.03)[0].verdict in (abv.BETTER, abv.WORSE)
        line(f"ab A/A, 12 rounds: {model}: BETTER or WORSE", false, runs)


def tails(runs: int) -> None:
    """The tail check: how often a config with a tail default does not show is crowned, and how often
    it withholds a real 10% winner whose noise is heavy-tailed for both arms (its price: power)."""
    claim = certify.Claim("x", "graph", "decode", None, LESS, "screening", 0.9)
    thr = certify.threshold(ALPHA, 1)
    k2 = certify.rounds_needed([claim])
    for name, rounds in (("5% faster, 3x slower on 5% of launches", k2), ("the same", 20),
                         ("a real 10% winner, t(2) noise on both arms", k2)):
        rng = np.random.default_rng(19 + rounds)
        crowned = withheld = shown = crowned_shown = 0
        for _ in range(runs):
            if name.startswith("a real"):
                y = 0.02 * rng.standard_t(2, rounds)
                x = math.log(0.9) + 0.02 * rng.standard_t(2, rounds)
            else:
                y = rng.normal(0, 0.01, rounds)
                slow = rng.random(rounds) < 0.05
                x = math.log(0.95) + rng.normal(0, 0.01, rounds) + np.where(slow, math.log(3.0 / 0.95), 0.0)
                shown += bool(slow.any())
            c = certify.test_claim(claim, dict(enumerate(map(float, x))), dict(enumerate(map(float, y))), thr=thr,
                                   look=1, eligible=True)
            crowned += c.certified
            withheld += c.tail
            crowned_shown += c.certified and not name.startswith("a real") and bool(slow.any())
        if name.startswith("a real"):
            print(f"tail check, {name}, {rounds} rounds: certified {crowned / runs:.1%}, withheld by the check "
                  f"{withheld / runs:.2%} ({runs} runs)", flush=True)
        else:
            print(f"tail: {name}, {rounds} rounds: CERTIFIED FASTER in {crowned / runs:.1%} of runs, = the runs "
                  f"that drew no slow launch ({0.95 ** rounds:.1%} expected): nothing shows the tail", flush=True)
            line(f"tail: the same, {rounds} rounds, runs that showed the tail: CERTIFIED FASTER", crowned_shown, shown)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    t0 = time.monotonic()
    only = sys.argv[2:]  # case names to run (all by default)
    for case in (stage2_aa, looks, reuse, sweep_failures, tails, ab_failures, ab_coarse, ab_aa):
        if not only or case.__name__ in only:
            case(runs)
    print(f"({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
