"""--certify-sizes plans spare trials: stage 1 is never extended (a second look adds stage-2 rounds
only), so a plan at the paired test's floor needs every one of its trials complete and of one sign: a
single failed default launch left every per-size claim of the run unreachable, and the only remedy
was a whole new sweep.  Launch values constructed (as test_confirm's certify_sizes test builds them)."""

from __future__ import annotations

import math

from commdiag.analyse import certify, paired, screening, stats
from commdiag.formats.spec import load_spec
from commdiag.measure import stages

from conftest import write_spec

SIZES = {4096: 1, 65536: 16}


def test_a_failed_default_launch_leaves_the_per_size_family_certifiable(tmp_path):
    spec = load_spec(write_spec(tmp_path / "s.yaml", sizes={"bytes": list(SIZES)}, configs={"slow": {}}))
    planned, plan = stages.certify_sizes_plan(spec)
    m, floor = certify.size_claims_needed(1, len(SIZES), stats.ALPHA / 2)
    assert (m, floor) == (2, 10) and planned.trials == floor + certify.SIZES_SPARE_TRIALS
    assert f"{planned.trials} trials" in " ".join(plan.lines) and "spare" in " ".join(plan.lines)
    values, trial_of = [], {}
    for t in range(planned.trials):
        for c, factor in (("default", 1.0), ("slow", 1.2)):
            launch = 10 * t + len(c)
            trial_of[launch] = t
            if c == "default" and t == 3:
                continue  # this launch failed: no values
            for s in SIZES:
                noise = 1 + 0.01 * ((t * 7 + len(c)) % 5)
                values.append(stats.LaunchValue(c, launch, s, "graph", math.log(10 * factor * noise), 1))
    scr = screening.screen(values, configs=["default", "slow"], modes=["graph"], tokens_by_size=SIZES,
                           bands={"decode": [1, 64]})
    out = certify.certify_sizes(scr, values, trial_of, trials=planned.trials)
    assert [(c.claim.size_bytes, c.result, c.dropped) for c in out] == [(4096, "slower", 1), (65536, "slower", 1)]
    # and one trial of the other sign beside the lost one (its rank the smallest) still reaches it
    assert paired.signed_rank_p([-0.001] + [0.1 + 0.01 * i for i in range(planned.trials - 2)],
                                stats.TWO_SIDED) <= out[0].threshold
