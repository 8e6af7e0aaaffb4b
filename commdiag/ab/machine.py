"""The machine during an A/B's launches: confounders per arm, through sweep's analysis.

Each launch's ``machine`` record (measure/machinestate.py, the same sampler sweep uses; it tells
the launch's own processes by their marker) is read by analyse/confounders.py: the run's notes
(every condition any launch met) and, per arm, the conditions that hit the arm's successful
launches and default's in a different share (``confounders.compare_arms``).  Such an arm's
verdicts keep their test result and are shown as "certified better, but confounded: ..."; a
condition both arms met alike is a note only.  Pure: run.json in, records out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..analyse import confounders, stats


@dataclass(frozen=True)
class ArmMachine:
    """The machine state of an ab run: the run's notes, and each arm's confounders against default."""

    run: confounders.Confounders  # recorded, reason, notes, per-launch facts (no claims)
    arms: dict[str, tuple[str, ...]] = field(default_factory=dict)  # arm -> its confounders
    unrecorded: dict[str, int] = field(default_factory=dict)  # arm -> launches without a record

    def for_arm(self, arm: str) -> tuple[str, ...]:
        return self.arms.get(arm, ())

    def to_json(self) -> dict:
        return {"recorded": self.run.recorded, "reason": self.run.reason, "notes": list(self.run.notes),
                "arms": {a: list(c) for a, c in self.arms.items()}}


def _ok(run: dict, config: str) -> list[dict]:
    return [l for l in run.get("launches", []) if isinstance(l, dict) and l.get("config") == config
            and l.get("status") == "ok"]


def check(run: dict) -> ArmMachine:
    """Notes on every finished launch, and each arm's confounders against default."""
    base = confounders.check(run)
    if not base.recorded:
        return ArmMachine(base)
    arms, missing = {}, {}
    reference = _ok(run, stats.DEFAULT)
    for c in run.get("configs", []):
        name = c.get("name") if isinstance(c, dict) else None
        if not name or name == stats.DEFAULT:
            continue
        arms[name], missing[name] = confounders.compare_arms(run, name, reference, _ok(run, name), "launches")
    return ArmMachine(base, arms, missing)
