"""Rules from a sweep: ``commdiag tuner rules RUN_DIR`` and ``tuner/fromrun.py``.

Run folders are the recorded GPU run (benchmarks/h200x2-2026-11-30/nvlink2), synthetic folders in
the real formats (run.json format 3 + one launch result.json per launch, read back by
results.load_run exactly as a sweep's), and a real gloo sweep with --certify-sizes.  The rules
that come out are checked by the Python parser and by the compiled plugin (test_tuner's build).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from commdiag.analyse import certify, stats
from commdiag.errors import CommdiagError
from commdiag.formats import results
from commdiag.tuner import fromrun, rules
from conftest import REPO, one_message, run_cli, words, write_spec
from test_detect import READINGS, pcie_readings
from test_tuner import ALGO, PROTO, Comm, c_check, cells, lib, lib_path  # noqa: F401  (fixtures)

NVLINK2 = REPO / "benchmarks" / "h200x2-2026-11-30" / "nvlink2"
SIZES = {14336: 1, 114688: 8, 917504: 64, 1835008: 128, 3670016: 256, 14680064: 1024}
LL = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
LL128 = {"NCCL_PROTO": "LL128", "NCCL_ALGO": "Ring"}
BUS = ("00000000:00:06.0", "00000000:00:07.0")  # the recorded H200s (nvml-readings.json)


def make_run(folder: Path, configs: dict[str, dict], times: dict[str, dict[int, float]], *,
             base_env: dict | None = None, readings: dict | None = None, backend: str = "nccl",
             launches: int | None = None, certify_sizes: bool = True) -> Path:
    """A finished --certify-sizes run folder: every config's launches at ``times[config][size]`` us
    (default 100 us where not given) with a 1% launch-to-launch wobble, graph mode, 2 ranks, 1 node."""
    folder.mkdir(parents=True)
    base_env = {"NCCL_NVLS_ENABLE": "0", **(base_env or {})}
    names = ["default", *configs]
    n = launches or certify.size_claims_needed(len(configs), len(SIZES), stats.ALPHA / 2)[1]
    rng = random.Random(7)
    run_configs = [{"name": c, "env": {**base_env, **configs.get(c, {})}, "overrides": configs.get(c, {}),
                    "origin": "default" if c == "default" else "grid"} for c in names]
    env_of = {c["name"]: c["env"] for c in run_configs}
    entries = []
    for trial in range(n):
        order = names[:]
        rng.shuffle(order)
        for c in order:
            index = len(entries)
            ranks = []
            for r in range(2):
                samples = {str(s): [round(times.get(c, {}).get(s, 100.0) * wobble * (1 + 0.002 * ((i * 7) % 5)), 4)
                                    for i in range(20)]
                           for s, wobble in ((s, 1 + rng.uniform(-0.01, 0.01)) for s in SIZES)}
                ranks.append({"rank": r, "samples": {"torch": {"graph": samples}}, "enqueue_us": {"torch": {}},
                              "wrong": {"torch": {str(s): 0 for s in SIZES}},
                              "env_seen": {k: {"environ": v, "getenv": v} for k, v in env_of[c].items()}})
            folder_l = results.launch_dir(folder, index)
            folder_l.mkdir(parents=True)
            (folder_l / "result.json").write_text(json.dumps({"format": "commdiag-launch", "version": 2,
                                                              "ranks": ranks}))
            entries.append({"index": index, "config": c, "trial": trial, "stage": 1, "status": "ok", "wrong": 0,
                            "ranks": [{k: v for k, v in r.items() if k not in ("samples", "enqueue_us")}
                                      for r in ranks]})
    fingerprint = {"launcher": {"hostname": "vm"},
                   "worker": {"nccl": "2.28.9", "gpus": [{"rank": r, "gpu_name": "NVIDIA H200", "pci_bus_id": BUS[r]}
                                                         for r in range(2)]}}
    if readings is not None:
        fingerprint["nvml_readings"] = readings
    run = {"format": results.RUN_FORMAT, "version": results.RUN_FORMAT_VERSION, "commdiag_version": "0.1.0",
           "created_utc": "2026-11-30T20:00:00Z", "state": "complete", "spec_file": "sweeps/grid.yaml",
           "spec": {"name": "grid", "backend": backend, "nproc_per_node": 2, "nnodes": 1, "modes": ["graph"],
                    "vias": ["torch"], "sizes": [{"bytes": s, "tokens": t} for s, t in SIZES.items()],
                    "bands": {}, "base_env": base_env, "trials": n},
           "nproc_per_node": 2, "world_size": 2, "seed": 7, "configs": run_configs, "launches": entries,
           "fingerprint": fingerprint, "warnings": [], "confirm_requested": False}
    if certify_sizes:
        run["certify_sizes"] = {"trials": n}
    (folder / "run.json").write_text(json.dumps(run))
    return folder


# LL 20% faster at 114688 and 917504, LL128 15% faster at 1835008; LL 2x slower from 3.6 MB (certified
# slower, never a rule); nothing else differs.
STORY = {"ll": {114688: 80.0, 917504: 80.0, 3670016: 200.0, 14680064: 200.0}, "ll128": {1835008: 85.0}}
EXPECTED = [
    "coll=allreduce min_bytes=114688 max_bytes=917504 nranks=2 nnodes=1 algo=ring proto=ll channels=0 mode=any",
    "coll=allreduce min_bytes=1835008 max_bytes=1835008 nranks=2 nnodes=1 algo=ring proto=ll128 channels=0 mode=any",
]


def _outcomes(res) -> dict[int, str]:
    return {d.size_bytes: d.outcome for d in res.sizes}


# ------------------------------------------------------------------ (a) the recorded GPU run


def test_recorded_gpu_run_without_certify_sizes_says_what_to_run():
    with pytest.raises(CommdiagError) as e:
        fromrun.derive(NVLINK2)
    msg = str(e.value)
    assert msg.startswith(f"{NVLINK2}: no per-size certification: this run was swept without --certify-sizes")
    assert "commdiag sweep sweeps/nvlink2.yaml --certify-sizes" in msg
    proc = run_cli("tuner", "rules", NVLINK2)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert one_message(proc.stderr) == words(f"commdiag: error: {msg}")  # one message, wrapped at 100 columns


def test_unfinished_certification_is_refused(tmp_path):
    run_dir = make_run(tmp_path / "run", {"ll": LL}, STORY, launches=3)
    run = json.loads((run_dir / "run.json").read_text())
    run["launches"][-1]["status"] = "pending"
    (run_dir / "run.json").write_text(json.dumps(run))
    with pytest.raises(CommdiagError, match=r"per-size certification is unfinished .* commdiag sweep --resume"):
        fromrun.derive(run_dir)


# ------------------------------------------------------------------ (b) merged rules


def test_certified_winners_merge_into_the_expected_rules_which_both_parsers_accept(tmp_path, lib, monkeypatch):
    run_dir = make_run(tmp_path / "run", {"ll": LL, "ll128": LL128}, STORY, readings=READINGS)
    res = fromrun.derive(run_dir)
    assert [r.to_line() for r in res.rules] == EXPECTED
    assert _outcomes(res) == {14336: fromrun.NONE_CERTIFIED, 114688: fromrun.RULE, 917504: fromrun.RULE,
                              1835008: fromrun.RULE, 3670016: fromrun.NONE_CERTIFIED,
                              14680064: fromrun.NONE_CERTIFIED}
    assert (res.nranks, res.nnodes, res.mode) == (2, 1, "graph")
    winners = {d.size_bytes: (d.winner.config, round(d.winner.ratio, 2)) for d in res.sizes if d.winner}
    assert winners == {114688: ("ll", 0.8), 917504: ("ll", 0.8), 1835008: ("ll128", 0.85)}
    # the file: the Python twin of the plugin's parser reads exactly these rules back
    assert [r.to_line() for r in rules.parse_bytes(res.text.encode())] == EXPECTED
    assert fromrun.rules_text(run_dir).splitlines()[-2:] == EXPECTED
    head = res.text.splitlines()
    assert head[0] == "# commdiag-tuner-rules 1" and head[1] == f"# generated by commdiag 0.1.0 from {run_dir}"
    assert re.search(r"\n#   917504 B \(64 tok\): ll ratio 0\.8\d\d \((19\.\d|20\.0)% faster\), p = 0\.000\d+\n", res.text)
    # the plugin reads the same file and applies the rules at the certified sizes only
    path = tmp_path / "rules.txt"
    proc = run_cli("tuner", "rules", run_dir, "--out", path)
    assert proc.returncode == 0, proc.stderr
    assert [ln for ln in path.read_text().splitlines() if not ln.startswith("#")] == EXPECTED
    n, canon = c_check(lib, path)
    assert n == 2 and [ln.split(" ", 1)[1] for ln in canon.splitlines()] == EXPECTED
    monkeypatch.setenv("NCCL_TUNER_CONFIG_FILE", str(path))
    comm = Comm(lib)
    for size, want in ((114688, "ll"), (500000, "ll"), (917504, "ll"), (1835008, "ll128")):
        table, channels = comm.coll("allreduce", size)
        assert cells(table)[ALGO["ring"]][PROTO[want]] == 0.0 and channels == 0, size
    for size in (14336, 917505, 1835007, 3670016):  # outside every certified range: NCCL's costs stand
        table, _ = comm.coll("allreduce", size)
        assert 0.0 not in [v for row in cells(table) for v in row], size
    comm.finalize()
    # the terminal table: one row per size, the rules, where they went
    out = proc.stdout
    assert "    114688     8  ll -> ring/ll" in out and "     14336     1  none certified (2 tested)" in out
    assert "  3670016   256  none certified (2 tested; slower: ll)" in out
    assert f"written: {path}" in out
    assert all(len(ln) <= 100 for ln in out.splitlines() if str(tmp_path) not in ln and "coll=" not in ln)


def test_json_is_the_versioned_envelope(tmp_path):
    run_dir = make_run(tmp_path / "run", {"ll": LL, "ll128": LL128}, STORY, readings=READINGS)
    proc = run_cli("tuner", "rules", run_dir, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert (data["format"], data["version"]) == ("commdiag-tuner-rules-derived", 1)
    assert data["rules"] == EXPECTED and data["written"] is None and data["rule_mode"] == "any"
    assert [d["outcome"] for d in data["sizes"]] == ["none certified", "rule", "rule", "rule", "none certified",
                                                     "none certified"]
    assert data["sizes"][3]["winner"]["choice"] == {"algo": "ring", "proto": "ll128", "channels": 0}


def test_channels_come_from_nccl_max_nchannels(tmp_path):
    ch = {**LL, "NCCL_MAX_NCHANNELS": "8"}
    run_dir = make_run(tmp_path / "run", {"ll8": ch}, {"ll8": {114688: 80.0}})
    (rule,) = fromrun.derive(run_dir).rules
    assert (rule.min_bytes, rule.max_bytes, rule.algo, rule.proto, rule.channels) == (114688, 114688, "ring", "ll", 8)


# ------------------------------------------------------------------ (c) refusals


def test_ll128_needs_a_recorded_nvlink_topology_or_the_users_word(tmp_path):
    configs = {"ll": LL, "ll128": LL128}
    bare = make_run(tmp_path / "bare", configs, STORY)  # today's sweeps record no topology
    res = fromrun.derive(bare)
    assert [r.to_line() for r in res.rules] == EXPECTED[:1]
    d = next(d for d in res.sizes if d.size_bytes == 1835008)
    assert d.outcome == fromrun.REFUSED and d.winner.config == "ll128"
    assert "records no GPU topology" in d.winner.why and "--allow-ll128" in d.winner.why
    assert any(r.startswith("1835008 B: ll128: refused: the run records no GPU topology") for r in res.refusals)
    allowed = fromrun.derive(bare, allow_ll128=True)
    assert [r.to_line() for r in allowed.rules] == EXPECTED
    assert any("allowed on your word (--allow-ll128)" in n for n in allowed.notes)
    proc = run_cli("tuner", "rules", bare)
    assert "1835008   128  refused: ll128" in proc.stdout and "why: the run records no GPU topology" in proc.stdout
    # PCIe between the run's GPUs: refused even with --allow-ll128
    pcie = make_run(tmp_path / "pcie", configs, STORY, readings=pcie_readings(True))
    res = fromrun.derive(pcie, allow_ll128=True)
    assert [r.to_line() for r in res.rules] == EXPECTED[:1]
    why = next(d for d in res.sizes if d.size_bytes == 1835008).winner.why
    assert why.startswith("GPUs 0 and 1 are joined by PHB (pcie-p2p), not NVLink")
    # NVLink, but NCCL_P2P_DISABLE=1 for every config: traffic went through host memory
    off = make_run(tmp_path / "p2poff", configs, STORY, readings=READINGS, base_env={"NCCL_P2P_DISABLE": "1"})
    res = fromrun.derive(off, allow_ll128=True)
    assert [r.to_line() for r in res.rules] == EXPECTED[:1]
    assert "NCCL_P2P_DISABLE=1 was in effect" in next(d for d in res.sizes if d.size_bytes == 1835008).winner.why
    # across nodes the run's topology says nothing about the path between them
    run = json.loads((run_dir_nv := make_run(tmp_path / "nv", configs, STORY, readings=READINGS)).joinpath(
        "run.json").read_text())
    assert fromrun._ll128_problem(run, {}, 1, False) == (None, None)
    assert "LL128 across nodes" in fromrun._ll128_problem(run, {}, 2, False)[0]
    assert fromrun._ll128_problem(run, {}, 2, True)[0] is None
    assert [r.to_line() for r in fromrun.derive(run_dir_nv).rules] == EXPECTED


def test_nvls_collnet_pat_and_unexpressible_configs_are_refused_and_the_next_best_wins(tmp_path):
    seed = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_BUFFSIZE": "16777216"}
    configs = {"seed": seed, "nvls": {"NCCL_PROTO": "Simple", "NCCL_ALGO": "NVLS"},
               "collnet": {"NCCL_PROTO": "Simple", "NCCL_ALGO": "CollNetDirect"},
               "pat": {"NCCL_PROTO": "Simple", "NCCL_ALGO": "PAT"}, "ll": LL, "proto-only": {"NCCL_PROTO": "LL"}}
    times = {"seed": {114688: 70.0, 917504: 70.0}, "ll": {917504: 80.0}, "nvls": {1835008: 60.0},
             "collnet": {3670016: 60.0}, "pat": {14680064: 60.0}, "proto-only": {14336: 60.0}}
    res = fromrun.derive(make_run(tmp_path / "run", configs, times, readings=READINGS))
    by = {d.size_bytes: d for d in res.sizes}
    # seed alone at 114688: not expressible, the variable named
    assert by[114688].outcome == fromrun.NOT_EXPRESSIBLE and "NCCL_BUFFSIZE" in by[114688].winner.why
    # at 917504 seed is faster still, but ll (certified faster too) is the best that can be a rule
    assert by[917504].outcome == fromrun.RULE and by[917504].winner.config == "ll"
    assert [c.config for c in by[917504].passed_over] == ["seed"]
    assert by[1835008].outcome == fromrun.REFUSED and "multicast" in by[1835008].winner.why
    assert by[3670016].outcome == fromrun.REFUSED and "CollNet network" in by[3670016].winner.why
    assert by[14680064].outcome == fromrun.REFUSED and "all-reduce" in by[14680064].winner.why
    assert by[14336].outcome == fromrun.NOT_EXPRESSIBLE and "NCCL_ALGO is not set" in by[14336].winner.why
    assert [r.to_line() for r in res.rules] == [
        "coll=allreduce min_bytes=917504 max_bytes=917504 nranks=2 nnodes=1 algo=ring proto=ll channels=0 mode=any"]
    assert len(res.refusals) == 6


def test_nothing_certifiable_writes_no_file_and_exits_0(tmp_path):
    run_dir = make_run(tmp_path / "run", {"seed": {**LL, "NCCL_BUFFSIZE": "1"}}, {"seed": {114688: 70.0}})
    out = tmp_path / "rules.txt"
    proc = run_cli("tuner", "rules", run_dir, "--out", out)
    assert proc.returncode == 0 and not out.exists()
    assert ("no rules: every certified per-size winner was refused or is not expressible: keep NCCL's choices: "
            "no file written") in words(proc.stdout)
    assert "why: NCCL_BUFFSIZE differs from default" in proc.stdout


def test_hostile_names_never_reach_the_file_unsafely(tmp_path):
    evil = "ll \u00e9\u2713 # coll=allreduce"  # control characters are refused by run.json already
    run_dir = make_run(tmp_path / "run\nnl", {evil: LL}, {evil: {114688: 80.0}})
    res = fromrun.derive(run_dir)
    assert len(res.rules) == 1 and rules.parse_bytes(res.text.encode()) == list(res.rules)
    assert all(" " <= ch < "\x7f" for ch in res.text.replace("\n", ""))
    assert "from " + str(run_dir).replace("\n", "?") in res.text


def test_a_gloo_run_never_makes_rules(tmp_path):
    run_dir = make_run(tmp_path / "run", {"ll": LL}, {"ll": {114688: 80.0}}, backend="gloo")
    res = fromrun.derive(run_dir)
    assert not res.rules and res.sizes[1].outcome == fromrun.REFUSED and "gloo" in res.sizes[1].winner.why


# ------------------------------------------------------------------ (d) a real CPU sweep


def test_real_gloo_sweep_with_certify_sizes_gives_no_rules(tmp_path):
    spec = write_spec(tmp_path / "tiny.yaml", sizes={"bytes": [4096, 65536]}, iters=10, reuse_process=True,
                      configs={"ll": LL})
    run_dir = tmp_path / "run"
    proc = run_cli("sweep", spec, "--out", run_dir, "--certify-sizes", "--no-confirm")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "rules.txt"
    proc = run_cli("tuner", "rules", run_dir, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("no certified per-size winner: keep NCCL's choices: no file written")
    assert "      4096        none certified (1 tested)" in proc.stdout
    assert "     65536        none certified (1 tested)" in proc.stdout
    assert not out.exists()
    text = fromrun.rules_text(run_dir)
    assert rules.parse_bytes(text.encode()) == [] and "# no rules: no certified per-size winner" in text


def test_an_nccl_sweep_records_the_nvml_topology_that_tuner_rules_reads(monkeypatch, tmp_path):
    """new_run stores the launching node's NVML readings (replayed here from the 2x H200 recording), so
    LL128 rules from that run need no --allow-ll128; without NVML the reason is stored instead."""
    from commdiag.environment import topology
    from commdiag.formats.spec import load_spec
    from commdiag.measure import sweep

    recorded = json.loads((REPO / "tests/fixtures/h200x2-nvlink/nvml-readings.json").read_text())
    spec = load_spec(write_spec(tmp_path / "s.yaml", backend="nccl", modes=["graph"]))
    monkeypatch.setattr(topology, "read_nvml", lambda: recorded)
    run = sweep.new_run(spec, tmp_path / "run", 2)
    assert run["fingerprint"]["nvml_readings"] == recorded
    assert fromrun.recorded_topology(run) is not None
    assert fromrun._ll128_problem(run, {}, 1, False) == (None, None)  # NVLink everywhere: LL128 allowed

    def unavailable():
        raise topology.NvmlUnavailable("NVML did not initialise: no driver")

    monkeypatch.setattr(topology, "read_nvml", unavailable)
    run = sweep.new_run(spec, tmp_path / "run2", 2)
    assert "nvml_readings" not in run["fingerprint"]
    assert run["fingerprint"]["nvml_readings_error"] == "NVML did not initialise: no driver"
    assert fromrun.recorded_topology(run) is None
    gloo = sweep.new_run(load_spec(write_spec(tmp_path / "g.yaml")), tmp_path / "run3", 2)
    assert "nvml_readings" not in gloo["fingerprint"] and "nvml_readings_error" not in gloo["fingerprint"]
