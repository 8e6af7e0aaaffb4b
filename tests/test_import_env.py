"""A forked launch is exact by construction (docs/launch-methods.md, issue #28): the proof that no
variable a launch server lets a child change after the fork was read before it, measured on a real
server start under a getenv/secure_getenv interposer and the server's own os.environ spy; the rules
of what a child may change; and the end to end check (a config that changes TORCH_DISTRIBUTED_DEBUG,
read by torch at import, is measured with its own value under the default launch method)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil

import pytest

from commdiag.formats import results
from commdiag.measure import afterfork, launcher, serverpool

from conftest import REPO, run_cli, words, write_spec


def _bench():
    loader = importlib.util.spec_from_file_location("import_env", REPO / "benchmarks" / "import_env.py")
    mod = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler for the getenv interposer")
def test_no_variable_a_child_may_change_is_read_before_the_fork(tmp_path):
    """One real server start (its imports: torch, torch.distributed, the worker) under the interposer:
    nothing it lets a child change was read, at the C level or through os.environ; the committed
    C-level list of this torch build is complete; then the server itself refuses a launch that
    changes TORCH_DISTRIBUTED_DEBUG and forks one that changes only NCCL_* and rank variables."""
    bench = _bench()
    env = {k: v for k, v in os.environ.items() if not afterfork.is_candidate(k)}
    env["TORCH_DISTRIBUTED_DEBUG"] = "OFF"
    start = bench.server_start(tmp_path, env=env, launches=[
        {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
        {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "29999"}])
    verdict = bench.judge(start)
    assert verdict["holds"], verdict["problems"]
    # the interposer and the spy were in place: torch's import-time reads of #28 are among what they saw
    assert {"TORCH_DISTRIBUTED_DEBUG", "TORCH_CPP_LOG_LEVEL", "TORCH_SHOW_CPP_STACKTRACES"} <= set(start["c_reads"])
    assert verdict["c_read_count"] >= 50 and verdict["python_read_count"] >= 20
    proof = afterfork.Proof.from_json(start["ready"]["proof"])
    assert proof.measured and proof.torch in afterfork.C_LEVEL_READS
    assert not any(proof.safe(n) for n in start["c_reads"])  # the assertion of the proof, spelled out
    assert proof.safe("NCCL_PROTO") and proof.safe("MASTER_PORT") and not proof.safe("TORCH_DISTRIBUTED_DEBUG")
    (refused,), (started, ended) = start["replies"]
    assert "TORCH_DISTRIBUTED_DEBUG" in refused["refused"] and "not proven unread" in refused["refused"]
    assert isinstance(started["started"], int) and ended == {"exit": 1, "pid": started["started"]}
    assert "no-plan.json" in (tmp_path / "launch1.log").read_text()  # the child ran the worker


def test_the_spy_sees_every_way_of_reading_os_environ_and_leaves_no_trace(monkeypatch):
    monkeypatch.setenv("SPY_SET", "1")
    plain = type(os.environ).__getitem__
    spy = afterfork.EnvironSpy().install()
    try:
        os.environ.get("SPY_GET")
        "SPY_IN" in os.environ
        os.getenv("SPY_GETENV")
        os.environ["SPY_SET"]
        os.environb.get(b"SPY_BYTES")
        dict(os.environ)
    finally:
        spy.uninstall()
    assert {"SPY_GET", "SPY_IN", "SPY_GETENV", "SPY_SET", "SPY_BYTES"} <= spy.read
    assert spy.enumerated and "test_import_env.py" in spy.enumerated[0]
    assert type(os.environ).__getitem__ is plain
    before = len(spy.read)
    os.environ.get("AFTER_UNINSTALL")
    assert len(spy.read) == before


def test_what_a_child_may_change_after_the_fork():
    measured = afterfork.Proof(torch="2.13.0+cpu", measured=True, python_reads=["NCCL_NVLS_ENABLE"])
    assert measured.safe("NCCL_PROTO") and measured.safe("TORCH_NCCL_BLOCKING_WAIT") and measured.safe("RANK")
    assert not measured.safe("NCCL_NVLS_ENABLE")  # read through os.environ before the fork (CUDA torch does)
    for name in ("TORCH_DISTRIBUTED_DEBUG", "LD_PRELOAD", "OMP_NUM_THREADS", "PYTHONPATH", "CUDA_VISIBLE_DEVICES",
                 "MY_OWN"):
        assert not measured.safe(name)  # not a candidate: always in the server's start environment
    read_in_c = afterfork.Proof(torch="x", measured=True, c_reads=["NCCL_DEBUG"])
    assert not read_in_c.safe("NCCL_DEBUG") and read_in_c.safe("NCCL_ALGO")
    unmeasured = afterfork.Proof(torch="9.9.9", measured=False)
    assert not unmeasured.safe("NCCL_PROTO")  # C-read candidates need the build's list
    assert unmeasured.safe("MASTER_PORT")  # read by Python only: the spy is its whole proof
    start = {"A": "1", "NCCL_PROTO": "LL", "TORCHELASTIC_RUN_ID": "x"}
    assert measured.differing_unsafe(start, {"A": "1", "NCCL_ALGO": "Ring"}, ignore=("TORCHELASTIC_",)) == []
    assert measured.differing_unsafe(start, {"A": "2"}) == ["A", "TORCHELASTIC_RUN_ID"]
    assert afterfork.Proof.from_json(measured.to_json()) == measured


def test_the_spec_of_issue_28_is_certified_under_the_default_launch_and_its_a_a_is_not(tmp_path):
    """#28 item 1, as reported: TORCH_DISTRIBUTED_DEBUG=DETAIL in base_env, one config setting it OFF
    (the spec's own warmup and iterations).  A server forked with one value kept it in every child (no
    effect seen: ratios 0.96-1.26); now each value has launch servers of its own and the config is
    certified faster under the default launch (forkserver for gloo).  Then the A/A: ``aa`` is the
    default's own value under another name, tested in stage 2 either way: it must not be certified."""
    sizes = {"hidden": 1024, "tokens": [1, 2, 4]}
    base = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    runs = {}
    # 10 rounds instead of the 7 the one claim needs: on 2 loaded cores the rounds' noise was 50-55%
    # (2026-12-04, load average 15-20: the claim's ratio was 0.67-0.73 under both launch methods, p 0.02-0.04
    # at 7 rounds); the signed-rank test at 10 rounds tolerates a small round of the wrong sign
    sweeps = (("fast", {"fast": {"TORCH_DISTRIBUTED_DEBUG": "OFF"}}, {"confirm": {"rounds": 10}}),
              ("aa", {"aa": {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}}, {"confirm": {"configs": ["aa"]}}))
    for name, configs, extra in sweeps:
        spec = write_spec(tmp_path / f"{name}.yaml", sizes=sizes, trials=3, warmup=20, iters=200, base_env=base,
                          configs=configs, **extra)
        proc = run_cli("sweep", spec, "--out", tmp_path / name)
        assert proc.returncode == 0, proc.stderr[-3000:]
        run = results.load_run_json(tmp_path / name)
        assert run["launch"]["method"] == "forkserver" and "note" not in run["launch"]
        groups = run["launch"]["server_groups"]
        used = {}
        for l in run["launches"]:
            assert l["launched_by"] == "forkserver"
            used.setdefault(l["config"], set()).add(groups[l["server_group"]]["key"].get("TORCH_DISTRIBUTED_DEBUG"))
        runs[name] = (words(proc.stdout), used)
        assert not [p for l in run["launches"] for p in launcher.marked_pids(l["marker"])]
    text, used = runs["fast"]
    assert used == {"default": {"DETAIL"}, "fast": {"OFF"}}  # each value on servers started with it
    assert re.search(r"fast vs default, decode band \(eager\): certified \d+(\.\d+)?% faster", text), text[-3000:]
    text, used = runs["aa"]
    assert used == {"default": {"DETAIL"}, "aa": {"DETAIL"}}
    assert "aa vs default, decode band (eager): not certified" in text and "A/A check: PASS" in text
    assert not re.search(r"aa vs default[^:]*: certified", text)


def test_a_pool_shares_servers_across_nccl_settings_and_starts_new_ones_for_anything_else(tmp_path):
    """Real servers (1 rank): NCCL_* differences share one group; TORCH_DISTRIBUTED_DEBUG gets its own,
    started with it; a later NCCL-only launch goes back to the first group."""
    from test_forkserver import plan_for

    watch = ["NCCL_PROTO", "TORCH_DISTRIBUTED_DEBUG"]
    pool = serverpool.ServerPool(1, {k: v for k, v in os.environ.items() if not afterfork.is_candidate(k)})
    used, seen = [], []
    try:
        for n, config in enumerate(({"NCCL_PROTO": "LL"}, {"NCCL_PROTO": "Simple"},
                                    {"NCCL_PROTO": "LL", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, {})):
            plan = plan_for(tmp_path / f"l{n}", watch)
            outcome = pool.launch(n, config, {}, plan, deadline_s=120)
            assert outcome.exit_code == 0, (tmp_path / f"l{n}" / "launch.log").read_text()[-2000:]
            used.append(pool.last_group)
            rank0 = json.loads((tmp_path / f"l{n}" / "result.json").read_text())["ranks"][0]["env_seen"]
            seen.append({k: v["getenv"] for k, v in rank0.items()})
        started = pool.started
    finally:
        pool.close()
    assert used == [0, 0, 1, 0]
    assert [g["key"] for g in started] == [{}, {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}]
    assert started[0]["proof"]["measured"] and started[0]["proof"]["names_read"] > 0
    assert [s["NCCL_PROTO"] for s in seen] == ["LL", "Simple", "LL", None]
    assert [s["TORCH_DISTRIBUTED_DEBUG"] for s in seen] == [None, None, "DETAIL", None]


def _fake_pool(monkeypatch, proof: afterfork.Proof):
    """A 2-rank pool whose group starts are stubs reporting ``proof`` (no processes): the keying alone."""
    from types import SimpleNamespace

    pool = serverpool.ServerPool(2, {"PATH": "/usr/bin", "HOME": "/root"})
    closed = []

    def start(start_env, timeout_s):
        group = serverpool._Group(len(pool.started), start_env, {})
        pool.proof = proof
        group.servers = [SimpleNamespace(proof=proof) for _ in range(2)]
        pool.groups.append(group)
        pool.started.append({"index": group.index})
        return group

    monkeypatch.setattr(pool, "_start_group", start)
    monkeypatch.setattr(pool, "_close_group", lambda g: closed.append(g.index))

    def group_for(config):
        base = launcher.launch_env(pool.base_env, {"NCCL_NVLS_ENABLE": "0", **config}, {launcher.MARKER: "m"})
        envs = [{**base, **serverpool.rank_env(base, r, 2, 29500 + len(pool.started))} for r in range(2)]
        return pool._group_for(envs, deadline=1e12)

    return pool, closed, group_for


def test_pool_keys_groups_by_what_their_servers_proved_read(monkeypatch):
    """Servers that read NCCL_NVLS_ENABLE at import, as CUDA torch 2.11 does.  The first group starts
    without any candidate, proves NCCL_NVLS_ENABLE read, cannot serve a launch that sets it and is
    closed; the next starts with it and then serves every NCCL-only change; TORCH_DISTRIBUTED_DEBUG
    gets a group of its own."""
    pool, closed, group_for = _fake_pool(monkeypatch, afterfork.Proof(
        torch="2.11.0+cu130", measured=True, python_reads=["NCCL_NVLS_ENABLE"]))
    first = group_for({"NCCL_PROTO": "LL"})
    assert closed == [0] and first.index == 1
    assert first.start_env["NCCL_NVLS_ENABLE"] == "0" and "NCCL_PROTO" not in first.start_env
    assert group_for({"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring"}) is first
    assert group_for({}) is first
    debug = group_for({"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "NCCL_PROTO": "LL"})
    assert debug is not first and debug.start_env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert group_for({"NCCL_PROTO": "LL"}) is first and len(pool.started) == 3


def test_a_torch_build_without_a_c_level_list_keys_every_nccl_setting(monkeypatch):
    """No list for the build: NCCL_* values are part of a group's key (one group per distinct set);
    the rendezvous variables, read by Python only, still change per rank and launch."""
    pool, closed, group_for = _fake_pool(monkeypatch, afterfork.Proof(torch="9.9.9", measured=False))
    ll = group_for({"NCCL_PROTO": "LL"})
    assert closed == [0] and ll.start_env["NCCL_PROTO"] == "LL"
    simple = group_for({"NCCL_PROTO": "Simple"})
    assert simple is not ll and simple.start_env["NCCL_PROTO"] == "Simple"
    assert group_for({"NCCL_PROTO": "LL"}) is ll
