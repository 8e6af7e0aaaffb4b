"""A run folder's verdicts: screening (stage 1) + confirmation (stage 2) -> certified winners and profiles.

The only way commdiag says "faster" or "slower", or writes a profile, is a claim
certified in stage 2 (certify.py).  Stage 1 (screening.py) gives estimates and
picks the claims.  A run without a stage 2 (``--no-confirm``, an interrupted
confirmation, or a run folder from before run format 3) is "screening only":
estimates, no verdict, no profile, and a line saying what would certify it.

Winners.  Per band in the primary mode: the eligible config certified faster
with the lowest Hodges-Lehmann ratio.  ``profile-<band>.env`` per band winner;
``profile.env`` is the first band's winner (decode by default), written only
when that config's stage-2 estimate is no more than 3% slower in every other
band, because NCCL settings apply to every size a process sends.  No winner:
no file, keep NCCL defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import certify, confounders, racing, screening, stats
from .certify import Certification
from .screening import Screening
from .stats import ALPHA, MIN_EFFECT

SCREENING_ONLY, NO_CANDIDATES, PENDING, CONFIRMED = ("screening only", "nothing to confirm",
                                                     "confirmation unfinished", "confirmed")
# The commdiag-verdicts (and commdiag-sweep-result) JSON envelope: 2 = stage 2 judged by the unpaired rank
# test; 3 = by the paired within-round signed-rank test (certifications gain rounds, dropped, zeros,
# ratio_ci, ci_level, plan_reaches, rounds_to_certify, headline; noise is the sd of the round log-ratios);
# 4 = --certify-sizes' per-size claims paired by trial too (their test, rounds and noise as stage 2's);
# 5 = failed launches counted as their config's worst value (certifications gain failed, default_failed),
# the tail check (mean_ratio, tail), looks spending alpha/2, alpha/4, ... (confirmation version 3).
VERDICTS_VERSION = 5
NOT_CERTIFIABLE = "not certifiable with this plan"  # stage 2's rounds cannot reach any claim's threshold


@dataclass(frozen=True)
class Winner:
    """The certified best config in one band and mode, or none (keep NCCL defaults)."""

    mode: str
    band: str
    config: str | None
    ratio: float | None
    p: float | None
    other_bands: dict = field(default_factory=dict)  # band -> the winner's stage-2 ratio there

    @property
    def text(self) -> str:
        if self.config is None:
            return "keep NCCL defaults"
        return f"{self.config}: certified {(1 - self.ratio) * 100:.1f}% faster (ratio {self.ratio:.3f}, p = {self.p:.2g})"

    def to_json(self) -> dict:
        return {"mode": self.mode, "band": self.band, "config": self.config, "ratio": self.ratio, "p": self.p,
                "other_bands": self.other_bands, "text": self.text}


@dataclass(frozen=True)
class Verdicts:
    screening: Screening
    status: str  # screening only | nothing to confirm | confirmation unfinished | confirmed | not certifiable ...
    status_note: str
    confirmation: dict | None  # run.json's stage-2 plan
    certifications: tuple[Certification, ...]
    band_winners: tuple[Winner, ...]
    size_certifications: tuple[Certification, ...] = ()
    notes: tuple[str, ...] = ()  # the A/A check's PASS/FAIL, and why NCCL settings do nothing under gloo
    alpha: float = ALPHA
    min_effect: float = MIN_EFFECT
    confounders: confounders.Confounders | None = None  # the machine during the launches (confounders.py)

    # what the report and the CLI read besides the two stages
    @property
    def modes(self):
        return self.screening.modes

    @property
    def configs(self):
        return self.screening.configs

    @property
    def bands(self):
        return self.screening.bands

    @property
    def excluded(self):
        return self.screening.excluded

    @property
    def warnings(self):
        return self.screening.warnings

    @property
    def primary_mode(self):
        return self.screening.primary_mode

    @property
    def family_size(self) -> int:
        return (self.confirmation or {}).get("family_size", 0)

    def band_winner(self, band: str, mode: str) -> Winner | None:
        return next((w for w in self.band_winners if w.band == band and w.mode == mode), None)

    def to_json(self) -> dict:
        return {"method": {"alpha_familywise": self.alpha, "min_effect": self.min_effect,
                           "per_launch_value": f"mean of ln(samples) after dropping {stats.TRIM:.0%} at each end",
                           "stage1": "screening estimates (not verdicts) from the interleaved trials",
                           "stage2": "exact Wilcoxon signed-rank test on the within-round log-ratios of fresh "
                                     "rounds (config vs default in the same shuffled round), Bonferroni over the "
                                     "run's M claims; Hodges-Lehmann ratio of the same rounds <= 0.97 / >= 1.03",
                           "stage2_test": certify.PAIRED_TEST},
                "status": self.status, "status_note": self.status_note, "family_size": self.family_size,
                "primary_mode": self.primary_mode, "confirmation": self.confirmation,
                "certifications": [c.to_json() for c in self.certifications],
                "band_winners": [w.to_json() for w in self.band_winners],
                "size_certifications": [c.to_json() for c in self.size_certifications],
                "notes": list(self.notes),
                "confounders": self.confounders.to_json() if self.confounders else None,
                "screening": self.screening.to_json()}


def evaluate(values: list[stats.LaunchValue], run: dict, excluded: dict[str, str]) -> Verdicts:
    """Verdicts from launch values (stage 1 and 2) and run.json (spec, launches, confirmation plan)."""
    from dataclasses import replace

    v = _evaluate(values, run, excluded)
    return replace(v, notes=tuple(_rejudged(v) + _notes(v, run) + racing.notes(run)),
                   confounders=confounders.check(run, v.certifications + v.size_certifications))


def _rejudged(v: Verdicts) -> list[str]:
    """A run confirmed before the paired test (confirmation format 1): its rounds are judged again the
    current way, and the output says so once."""
    plan = v.confirmation or {}
    if not plan.get("claims") or v.status == PENDING or (plan.get("test") == certify.PAIRED_TEST
                                                         and not plan.get("upgraded_from")):
        return []
    return ["stage 2 judged again with the paired within-round signed-rank test: this run was confirmed "
            "with the unpaired rank test (confirmation format 1), which stage 2's within-round shuffle "
            "does not support (docs/verdicts.md)"]


def _notes(v: Verdicts, run: dict) -> list[str]:
    """Twins of default (identical settings; under gloo, identical but for NCCL_* variables, which gloo
    never reads) make the run an A/A check: say whether it passed."""
    envs = {c["name"]: dict(c.get("env", {})) for c in run.get("configs", [])}
    gloo = run.get("spec", {}).get("backend") == "gloo"
    strip = (lambda e: {k: x for k, x in e.items() if not k.startswith("NCCL_")}) if gloo else (lambda e: e)  # noqa: E731
    base = strip(envs.get(stats.DEFAULT, {}))
    twins = [c for c, e in envs.items() if c != stats.DEFAULT and strip(e) == base]
    notes = []
    if gloo and any(k.startswith("NCCL_") for e in envs.values() for k in e if k != "NCCL_NVLS_ENABLE"):
        notes.append("gloo never loads NCCL: the NCCL_* settings here cannot change anything, so every "
                     "difference between these configs is launch noise")
    if not twins:
        return notes
    names = ", ".join(twins)
    loose = [c for c in twins if envs[c] != envs.get(stats.DEFAULT, {})]  # identical only because gloo ignores NCCL_*
    # --certify-sizes judges every config x size on stage 1, twins too: a twin certified there is a failed
    # A/A check whatever stage 2 says (or whether it ran at all)
    false = [c for c in v.certifications + v.size_certifications if c.certified and c.claim.config in twins]
    if false:
        notes.append(f"A/A check: FAIL: {false[0].claim.config} was certified {false[0].result} than default in "
                     f"{false[0].claim.where} though identical: do not trust a sweep on this machine until it passes")
        return notes
    sized = sorted({c.claim.config for c in v.size_certifications if c.claim.config in twins and c.reachable})
    decided = {c.claim.config for c in v.certifications if c.claim.config in twins and c.reachable}
    if v.status in (SCREENING_ONLY, PENDING, NOT_CERTIFIABLE) or (
            any(c.claim.config in twins for c in v.certifications) and not decided):
        same = "identical to default" + (" under gloo, which never loads NCCL" if loose else "")
        notes.append(f"A/A check ({names} {same}): " + ("not certified at any size (--certify-sizes); stage 2 "
                                                        if sized else "") + f"not decided yet ({v.status})")
        return notes
    tested = sorted({c.claim.config for c in v.certifications if c.claim.config in twins})
    same = (", identical to default under gloo (gloo never loads NCCL):" if loose
            else " (identical to default)")
    # one twin's stage-2 test is no claim about another twin that screening did not nominate
    untested = [c for c in twins if c not in tested]
    if tested and untested:
        where = (f"{', '.join(tested)} tested in stage 2 and not certified; {', '.join(untested)} "
                 "not tested in stage 2 (not a claim)")
    else:
        where = ("tested in stage 2 and not certified" if tested else "not even a screening candidate")
    notes.append(f"A/A check: PASS: {names}{same} " + where
                 + (", and not certified at any size (--certify-sizes)" if sized else ""))
    return notes


def _evaluate(values: list[stats.LaunchValue], run: dict, excluded: dict[str, str]) -> Verdicts:
    scr = _screen(values, run, excluded)
    sizes = []
    if run.get("certify_sizes"):
        trial_of = {l["index"]: int(l["trial"]) for l in run["launches"] if int(l.get("stage", 1)) == 1}
        sizes = certify.certify_sizes(scr, values, trial_of, trials=int(run["certify_sizes"].get("trials", 0)))
    plan = run.get("confirmation")
    if not plan:
        if run.get("confirm_requested") is False:
            note = f"stopped after screening (--no-confirm): run  commdiag confirm {run_dir_hint(run)}  to certify"
        elif int(run.get("version", 1)) < 3:
            note = (f"a run folder from before two-stage verdicts: screening only; commdiag confirm "
                    f"{run_dir_hint(run)} certifies it")
        else:
            note = "stage 1 unfinished: no confirmation yet"
        return Verdicts(scr, SCREENING_ONLY, note, None, (), _no_winners(scr), tuple(sizes))
    if not plan.get("claims"):
        return Verdicts(scr, NO_CANDIDATES,
                        "screening found no config at least 3% faster than default in any band, and the spec names "
                        "no confirm.configs: nothing to certify, keep NCCL defaults", plan, (), _no_winners(scr),
                        tuple(sizes))
    stage2 = [l for l in run.get("launches", []) if l.get("stage") == 2]
    if any(l.get("status") == "pending" for l in stage2):
        return Verdicts(scr, PENDING, f"commdiag sweep --resume {run_dir_hint(run)} finishes it", plan, (),
                        _no_winners(scr), tuple(sizes))
    round_of = {l["index"]: int(l["round"]) for l in stage2 if isinstance(l.get("round"), int)}
    usable = stats.usable_launches(run)
    failed = {l["index"]: l["config"] for l in stage2 if l.get("status") != "pending" and l["index"] not in usable}
    certs = certify.certify(plan, values, scr.band_sizes, round_of, excluded, failed)
    winners = []
    for b in scr.bands:
        mode = plan.get("mode") or scr.primary_mode
        best = [c for c in certs if c.claim.band == b and c.claim.mode == mode and c.result == certify.FASTER
                and c.eligible]
        if not best:
            winners.append(Winner(mode, b, None, None, None))
            continue
        w = min(best, key=lambda c: (c.ratio, c.claim.config))
        others = {o: certify.band_ratio(values, w.claim.config, mode, scr.band_sizes.get(o, []), round_of)
                  for o in scr.bands if o != b and scr.band_sizes.get(o)}
        winners.append(Winner(mode, b, w.claim.config, w.ratio, w.p, others))
    looks = len(plan.get("looks", []))
    total = certify.total_rounds(plan)
    if not any(c.reachable for c in certs):
        need = max(c.rounds_to_certify or 0 for c in certs)
        asked = total or plan.get("rounds_requested") or 0  # nothing launched: the rounds that were asked for
        return Verdicts(scr, NOT_CERTIFIABLE,
                        f"{asked} rounds cannot reach p <= {plan['looks'][-1]['threshold']:.2g} for any claim; "
                        f"{need} rounds can: commdiag confirm {run_dir_hint(run)} --rounds {max(1, need - total)}",
                        plan, tuple(certs), tuple(winners), tuple(sizes))
    note = (f"{sum(c.certified for c in certs)} of {len(certs)} claims certified; stage 2: {total} rounds"
            + (f" over {looks} looks" if looks > 1 else ""))
    return Verdicts(scr, CONFIRMED, note, plan, tuple(certs), tuple(winners), tuple(sizes))


def _no_winners(scr: Screening) -> tuple[Winner, ...]:
    mode = scr.primary_mode
    return tuple(Winner(mode, b, None, None, None) for b in scr.bands) if mode else ()


def run_dir_hint(run: dict) -> str:
    return run.get("_run_dir") or "RUN_DIR"


def run_values(data) -> list[stats.LaunchValue]:
    """Every usable launch's values of a loaded run folder, with its stage."""
    return stats.launch_values(data.samples, stats.usable_launches(data.run), stats.launch_stages(data.run))


def evaluate_run(data, values: list[stats.LaunchValue] | None = None) -> Verdicts:
    """Verdicts for a loaded run folder (``results.RunData``); ``values``: its run_values, when already computed."""
    run = {**data.run, "_run_dir": str(data.path)}  # for the commands the notes suggest
    return evaluate(run_values(data) if values is None else values, run, stats.exclusions(run, data.summary))


def screening_of(data) -> tuple[Screening, list[stats.LaunchValue]]:
    """Stage 1 alone (what the sweep plans stage 2 from)."""
    values = run_values(data)
    return _screen(values, data.run, stats.exclusions(data.run, data.summary)), values


def _screen(values: list[stats.LaunchValue], run: dict, excluded: dict[str, str]) -> Screening:
    """Screening of a run: the spec's modes first, then any other series in the data (graph-direct, ...)."""
    spec = run.get("spec", {})
    modes = list(dict.fromkeys(list(spec.get("modes") or []) + sorted({v.mode for v in values})))
    return screening.screen(values, configs=[c["name"] for c in run.get("configs", [])], modes=modes,
                            tokens_by_size={s["bytes"]: s.get("tokens") for s in spec.get("sizes", [])},
                            bands=spec.get("bands") or {}, excluded=excluded)


def profile_plan(verdicts: Verdicts, run: dict, source: str, created: str) -> dict[str, tuple[dict, dict]]:
    """Which profile files a run folder gets: {file name: (settings, meta)} (module docstring)."""
    from ..formats.spec import BAND_RE

    envs = {c["name"]: c.get("env", {}) for c in run.get("configs", [])}  # what was measured, base_env included
    plan: dict[str, tuple[dict, dict]] = {}
    band_names = [b for b in verdicts.bands if BAND_RE.fullmatch(str(b))]  # a name becomes a file name
    for w in verdicts.band_winners:
        if w.config is None or w.band not in band_names:
            continue
        meta = {"source": source, "band": f"{w.band} {screening.band_text(verdicts.bands[w.band])}", "config": w.config,
                "created": created, "mode": w.mode,
                "certified": f"ratio {w.ratio:.3f} vs default, p = {w.p:.2g} (stage 2, paired signed-rank test)"}
        plan[f"profile-{w.band}.env"] = ({k: str(v) for k, v in envs.get(w.config, {}).items()}, meta)
    first_band = next(iter(verdicts.bands), None)  # the spec's first band, even when its name was refused
    if first_band in band_names and f"profile-{first_band}.env" in plan:
        first = next(w for w in verdicts.band_winners if w.band == first_band and w.config)
        hurts = [b for b, r in first.other_bands.items() if r is None or r > 1 + MIN_EFFECT]
        if not hurts:
            plan["profile.env"] = plan[f"profile-{first_band}.env"]
    return plan
