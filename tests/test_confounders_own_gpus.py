"""ab's launches say which GPUs they used only where NVML listed their own processes (own_gpus).  A
launch whose processes NVML happened not to list (a short benchmark between two readings) must not
count every GPU of the box: it ran on the GPUs the run's other launches were seen on, and a stranger
on another GPU is no more its confounder than theirs.  Machine records constructed to the shape
machinestate.launch_record writes (as test_ab_machine's replayed readings produce)."""

from __future__ import annotations

from commdiag.analyse import confounders


def launch(index: int, config: str, own: list[int] | None) -> dict:
    machine = {"available": True, "period_s": 0.5, "samples": 4, "cost_s": 0.01, "cpu_s": 0.01,
               "gpus": [{"index": 0, "during": {}, "after": {}}, {"index": 1, "during": {}, "after": {}}],
               "others": [{"gpu": 1, "pid": 4242, "name": "python", "seen": ["during"]}]}
    if own:
        machine["own_gpus"] = own
    return {"index": index, "config": config, "round": index // 2, "status": "ok", "machine": machine}


def test_a_launch_whose_own_processes_were_not_listed_uses_the_runs_gpus():
    launches = [launch(2 * r, "default", None if r % 2 else [0]) for r in range(8)]
    launches += [launch(2 * r + 1, "seed", [0]) for r in range(8)]
    run = {"launches": launches, "machine_state": {"available": True, "gpus": [{"index": 0}, {"index": 1}]}}
    assert confounders.used_gpus(launches[1], run) == {0}  # the run's launches were seen on GPU 0 only
    default = [l for l in launches if l["config"] == "default"]
    seed = [l for l in launches if l["config"] == "seed"]
    found, unrecorded = confounders.compare_arms(run, "seed", default, seed)
    assert found == () and unrecorded == 0, found  # the stranger on GPU 1 met neither arm


def test_a_run_where_no_launch_listed_its_processes_still_counts_every_gpu():
    launches = [launch(0, "default", None), launch(1, "seed", None)]
    run = {"launches": launches}
    assert confounders.used_gpus(launches[0], run) is None
    assert [f.group for f in confounders.launch_facts(launches[0], run)] == [confounders.PROCESS]
