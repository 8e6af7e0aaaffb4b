"""The two-stage plan of a sweep and its words: pure functions over a spec and run.json's dict.

Stage 1 is the interleaved trials; stage 2 (analyse/certify.py) confirms the screening's candidates
on fresh rounds.  This module decides what stage 2 claims and measures, how many rounds it needs and
appends them as pending launches, refuses before any launch a plan that cannot certify, and words
every plan the CLI prints (``StagePlan``).  Nothing here launches, reads or writes a file: sweep.py
does, and tests call these names directly.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path

from .. import linewrap
from ..analyse import certify, paired, stats
from ..analyse.stats import LESS, TWO_SIDED
from ..errors import CommdiagError
from ..formats import results
from ..formats.spec import Spec
from . import eta

@dataclass(frozen=True)
class StagePlan:
    """What the CLI prints before launches start: stage 2's claims and cost, or --certify-sizes' cost."""

    kind: str  # confirm | certify-sizes
    launches: int
    est_s: float | None
    lines: tuple[str, ...]


def spec_families(spec: Spec) -> tuple[int, int, str]:
    """(fewest, most) claims stage 2 of ``spec`` can make, and the sidedness of the fewest: every named
    config (confirm.configs) in every band with sizes, two-sided; a screening candidate per band."""
    from ..analyse.screening import in_band

    bands = sum(1 for rng in spec.bands.values() if any(in_band(s.tokens, rng) for s in spec.sizes))
    named = len(spec.confirm_configs)
    unnamed = len(spec.configs) - 1 - named
    most = bands * (named + (1 if unnamed > 0 else 0))
    return (bands * named, most, TWO_SIDED) if named else (min(1, most), most, LESS)


def check_confirm_rounds(spec: Spec, certify_sizes: bool) -> None:
    """Before any launch: a fixed confirm.rounds that cannot certify even the spec's fewest claims is refused."""
    if not spec.confirm_rounds:
        return
    fewest, _, alt = spec_families(spec)
    if not fewest:
        return
    thr = certify.threshold(stats.ALPHA / 2 if certify_sizes else stats.ALPHA, fewest)
    if paired.smallest_p(spec.confirm_rounds, alt) > thr:
        from ..errors import SpecError

        raise SpecError(spec.path, "confirm.rounds",
                        f"not certifiable with this plan: {spec.confirm_rounds} rounds give the paired within-round "
                        f"test a smallest p of {paired.smallest_p(spec.confirm_rounds, alt):.2g}, and this spec's "
                        f"{fewest} claim(s) each need p <= {thr:.2g}; set confirm.rounds: "
                        f"{paired.rounds_to_reach(thr, alt)} (or auto), or run with --no-confirm for screening only")


def start_banner(spec: Spec, run: dict, run_dir: Path) -> StagePlan:
    """The first thing a sweep prints: where it writes, how many launches, about how long (eta.py: this run's
    launches when it has some, else the recorded components)."""
    pending = [l for l in run["launches"] if l["status"] == results.PENDING]
    stage1 = sum(1 for l in pending if int(l.get("stage", 1)) == 1)
    later = run.get("confirm_requested", True) and run.get("confirmation") is None
    most = stage2_at_most(spec) if later else 0
    then = ("" if not later else "; then stage 2 (confirmation; its plan is printed when screening ends): "
            + ("none, unless screening finds a candidate" if most == 0 else
               f"at most {most} launches, fewer when screening nominates fewer configs"))
    cost = eta.measured(run) or eta.recorded(spec, run.get("launch", {}).get("method") or "torchrun")
    est = eta.remaining_s(spec, run, cost, pending, most)
    configs = len(run["configs"])
    line = (f"run folder {run_dir}: {len(pending)} launch{'es' if len(pending) != 1 else ''} to run"
            + (f" ({stage1} screening: {configs} config{'s' if configs != 1 else ''} x {spec.trials} "
               f"trial{'s' if spec.trials != 1 else ''}"
               + ("; racing may drop clear losers" if (run.get("racing") or {}).get("enabled") else "") + ")"
               if stage1 else "") + then)
    lines = [line, f"  expected: {minutes(est)} in all" + (" with stage 2's most" if most else "") + f" ({cost.note})"
             if est is not None else f"  expected: from the first launch on ({cost.note})"]
    how = run.get("launch", {})
    if how.get("method"):
        lines.append(f"  launch: {how['method']}" + (f" ({how['note']})" if how.get("note") else "")
                     + (f"; fell back earlier in this run: {how['fallback']}" if how.get("fallback") else ""))
    if spec.confirm_rounds and then:
        _, fam, _ = spec_families(spec)
        thr = certify.threshold(stats.ALPHA / 2 if run.get("certify_sizes") else stats.ALPHA, max(fam, 1))
        if fam and paired.smallest_p(spec.confirm_rounds, TWO_SIDED if spec.confirm_configs else LESS) > thr:
            lines.append(f"  confirm.rounds: {spec.confirm_rounds} is too few if screening adds every claim it can "
                         f"({fam}): claims beyond its reach would be not certifiable with this plan (auto plans "
                         "the rounds every claim needs)")
    return StagePlan("start", len(pending), est, fit(lines))


def minutes(seconds: float) -> str:
    return f"about {seconds / 60:.1f} min" if seconds >= 90 else f"about {seconds:.0f} s"


def stage2_at_most(spec: Spec) -> int:
    """The most stage-2 launches a sweep of ``spec`` can plan, known before screening: every band adds a
    screening candidate besides confirm.configs, each round runs default and every claimed config."""
    from ..analyse.screening import in_band

    rounds = most_rounds(spec)
    if not rounds:
        return 0
    bands = sum(1 for rng in spec.bands.values() if any(in_band(s.tokens, rng) for s in spec.sizes))
    unnamed = len(spec.configs) - 1 - len(spec.confirm_configs)
    return rounds * (1 + len(spec.confirm_configs) + min(bands, max(unnamed, 0)))


def most_rounds(spec: Spec) -> int:
    """Stage 2's rounds for the largest family ``spec`` can claim (certify.rounds_needed: floor + spares):
    every confirm.configs config two-sided and one screening pick one-sided, in every band with sizes;
    or confirm.rounds; 0 when nothing can be claimed."""
    from ..analyse.screening import in_band

    bands = [b for b, rng in spec.bands.items() if any(in_band(s.tokens, rng) for s in spec.sizes)]
    unnamed = len(spec.configs) - 1 - len(spec.confirm_configs)
    claims = [certify.Claim(c, "graph", b, None, TWO_SIDED, "confirm.configs", None)
              for b in bands for c in spec.confirm_configs]
    claims += [certify.Claim("pick", "graph", b, None, LESS, "screening", None) for b in bands if unnamed > 0]
    if not claims:
        return 0
    return spec.confirm_rounds or certify.rounds_needed(claims)


def dry_run(spec: Spec, how: str, why: str | None) -> StagePlan:
    """``commdiag sweep SPEC --dry-run``: the plan (launches per stage, at most how many stage-2 rounds) and
    its expected wall time from recorded components (eta.py), launched by ``how`` (``why``: why not the
    spec's), without launching anything."""
    cost = eta.recorded(spec, how)
    n1 = len(spec.configs) * spec.trials
    most = stage2_at_most(spec)
    _, claims, _ = spec_families(spec)
    rounds = most_rounds(spec)
    one1, one2 = cost.launch_s(), cost.launch_s(eta.stage2_graph_share(spec))
    lines = [f"plan for {spec.path} (nothing is launched):",
             f"  launch: {how}" + (f" ({why})" if why else ""),
             f"  stage 1 (screening): {len(spec.configs)} configs x {spec.trials} trials = {n1} launches"
             + (f", {len(spec.sizes)} sizes x {eta.series(spec)} series each" if spec.sizes else "")
             + ("; racing stops launching configs that lose clearly after each trial (fewer launches)"
                if spec.racing else "")]
    if most:
        lines.append(f"  stage 2 (confirmation): at most {rounds} rounds x {most // max(rounds, 1)} configs = {most} "
                     f"launches (up to {claims} claim(s); fewer when screening nominates fewer configs)")
    else:
        lines.append("  stage 2 (confirmation): none (no config besides default)")
    if one1 is None:
        lines.append(f"  expected: start-up {cost.startup_s * (n1 + most) / 60:.1f} min for {n1 + most} launches, "
                     f"plus measuring, known from the first launch ({cost.note})")
        est = None
    else:
        est = eta.SERVER_START_S.get(spec.backend, 0.0) * (how == "forkserver") + n1 * one1 + most * one2
        lines.append(f"  expected: {minutes(est)}: {n1} x {one1:.1f} s + at most {most} x {one2:.1f} s "
                     f"(stage 2 times one series)" + (" + the launch servers' start" if how == "forkserver" else ""))
        lines.append(f"    {cost.note}")
    return StagePlan("dry-run", n1 + most, est, fit(lines))


def mean_wall(run: dict) -> float | None:
    walls = [l["wall_s"] for l in run["launches"] if l.get("wall_s")]
    return sum(walls) / len(walls) if walls else None


def plan_stage2(spec: Spec, run: dict, scr, rounds: int | None, now_utc: str) -> StagePlan:
    """From stage 1's screening ``scr`` (verdict.screening_of): record the confirmation plan in
    ``run`` and append its pending launches; the plan's words."""
    claims = certify.plan_claims(scr, spec.confirm_configs)
    stage1 = sum(1 for l in run["launches"] if int(l.get("stage", 1)) == 1)
    alpha = stats.ALPHA / 2 if run.get("certify_sizes") else stats.ALPHA  # --certify-sizes spends the other half
    plan = certify.confirmation_plan(claims, rounds, stage1, now_utc, alpha)
    plan["measure"] = stage2_measure(spec, claims, scr.band_sizes)
    run["confirmation"] = plan
    run["version"] = results.RUN_FORMAT_VERSION
    k2 = plan["looks"][0]["rounds"]
    if claims:
        add_rounds(run, plan, spec, k2)
    return confirm_plan_text(run, plan, k2)


def further_look(spec: Spec, run: dict, plan: dict, rounds: int, now_utc: str) -> StagePlan:
    """Extend a confirmed ``plan`` by ``rounds`` (checked first: check_further_look): a new look at
    the same claims and its pending launches in ``run``; the look's words."""
    if plan.get("test") != certify.PAIRED_TEST:  # confirmed before the paired test: judged the paired way now
        plan.update(version=certify.CONFIRMATION_VERSION, test=certify.PAIRED_TEST,
                    upgraded_from=plan.get("version", 1))
    certify.add_look(plan, rounds, now_utc)
    add_rounds(run, plan, spec, rounds)
    return confirm_plan_text(run, plan, rounds)


def stage2_measure(spec: Spec, claims, band_sizes: dict) -> dict:
    """The worker plan of a stage-2 launch: only the claims' series (graph via torch, graph-direct via
    nccl-direct, ...), at every band's sizes (a winner's ratio in the other bands decides profile.env);
    a stage-2 launch then costs little more than its start."""
    series = [results.label_series(c.mode, spec.vias) for c in claims]
    modes = sorted({m for m, _ in series}, key=list(spec.modes).index)
    vias = sorted({v for _, v in series}, key=list(spec.vias).index)
    sizes = sorted({s for sizes in band_sizes.values() for s in sizes} | {c.size_bytes for c in claims
                                                                         if c.size_bytes is not None})
    return {"modes": modes, "vias": vias, "sizes": sizes or [s.bytes for s in spec.sizes]}


def check_further_look(run_dir: Path, plan: dict, rounds: int | None) -> None:
    """Before any launch of a further look: refuse one whose rounds in all cannot reach its threshold."""
    claims = certify.claims_of(plan)
    total = certify.total_rounds(plan)
    thr = certify.next_threshold(plan)
    if thr <= 0:
        raise CommdiagError(f"{run_dir}: its first look spent the whole {plan.get('alpha', stats.ALPHA):.0%} "
                            "(confirmed before looks spent alpha/2, alpha/4, ...): a further look would take the "
                            "run's chance of a false certification beyond it; run the spec afresh instead")
    need = max(paired.rounds_to_reach(thr, c.alternative) for c in claims)
    least = min(paired.rounds_to_reach(thr, c.alternative) for c in claims)
    if rounds is None:
        if certify.unreachable(plan) == claims:
            raise CommdiagError(f"{run_dir}: not certifiable with this plan ({total} rounds); give --rounds "
                                f"{max(1, need - total)} to add the rounds the paired test needs "
                                f"(p <= {thr:.2g})")
        raise CommdiagError(f"{run_dir}: already confirmed ({len(plan['looks'])} look(s)); give --rounds K to "
                            "extend it: a further look is tested at half of what the earlier looks left of the 1%")
    if total + rounds < least:
        raise CommdiagError(f"{run_dir}: --rounds {rounds}: with {total + rounds} rounds in all the paired "
                            f"within-round test cannot reach this look's p <= {thr:.2g} for any claim "
                            f"(smallest p: {paired.smallest_p(total + rounds, claims[0].alternative):.2g}); "
                            f"--rounds {least - total} can" + (f" ({need - total} for every claim)"
                                                               if need > least else ""))


def confirm_plan_text(run: dict, plan: dict, rounds: int) -> StagePlan:
    claims = certify.claims_of(plan)
    if not claims:
        return StagePlan("confirm", 0, 0.0, ("stage 2: nothing to confirm (screening found no config at least 3% "
                                              "faster than default in any band, and the spec names no "
                                              "confirm.configs): keep NCCL defaults",))
    n = rounds * len(plan["configs"])
    wall = mean_wall(run)
    look = plan["looks"][-1]
    thr, total = look["threshold"], certify.total_rounds(plan)
    cannot = certify.unreachable(plan)
    lines = []
    if len(cannot) == len(claims):
        need = max(paired.rounds_to_reach(thr, c.alternative) for c in claims)
        asked = total or plan.get("rounds_requested") or 0  # a first look that launched nothing: what was asked
        lines.append(f"stage 2 (confirmation, look {look['look']}): not certifiable with this plan: {asked} rounds "
                     f"cannot reach p <= {thr:.2g} for any of its {len(claims)} claim(s) (smallest p of the paired "
                     f"test with {asked} rounds: {paired.smallest_p(asked, cannot[0].alternative):.2g}); nothing "
                     f"is launched. {need} rounds can: confirm.rounds: auto in the spec, or commdiag confirm "
                     f"RUN_DIR --rounds {max(1, need - total)}")
    else:
        lines.append(f"stage 2 (confirmation, look {look['look']}): {rounds} fresh rounds x {len(plan['configs'])} "
                     f"configs = {n} launches" + (f", at most about {n * wall / 60:.1f} min ({wall:.1f} s a stage-1 "
                                                   "launch; stage 2 measures less)" if wall else "")
                     + f"; {len(claims)} claim(s), each must reach p <= {thr:.2g}")
        lines.append("  " + why_rounds(claims, total, thr))
        if cannot:
            need = max(paired.rounds_to_reach(thr, c.alternative) for c in cannot)
            lines.append(f"  not certifiable with this plan: {', '.join(sorted({c.config for c in cannot}))} "
                         f"(tested either way) would need {need} rounds; not launched")
    if look["look"] > 1:
        spent = certify.alpha_spent(plan)
        lines.append(f"  a further look at the same claims: the looks have spent {spent:.2%} of the run's "
                     f"{plan.get('alpha', stats.ALPHA):.0%} (each spends half of what is left: any number of "
                     "looks stays within it)")
    for c in claims:
        scr = "" if c.screening_ratio is None else f" (screening ratio {c.screening_ratio:.3f})"
        lines.append(f"  claim: {c.config} {'faster' if c.alternative == 'less' else 'faster or slower'} than "
                     f"default in {c.where}, {c.mode} mode{scr} [{c.reason}]")
    return StagePlan("confirm", n, n * wall if wall else None, fit(lines))


def fit(lines) -> tuple[str, ...]:
    """Plan lines within 100 columns (linewrap.py)."""
    return tuple(out for line in lines for out in linewrap.fit_line(line))


def why_rounds(claims, total: int, thr: float) -> str:
    """Why this many rounds: the paired test's smallest p with k rounds is 1/2^k (2/2^k two-sided)."""
    alt = TWO_SIDED if any(c.alternative == TWO_SIDED for c in claims) else LESS
    k = paired.rounds_to_reach(thr, alt)
    num = "2" if alt == TWO_SIDED else "1"
    why = (f"why {total} rounds: the paired within-round test's smallest p with k rounds is {num}/2^k "
           f"({'two-sided' if alt == TWO_SIDED else 'one-sided'} claims); {num}/2^{k} = "
           f"{paired.smallest_p(k, alt):.2g} <= {thr:.2g}")
    if k > 1:
        why += f", {num}/2^{k - 1} = {paired.smallest_p(k - 1, alt):.2g} is not"
    if total > k:
        why += f"; {total} rounds leave room for {total - k} rounds of opposite sign or small ranks"
    return why




def add_rounds(run: dict, plan: dict, spec: Spec, rounds: int) -> None:
    """Append ``rounds`` rounds of pending stage-2 launches: default + every claimed config, shuffled."""
    done_rounds = sum(lk["rounds"] for lk in plan["looks"][:-1])
    rng = random.Random(f"{run['seed']}-confirm-{len(plan['looks'])}")
    for r in range(done_rounds, done_rounds + rounds):
        names = list(plan["configs"])
        rng.shuffle(names)
        for n in names:
            run["launches"].append({"index": len(run["launches"]), "config": n, "trial": spec.trials + r,
                                    "stage": 2, "round": r, "status": results.PENDING})


def certify_sizes_plan(spec: Spec) -> tuple[Spec, StagePlan]:
    """--certify-sizes: enough trials for a one-stage exact test of every config x size (primary mode),
    paired by trial (certify.certify_sizes)."""
    m, floor = certify.size_claims_needed(len(spec.configs) - 1, len(spec.sizes), stats.ALPHA / 2)
    k = floor + certify.SIZES_SPARE_TRIALS
    if spec.trials < k:
        spec = dataclasses.replace(spec, trials=k)
    n = spec.trials * len(spec.configs)
    cost = eta.recorded(spec, spec.launch)
    one = cost.launch_s() or cost.startup_s  # a step spec: its measuring is known only from a launch
    est = n * one
    return spec, StagePlan("certify-sizes", n, est, (
        f"per-size certification: {len(spec.configs) - 1} configs x {len(spec.sizes)} sizes = {m} claims, each must "
        f"reach p <= {stats.ALPHA / 2 / m:.2g} (half the run's 1%; stage 2's band claims get the other half), paired by trial: {spec.trials} trials "
        f"(launches per config; {floor} reach it only if every one is complete and of one sign, so "
        f"{certify.SIZES_SPARE_TRIALS} spare take a failed launch), {n} launches in stage 1 "
        f"(about {est / 60:.0f} min at ~{one:.0f} s a launch, measure/eta.py)",))
