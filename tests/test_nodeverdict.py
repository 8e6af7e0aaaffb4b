"""The certified slow-node check's statistics (analyse/nodeverdict.py) on seeded simulations, and the
Slurm glue that needs no cluster (measure/slurm.py): ranks from Slurm's variables, the clear errors
outside an allocation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from commdiag.analyse import nodeverdict as nv
from commdiag.measure import slurm

from conftest import run_cli, write_spec


def _noise(rng, model: str, rounds: int, pairs: int):
    """ln(time) per round and pair under no node effect, with the pairs' shuffled positions."""
    pos = np.argsort(rng.random((rounds, pairs)), axis=1)  # the position each pair ran at
    base = {
        "normal": rng.normal(0, 0.05, (rounds, pairs)),
        "t1": 0.02 * rng.standard_t(1, (rounds, pairs)),
        "two-state": np.where(rng.random((rounds, pairs)) < 0.2, 0.4, 0.0) + rng.normal(0, 0.01, (rounds, pairs)),
        "drift": np.linspace(0, 1, rounds)[:, None] + rng.normal(0, 0.02, (rounds, pairs)),
        "first-slow": 0.10 * (pos == 0) + rng.normal(0, 0.01, (rounds, pairs)),
        "quantised": np.round(rng.normal(0, 0.05, (rounds, pairs)) / 0.05) * 0.05,
    }[model]
    return base


@pytest.mark.parametrize("model", ["normal", "t1", "two-state", "drift", "first-slow", "quantised"])
def test_an_aa_fleet_names_nobody(model):
    """Family-wise false alarms at most 1% (upper 95% Wilson bound) for any noise shape, at the planned rounds."""
    rng = np.random.default_rng(sum(map(ord, model)))
    n_nodes = 3
    pairs = nv.pairs_of(n_nodes)
    rounds = nv.rounds_needed(n_nodes, pairs)
    # 2000 draws: the smallest Monte Carlo p (1/2001) is below the per-claim level (1%/6), so a
    # false alarm is possible here and the test can fail
    runs, alarms, draws = 300, 0, 2000
    assert 1 / (draws + 1) < nv.ALPHA / nv.family(n_nodes, pairs)
    for i in range(runs):
        v = _noise(rng, model, rounds, len(pairs))
        alarms += any(f.slow for f in nv.judge(v, n_nodes, pairs, list("abc"), draws=draws, seed=i))
    # at most 1% in truth: 300 runs see at most 3% (upper 95% Wilson bound 4.8% at 3 of 300)
    assert alarms <= 3, (model, alarms)


def test_a_slow_node_is_named_and_a_small_effect_is_not():
    rng = np.random.default_rng(7)
    pairs = nv.pairs_of(3)
    rounds = nv.rounds_needed(3, pairs)
    v = rng.normal(0, 0.03, (rounds, 3))
    slow = v.copy()
    for j, p in enumerate(pairs):
        if 2 in p:
            slow[:, j] += math.log(1.5)  # node 2 makes its pairs 50% slower
    found = {(f.kind, f.name): f for f in nv.judge(slow, 3, pairs, ["n1", "n2", "n3"])}
    assert found[("node", "n3")].slow and found[("node", "n3")].ratio > 1.3
    assert not found[("node", "n1")].slow and not found[("node", "n2")].slow
    tiny = v.copy()
    for j, p in enumerate(pairs):
        if 2 in p:
            tiny[:, j] += math.log(1.01)  # 1%: below min_effect (3%), never certified
    assert not any(f.slow for f in nv.judge(tiny, 3, pairs, ["n1", "n2", "n3"]))


def test_two_nodes_have_nothing_to_compare_and_plans_are_finite():
    assert nv.pairs_of(2) == [(0, 1)] and nv.family(2, nv.pairs_of(2)) == 0
    assert nv.judge(np.zeros((3, 1)), 2, [(0, 1)], ["a", "b"]) == []
    assert len(nv.pairs_of(12)) == 12  # ring neighbours beyond 8 nodes
    for n in (3, 4, 8, 12, 64):
        pairs = nv.pairs_of(n)
        assert 3 <= nv.rounds_needed(n, pairs) <= 12
    with pytest.raises(ValueError):
        nv.judge([[0.0, float("nan"), 0.0]], 3, nv.pairs_of(3), ["a", "b", "c"])


def test_slurm_ranks_become_torch_ranks():
    env = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_NODEID": "2",
           "COMMDIAG_SLURM_NPROC": "2"}
    assert slurm.torch_rank_env(env) == {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8",
                                         "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "2"}
    assert slurm.torch_rank_env({**env, "RANK": "0"}) == {}  # torchrun's own come first
    assert slurm.torch_rank_env({}) == {}


def test_a_multi_node_spec_outside_any_cluster_says_what_to_do(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", nproc_per_node=1, nnodes=2)
    env = {"SLURM_JOB_ID": ""}
    proc = run_cli("sweep", spec, "--out", tmp_path / "run", env=env, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "salloc -N 2 commdiag sweep SPEC" in proc.stderr and "launch: torchrun" in proc.stderr
    assert not (tmp_path / "run").exists()
    for args in (["check-env", "--nodes"], ["nodes"]):
        proc = run_cli(*args, env=env, timeout=60)
        assert proc.returncode == 2 and "SLURM_JOB_ID is not" in proc.stderr and "Traceback" not in proc.stderr
        assert "salloc -N 2" in proc.stderr
