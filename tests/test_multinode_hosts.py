"""Multi-node outside Slurm: one torchrun agent per host through the spec's node_command, for real.

The hosts are the test cluster's nodes (tests/cluster/slurm-2node.sh up 3; .ci/run starts it): each a
network namespace with its own address and a UTS namespace with its own host name.  node_command
enters both namespaces of a node (those of its slurmd: ``nsenter --target PID --net --uts``) and runs
commdiag's shell command line there, as ``ssh {host}`` would on a real cluster, so gloo and torch's
store bind the node's own address.  No ssh, nothing mocked; Slurm itself is not used.

Skipped, saying why, where the namespaces are missing (COMMDIAG_REQUIRE_CLUSTER=1, as CI sets, makes
that a failure).  In the slow set (conftest.SLOW): each launch imports torch on every node."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commdiag.measure import launcher

from conftest import REPO, write_spec

STATE = Path(os.environ.get("SLURM_TEST_DIR", "/tmp/commdiag-slurm"))
HOSTS = ["cdnode1", "cdnode2"]
# {host}'s slurmd pid, then its network and UTS namespaces; commdiag's command line is the last argument
ENTER = ('exec nsenter --target "$(cat ' + str(STATE) + '/slurmd-$1.pid)" --net --uts -- sh -c "$2"')
NODE_COMMAND = ["sh", "-c", ENTER, "sh", "{host}"]


def _why_not() -> str | None:
    if os.geteuid() != 0 or not shutil.which("nsenter"):
        return "entering the test cluster's namespaces needs root and nsenter"
    for host in HOSTS:
        try:
            pid = int((STATE / f"slurmd-{host}.pid").read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return (f"no test cluster node {host} (no live slurmd in {STATE}); start one as root with "
                    "`bash tests/cluster/slurm-2node.sh up 3`")
    return None


@pytest.fixture(scope="module")
def nodes():
    why = _why_not()
    if why:
        if os.environ.get("COMMDIAG_REQUIRE_CLUSTER"):
            pytest.fail(why)
        pytest.skip(why)
    return HOSTS


def cli(*args, timeout=900) -> subprocess.CompletedProcess:
    env = {**os.environ}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    for name in [n for n in env if n.startswith("SLURM_")]:  # outside Slurm: no allocation of the caller
        del env[name]
    return subprocess.run([sys.executable, "-m", "commdiag.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=REPO)


def hosts_spec(tmp_path, **overrides) -> Path:
    spec = dict(nproc_per_node=1, hosts=HOSTS, node_command=NODE_COMMAND, sizes={"hidden": 256, "tokens": [1]},
                trials=1, warmup=2, iters=10, timeout_s=120)
    spec.update(overrides)
    return write_spec(tmp_path / "hosts.yaml", **spec)


def read_run(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


def marked_anywhere(run: dict) -> list[int]:
    """The namespaces share this machine's pid namespace: /proc shows every node's processes."""
    return [pid for l in run["launches"] if l.get("marker") for pid in launcher.marked_pids(l["marker"])]


def test_a_sweep_across_two_hosts_through_node_command(nodes, tmp_path):
    """One agent per host: rank i runs on host i, each rank on its own node saw the config's value
    (passed in the remote command line, not inherited), and nothing of any launch is left."""
    out = tmp_path / "run"
    spec = hosts_spec(tmp_path, configs={"simple": {"NCCL_PROTO": "Simple"}})
    proc = cli("sweep", spec, "--out", out, "--no-confirm")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = read_run(out)
    assert run["launch"]["method"] == "torchrun" and run["launch"]["hosts"]["hosts"] == HOSTS
    assert len(run["launches"]) == 2
    for l in run["launches"]:
        assert l["status"] == "ok" and l["launched_by"] == "torchrun" and l["killed_survivors"] == 0
        assert {r["rank"]: r["hostname"] for r in l["ranks"]} == {0: "cdnode1", 1: "cdnode2"}
        if l["config"] == "simple":
            assert [r["env_seen"]["NCCL_PROTO"]["environ"] for r in l["ranks"]] == ["Simple", "Simple"]
        summary = (out / "launches" / f"{l['index']:04d}" / "torchrun.log").read_text()
        assert "node 1 host cdnode2: exit 0" in summary and "rendezvous cdnode1:" in summary
    assert marked_anywhere(run) == []


def test_a_hung_rank_on_host_two_is_killed_at_the_deadline(nodes, tmp_path):
    """Rank 1 (host 2) hangs and leaves a detached grandchild in a session of its own: at the deadline
    every agent is stopped and the reaper, through node_command, ends the grandchild; nothing is left."""
    out = tmp_path / "run"
    # 90 s: a healthy launch takes 50-70 s on this project's 2 loaded cores (two imports of torch)
    spec = hosts_spec(tmp_path, timeout_s=90, configs={
        "hung": {"COMMDIAG_TEST_FAULT": "hang-detached", "COMMDIAG_TEST_FAULT_RANK": "1"}})
    proc = cli("sweep", spec, "--out", out, "--no-confirm")
    assert proc.returncode == 3, proc.stdout + proc.stderr  # the sweep finished; a launch failed
    run = read_run(out)
    by = {l["config"]: l for l in run["launches"]}
    assert by["default"]["status"] == "ok"
    hung = by["hung"]
    assert hung["status"] == "timeout" and hung["killed_survivors"] >= 1
    summary = (out / "launches" / f"{hung['index']:04d}" / "torchrun.log").read_text()
    assert "deadline (timeout_s) passed" in summary
    assert marked_anywhere(run) == []


def test_ctrl_c_leaves_nothing_on_any_host_and_resume_finishes(nodes, tmp_path):
    """Ctrl-C after the first launch: the launch in flight is pending again and nothing of it is left on
    either host; --resume checks the hosts again and finishes the run."""
    import signal
    import time

    out = tmp_path / "run"
    spec = hosts_spec(tmp_path, trials=3)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.Popen([sys.executable, "-m", "commdiag.cli", "sweep", str(spec), "--out", str(out), "--no-confirm"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if any(l["status"] == "ok" for l in read_run(out)["launches"]):
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    time.sleep(3)  # the next launch's agents are starting on both hosts
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    run = read_run(out)
    assert any(l["status"] == "pending" for l in run["launches"]), err
    assert marked_anywhere(run) == []
    done = cli("sweep", "--resume", out)
    assert done.returncode == 0, done.stdout + done.stderr
    run = read_run(out)
    assert run["state"] == "complete" and {l["status"] for l in run["launches"]} == {"ok"}
    assert marked_anywhere(run) == []


def test_a_node_command_that_cannot_start_is_one_clear_error(tmp_path):
    """A missing program: one error naming the spec and node_command, before any launch, no traceback."""
    out = tmp_path / "run"
    spec = hosts_spec(tmp_path, node_command=["commdiag-no-such-ssh", "{host}"])
    proc = cli("sweep", spec, "--out", out, "--no-confirm", timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "node_command[0]" in proc.stderr and "commdiag-no-such-ssh" in proc.stderr and str(spec) in proc.stderr
    assert not (out / "launches").exists()


def test_a_host_that_cannot_run_commdiag_is_one_clear_error_before_any_launch(nodes, tmp_path):
    """node_command runs, but on each host the program it hands commdiag's line to is missing (a remote
    side without the shell, the Python or the run folder): one error naming each host, before any
    launch; the run stays resumable."""
    out = tmp_path / "run"
    broken = ENTER.replace("-- sh -c", "-- commdiag-no-such-shell -c")
    spec = hosts_spec(tmp_path, node_command=["sh", "-c", broken, "sh", "{host}"])
    proc = cli("sweep", spec, "--out", out, "--no-confirm", timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    for i, host in enumerate(HOSTS):
        assert f"host {host} (node {i}): exit 127" in proc.stderr, proc.stderr
    assert "commdiag-no-such-shell" in proc.stderr
    assert {l["status"] for l in read_run(out)["launches"]} == {"pending"}
    assert not list((out / "launches").glob("*/plan.json")) if (out / "launches").exists() else True


def test_preflight_names_what_a_multinode_torchrun_spec_lacks(tmp_path):
    """Checked before any work, with no namespaces needed: node_command's program must be here, nccl
    needs nproc_per_node (the GPUs are on the hosts), and a multi-node torchrun spec with neither
    rdzv_endpoint nor hosts (a run.json's spec, which no longer passes through the spec checks) says
    what to do."""
    from commdiag.errors import CommdiagError
    from commdiag.formats.spec import Spec, load_spec
    from commdiag.measure import sweep

    missing = load_spec(hosts_spec(tmp_path, node_command=["commdiag-no-such-ssh", "{host}"]))
    with pytest.raises(CommdiagError, match=r"node_command\[0\]: program 'commdiag-no-such-ssh' is not found"):
        sweep.preflight(missing)
    nccl = load_spec(hosts_spec(tmp_path, backend="nccl", nproc_per_node=None, node_command=["true", "{host}"]))
    with pytest.raises(CommdiagError, match="nproc_per_node: required with hosts"):
        sweep.preflight(nccl)
    assert sweep.preflight(load_spec(hosts_spec(tmp_path, node_command=["true", "{host}"]))) == 1
    bare = {**missing.to_json(), "hosts": (), "node_command": (), "rdzv_endpoint": None}
    with pytest.raises(CommdiagError, match="hosts.*node_command"):
        sweep.preflight(Spec.from_json(bare))


def test_node_command_line_is_one_quoted_shell_argument():
    """The remote command line survives a shell word for word: values with spaces, quotes, $ and
    newlines arrive as they were (run through a real sh, as ssh's remote side does)."""
    from commdiag.measure import hosts

    env = {"A": "two words", "B": "it's $HOME `x`\nline2", "COMMDIAG_LAUNCH_ID": "m"}
    line = hosts.shell_line([sys.executable, "-c", "import os,json;print(json.dumps(dict(os.environ)))"], env, "/")
    argv = hosts.node_argv(["sh", "-c", "exec sh -c \"$1\"", "{host}-{index}"], "h", 1, line)
    assert argv[3] == "h-1"
    seen = __import__("json").loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    seen.pop("LC_CTYPE", None)  # set by Python itself (PEP 538 locale coercion)
    assert seen == env  # env -i: exactly the launch's environment, nothing of this shell's
    line = hosts.shell_line([sys.executable, "-c", "import os;print(os.environ.get('PWD'), os.getcwd())"],
                            {"PWD": "/elsewhere", "HOSTNAME": "here"}, "/tmp")
    assert subprocess.run(["sh", "-c", line], capture_output=True, text=True).stdout.split() == ["None", "/tmp"]
    assert hosts.rdzv_host("root@node1") == "node1"
