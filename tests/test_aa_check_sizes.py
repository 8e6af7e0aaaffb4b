"""The A/A check counts ``--certify-sizes``' per-size certifications: a twin of default certified
at some size (the per-size family, judged on stage 1) is a failed A/A check, never "PASS" or "not
decided yet".  Launch values constructed (verdict.evaluate's input, as test_confirm builds them)."""

from __future__ import annotations

import math

import pytest

from commdiag.analyse import certify, stats, verdict

SIZES = {4096: 1, 65536: 16}


def _run_and_values(twin_factor: float, confirmation):
    trials = certify.size_claims_needed(1, len(SIZES), stats.ALPHA / 2)[1]
    launches, values = [], []
    for t in range(trials):
        for c, factor in (("default", 1.0), ("aa", twin_factor)):
            index = len(launches)
            launches.append({"index": index, "config": c, "trial": t, "stage": 1, "status": "ok"})
            for s in SIZES:
                noise = 1 + 0.01 * ((t * 7 + len(c)) % 5)
                values.append(stats.LaunchValue(c, index, s, "graph", math.log(10 * factor * noise), 1))
    run = {"spec": {"backend": "nccl", "modes": ["graph"], "trials": trials, "bands": {"decode": [1, 64]},
                    "sizes": [{"bytes": b, "tokens": t} for b, t in SIZES.items()]},
           "configs": [{"name": "default", "env": {}}, {"name": "aa", "env": {}}],
           "launches": launches, "certify_sizes": {"trials": trials}, "version": 3}
    if confirmation is None:
        run["confirm_requested"] = False
    else:
        run["confirmation"] = confirmation
    return run, values


@pytest.mark.parametrize("confirmation", [None, {"claims": []}], ids=["no-confirm", "no-candidates"])
def test_a_twin_certified_per_size_fails_the_aa_check(confirmation):
    # the twin measured 1.5x slower in every trial (a machine whose launches differ by position, say):
    # the per-size family certifies it slower; screening makes no stage-2 claim of a slower config
    run, values = _run_and_values(1.5, confirmation)
    v = verdict.evaluate(values, run, {})
    assert {(c.claim.config, c.result) for c in v.size_certifications} == {("aa", "slower")}
    aa = [n for n in v.notes if n.startswith("A/A")]
    assert len(aa) == 1 and aa[0].startswith("A/A check: FAIL: aa was certified slower than default"), aa
    assert "PASS" not in " ".join(v.notes)


def test_a_twin_the_per_size_family_did_not_certify_passes_there():
    run, values = _run_and_values(1.0, {"claims": []})
    v = verdict.evaluate(values, run, {})
    assert v.size_certifications and not any(c.certified for c in v.size_certifications)
    aa = [n for n in v.notes if n.startswith("A/A")]
    assert len(aa) == 1 and aa[0].startswith("A/A check: PASS: aa"), aa
