"""Multi-node on a real Slurm cluster: three slurmd nodes on this machine, each in its own network and
UTS namespace (tests/cluster/slurm-2node.sh up 3; .ci/run starts it), gloo over the nodes' own
addresses.  Every launch is a real srun job step; nothing is mocked.

Skipped, saying why, where no such cluster is up (COMMDIAG_REQUIRE_CLUSTER=1, as CI sets, makes that a
failure).  All of it is in the slow set (conftest.SLOW): each launch imports torch on every node."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commdiag.measure import launcher

from conftest import REPO, write_spec

STATE = Path(os.environ.get("SLURM_TEST_DIR", "/tmp/commdiag-slurm"))


# A node another test holds (the slow step runs two at a time) is up all the same: its salloc waits.
UP_STATES = ("idle", "alloc", "mix", "comp", "completing", "allocated", "mixed")


def _up_nodes() -> list[str]:
    if not shutil.which("sinfo"):
        return []
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=10)
    except (subprocess.TimeoutExpired, OSError):
        return []
    return sorted({l.split()[0] for l in out.stdout.splitlines()
                   if len(l.split()) == 2 and l.split()[1].rstrip("*~#!%$@^-+") in UP_STATES})


@pytest.fixture(scope="module")
def cluster():
    nodes = _up_nodes()
    if len(nodes) < 3:
        why = ("no Slurm cluster of 3 nodes is up (sinfo); start one as root with "
               "`bash tests/cluster/slurm-2node.sh up 3`")
        if os.environ.get("COMMDIAG_REQUIRE_CLUSTER"):
            pytest.fail(why)
        pytest.skip(why)
    return nodes


def cli_argv(*args) -> list[str]:
    return [sys.executable, "-m", "commdiag.cli", *map(str, args)]


def env_with(**extra) -> dict:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    for name in [n for n in env if n.startswith("SLURM_")]:  # never inherit an allocation of the caller
        del env[name]
    return env


def salloc(nodes: int, *args, env=None, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run(["salloc", f"-N{nodes}", f"--nodelist=cdnode[1-{nodes}]", "--quiet", *cli_argv(*args)],
                          capture_output=True, text=True, env=env or env_with(), timeout=timeout)


def _child_of(pid: int) -> int:
    for _ in range(100):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    stat = Path(entry.path, "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    return int(entry.name)
        time.sleep(0.1)
    raise AssertionError(f"salloc {pid} started no command")


def read_run(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


def marked_anywhere(run: dict) -> list[int]:
    """The nodes share this machine's pid namespace: /proc shows every node's processes."""
    return [pid for l in run["launches"] if l.get("marker") for pid in launcher.marked_pids(l["marker"])]


def mn_spec(tmp_path, **overrides):
    spec = dict(nproc_per_node=1, nnodes=2, sizes={"hidden": 256, "tokens": [1]}, trials=2, warmup=2, iters=10,
                timeout_s=90)
    spec.update(overrides)
    return write_spec(tmp_path / "mn.yaml", **spec)


def test_sweep_across_two_nodes_certifies_interrupts_and_resumes(cluster, tmp_path):
    """A real effect certified across two nodes, with every rank's host in run.json; Ctrl-C mid-run
    leaves nothing on either node and --resume (in a new allocation) finishes the run."""
    out = tmp_path / "run"
    # TORCH_DISTRIBUTED_DEBUG=DETAIL wraps every gloo call in checks (torch reads it at import): a
    # large, real effect that only a fresh process per launch can see
    spec = mn_spec(tmp_path, base_env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
                   configs={"fast": {"TORCH_DISTRIBUTED_DEBUG": "OFF"}}, iters=40)
    argv = ["salloc", "-N2", "--nodelist=cdnode[1-2]", "--quiet", *cli_argv("sweep", spec, "--out", out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_with(),
                            start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if any(l["status"] == "ok" for l in read_run(out)["launches"]):
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    # Ctrl-C at a terminal reaches the foreground command inside salloc: commdiag itself
    os.kill(_child_of(proc.pid), signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    run = read_run(out)
    assert run["launch"]["method"] == "slurm" and len(run["launch"]["slurm"]["nodes"]) == 2
    assert any(l["status"] == "pending" for l in run["launches"]), err
    time.sleep(2)
    assert marked_anywhere(run) == []

    done = salloc(2, "sweep", "--resume", out)
    assert done.returncode == 0, done.stdout + done.stderr
    run = read_run(out)
    assert run["state"] == "complete"
    assert "fast vs default" in done.stdout and "certified" in done.stdout and "faster" in done.stdout
    ok = [l for l in run["launches"] if l["status"] == "ok"]
    hosts = {r["hostname"] for l in ok for r in l["ranks"]}
    assert hosts == {"cdnode1", "cdnode2"} or len(hosts) == 2, hosts
    for l in ok:  # per-node proof: each rank, on its own node, saw the config's value
        want = "OFF" if l["config"] == "fast" else "DETAIL"
        assert {r["env_seen"]["TORCH_DISTRIBUTED_DEBUG"]["environ"] for r in l["ranks"]} == {want}
        assert {l2["launched_by"] for l2 in ok} == {"slurm"}
    assert marked_anywhere(run) == []


def test_a_hung_rank_on_node_two_and_a_crashed_one(cluster, tmp_path):
    """Rank 1 (on the second node) hangs, leaving a detached grandchild: killed at the deadline, nothing
    of the launch survives on either node.  A crashing rank ends its step at once (--kill-on-bad-exit)."""
    out = tmp_path / "run"
    spec = mn_spec(tmp_path, trials=1, timeout_s=25, configs={
        "hung": {"COMMDIAG_TEST_FAULT": "hang-detached", "COMMDIAG_TEST_FAULT_RANK": "1"},
        "crash": {"COMMDIAG_TEST_FAULT": "crash", "COMMDIAG_TEST_FAULT_RANK": "1"}})
    proc = salloc(2, "sweep", spec, "--out", out, "--no-confirm")
    assert proc.returncode == 3, proc.stdout + proc.stderr  # the sweep finished, some launches failed
    run = read_run(out)
    by = {l["config"]: l for l in run["launches"]}
    assert by["hung"]["status"] == "timeout" and by["hung"]["killed_survivors"] >= 1
    assert by["crash"]["status"] == "failed" and by["crash"]["wall_s"] < 25
    assert by["default"]["status"] == "ok"
    assert marked_anywhere(run) == []


def test_check_env_finds_a_variable_that_reached_one_node_only(cluster, tmp_path):
    """A site's task prolog drops NCCL_PROTO on the second node: that node, and only it, fails."""
    drop = STATE / "unset-on-cdnode2"
    drop.write_text("NCCL_PROTO\n")
    try:
        bad = salloc(2, "check-env", "--nodes", "--json", env=env_with(NCCL_PROTO="LL", NCCL_ALGO="Ring"))
    finally:
        drop.unlink()
    assert bad.returncode == 1, bad.stdout + bad.stderr
    nodes = {n["node"]: n for n in json.loads(bad.stdout)["nodes"]}
    assert nodes["cdnode1"]["ok"] and not nodes["cdnode2"]["ok"]
    failing = [v for v in nodes["cdnode2"]["check"]["vars"] if v["status"] == "missing"]
    assert [v["name"] for v in failing] == ["NCCL_PROTO"]
    good = salloc(2, "check-env", "--nodes", env=env_with(NCCL_PROTO="LL"))
    assert good.returncode == 0 and "every node has the expected settings" in good.stdout, good.stdout


def _nodes_run(tmp_path, name):
    out = tmp_path / name
    proc = salloc(3, "nodes", "--backend", "gloo", "--bytes", 262144, "--iters", 8, "--out", out, "--json")
    return proc, json.loads((out / "nodes.json").read_text())


def test_nodes_names_nobody_on_an_aa_fleet_and_the_rate_limited_node(cluster, tmp_path):
    proc, record = _nodes_run(tmp_path, "aa")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert record["state"] == "finished" and not any(f["slow"] for f in record["findings"])
    # a token bucket on node 3's interface (inside its namespace): every pair with node 3 slows down
    limit = ["ip", "netns", "exec", "cdn3", "tc", "qdisc", "add", "dev", "cdp3", "root", "tbf", "rate", "10mbit",
             "burst", "32kbit", "latency", "400ms"]
    subprocess.run(limit, check=True)
    try:
        proc, record = _nodes_run(tmp_path, "slow")
    finally:
        subprocess.run(["ip", "netns", "exec", "cdn3", "tc", "qdisc", "del", "dev", "cdp3", "root"], check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    slow = [(f["kind"], f["name"]) for f in record["findings"] if f["slow"]]
    assert ("node", "cdnode3") in slow and not [s for s in slow if s[0] == "node" and s[1] != "cdnode3"]
