"""Confounders (analyse/confounders.py): which machine conditions mark a claim, and how the verdict
text, --json, the report and the profile name them.  Launch records come from the replayed NVML
snapshots of test_machine_state (the 1x H200 capture's fields, values changed where a condition is
needed); the run folders are test_report's synthetic ones, certified by commdiag's own stage 2."""

from __future__ import annotations

import json

from commdiag.analyse import confounders, report, verdict
from commdiag.formats import profile, results
from commdiag.measure import machinestate as ms, nvmlreplay
from test_machine_state import OTHER, constructed, record
from test_report import add_stage2, make_run

QUIET = ["load", "load", "load"]
HOT = ["load", "hot", "load"]
BESIDE = ["load", "other", "load"]


def machine_state() -> dict:
    return ms.open_sampler("gloo", nvml=nvmlreplay.ReplayNvml(constructed())).describe()


def certified(tmp_path, during_of=lambda launch: QUIET):
    """A run where ``fast`` is certified 20% faster than default in stage 2, each launch carrying the
    machine record of ``during_of(launch)``'s snapshots."""
    sizes = [4096, 65536, 1048576]
    table = {"default": {s: [10.0, 10.3, 9.9] for s in sizes}, "fast": {s: [8.0, 8.2, 7.9] for s in sizes}}
    run_dir = make_run(tmp_path / "run", table, configs={"default": {}, "fast": {"NCCL_PROTO": "LL"}})
    add_stage2(run_dir, {"default": 10.0, "fast": 8.0})
    run = json.loads((run_dir / "run.json").read_text())
    run["machine_state"] = machine_state()
    rec = constructed()
    for launch in run["launches"]:
        launch["machine"] = record(rec, during_of(launch))
    (run_dir / "run.json").write_text(json.dumps(run))
    return run_dir, run


def stage2(tmp_path) -> dict[str, list[int]]:
    """The stage-2 launch indices per config in ``certified``'s run (the same in every such run)."""
    _, run = certified(tmp_path / "probe")
    return {c: [l["index"] for l in run["launches"] if l.get("stage") == 2 and l["config"] == c]
            for c in ("default", "fast")}


def test_throttling_in_one_arm_only_marks_the_certified_claim(tmp_path):
    hot = set(stage2(tmp_path)["default"][:2])
    run_dir, run = certified(tmp_path, lambda l: HOT if l["index"] in hot else QUIET)
    v = verdict.evaluate_run(results.load_run(run_dir))
    (cert,) = [c for c in v.certifications if c.claim.band == "decode"][:1]
    assert cert.certified and cert.result == "faster"
    check = v.confounders.for_claim(cert.claim)
    assert check.confounded and check.stage == 2
    k = sum(1 for l in run["launches"] if l.get("stage") == 2 and l["config"] == "default")
    assert check.confounders[0] == (f"2 of default's {k} stage-2 launches ran with thermal throttling "
                                    f"(HW_THERMAL_SLOWDOWN on GPU 0, HW_THERMAL_SLOWDOWN on GPU 1); 0 of fast's {k}")
    # HW_SLOWDOWN comes with HW_THERMAL_SLOWDOWN (nvidia-smi nests it there): not named twice
    assert not any("hardware slowdown" in t for t in check.confounders)
    # the SM clock under load: each launch's lowest, 1755 MHz in the hot ones; medians 1980 vs 1980: no mark
    assert not any("clocks" in t for t in check.confounders)
    text = report.render_verdicts(v)
    assert f"    certified faster, but confounded: 2 of default's {k} stage-2 launches ran with thermal" in text
    assert "  but confounded (the machine differed between its arms, above): check the machine" in text
    assert all(len(line) <= 100 for line in text.splitlines() if "confounded" in line or line.startswith(
        ("machine", "  and:", "    and:")))
    j = v.to_json()["confounders"]
    assert j["recorded"] and [c["confounded"] for c in j["claims"]] == [c.certified for c in v.certifications]
    # a confounded winner gets no profile (nothing to install until a clean rerun), and an older
    # profile of that band written by commdiag is removed
    (run_dir / "profile-decode.env").write_text(profile.PROFILE_HEADER + "\nNCCL_PROTO=LL\n")
    assert "profile-decode.env" not in report.write_profiles(run_dir, v, run)
    assert not (run_dir / "profile-decode.env").exists()
    assert "(no profile was written)" in text
    # the report: the claim's answer cell, and the machine section (report.build_html puts both in)
    assert "certified faster, but confounded: 2 of default" in report._certified_section(v)
    section = report.machinereport.html_section(run, v)
    assert "<b>fast band decode (graph)</b>: confounded: 2 of default" in section
    assert section.count("<tr><td>") == len(run["launches"])


def test_a_condition_both_arms_met_alike_is_a_note_and_marks_nothing(tmp_path):
    arms = stage2(tmp_path)
    one_each = {arms["default"][0], arms["fast"][3]}
    run_dir, run = certified(tmp_path, lambda l: BESIDE if l["index"] in one_each else QUIET)
    v = verdict.evaluate_run(results.load_run(run_dir))
    assert v.certifications and not any(v.confounders.for_claim(c.claim).confounded for c in v.certifications)
    a, b = sorted(one_each)
    assert f"another process (pid {OTHER}, python) used GPU 0 during launches {a}, {b}" in v.confounders.notes
    text = report.render_verdicts(v)
    assert "but confounded" not in text and "machine state during the launches:" in text
    assert f"  another process (pid {OTHER}, python) used GPU 1 during launches {a}, {b}" in text


def test_every_condition_is_found_in_a_launch_record():
    run = {"machine_state": machine_state(), "launches": []}
    launch = {"index": 17, "config": "default", "stage": 2, "status": "ok",
              "machine": record(constructed(), ["load", "hot", "other", "gen4"], after="after-hot")}
    facts = {(f.group, f.detail) for f in confounders.launch_facts(launch, run)}
    assert facts >= {
        (confounders.THERMAL, "HW_THERMAL_SLOWDOWN on GPU 0"),
        (confounders.THERMAL, "NVML thermal violation time on GPU 0"),
        (confounders.PROCESS, f"pid {OTHER}, python, GPU 1"),
        (confounders.LINK, "GPU 0 at Gen4 x16 under load, max Gen5 x16"),
        (confounders.REPLAY, "GPU 1 +3 replay")}
    assert (confounders.SLOWDOWN, "HW_SLOWDOWN on GPU 0") not in facts  # nested under the thermal one
    rec = constructed()
    rec["snapshots"][2]["gpus"][0]["clocks_event_reasons"] = 0x8  # a hardware slowdown of no named kind
    alone = dict(launch, machine=record(rec, ["hot"]))
    assert (confounders.SLOWDOWN, "HW_SLOWDOWN on GPU 0") in {(f.group, f.detail)
                                                              for f in confounders.launch_facts(alone, run)}
    quiet = {"index": 18, "config": "default", "stage": 2, "status": "ok",
             "machine": record(constructed(), QUIET)}
    assert confounders.launch_facts(quiet, run) == []


def test_only_the_gpus_a_launch_used_count(tmp_path):
    run = {"machine_state": machine_state(), "fingerprint": {"launcher": {"hostname": "box"}},
           "launches": [{"index": 3, "config": "default", "stage": 1, "status": "ok",
                         "ranks": [{"rank": 0, "hostname": "box", "pci_bus_id": "00000000:00:06.0"},
                                   {"rank": 1, "hostname": "other-node", "pci_bus_id": "00000000:00:07.0"}]}]}
    rec = constructed()
    for snap in rec["snapshots"]:  # the other process and the downtrained link are on GPU 1 only
        snap["gpus"][0]["processes"] = [p for p in snap["gpus"][0]["processes"] if p["pid"] != OTHER]
        snap["gpus"][0]["pcie_gen"] = 5
    run["launches"][0]["machine"] = record(rec, ["other", "gen4"], after="after-hot")
    assert confounders.used_gpus(run["launches"][0], run) == {0}
    assert {f.group for f in confounders.launch_facts(run["launches"][0], run)} <= {confounders.REPLAY,
                                                                                   confounders.THERMAL}
    del run["launches"][0]["ranks"]  # unknown: every GPU of the node counts
    groups = {f.group for f in confounders.launch_facts(run["launches"][0], run)}
    assert {confounders.PROCESS, confounders.LINK} <= groups


def test_clocks_that_differ_between_the_arms_mark_the_claim(tmp_path):
    slow = set(stage2(tmp_path)["fast"])
    run_dir, _ = certified(tmp_path, lambda l: ["hot", "hot"] if l["index"] in slow else QUIET)
    v = verdict.evaluate_run(results.load_run(run_dir))
    texts = [t for c in v.certifications for t in v.confounders.for_claim(c.claim).confounders]
    assert ("SM clocks under load differed between the arms: default's stage-2 launches at 1980 MHz, fast's at "
            "1755 MHz (medians of each launch's lowest)") in texts


def test_runs_without_machine_state_say_why_once():
    old = {"version": 3, "launches": [{"index": 0, "config": "default", "status": "ok"}]}
    c = confounders.check(old)
    assert not c.recorded and c.reason == "run format 3 predates commdiag's machine-state recording"
    gloo = {"version": 4, "machine_state": ms.open_sampler("gloo").describe(),
            "launches": [{"index": 0, "config": "default", "status": "ok", "machine": {"available": False}}]}
    c = confounders.check(gloo)
    assert not c.recorded and c.reason.startswith("backend gloo: the launches use no GPU")
    assert confounders.check({"launches": "damaged", "machine_state": []}).recorded is False


def test_a_hostile_process_name_is_escaped_in_the_report_and_the_terminal(tmp_path):
    rec = constructed()
    for snap in rec["snapshots"]:
        for g in snap["gpus"]:
            for p in g.get("processes", []):
                if p["pid"] == OTHER:
                    p["name"] = "/tmp/<img src=x onerror=alert(1)>\x1b]0;pwned\x07"
    run = {"version": 4, "machine_state": machine_state(), "spec": {}, "configs": [],
           "launches": [{"index": 0, "config": "default", "stage": 1, "status": "ok",
                         "machine": record(rec, BESIDE)}]}
    # stored as read, but with control characters written out: never a terminal escape in run.json
    name = "<img src=x onerror=alert(1)>\\x1b]0;pwned\\x07"
    assert run["launches"][0]["machine"]["others"][0]["name"] == name
    c = confounders.check(run)
    assert f"another process (pid {OTHER}, {name[:40]}) used GPU 0 during launch 0" in c.notes  # cut at 40
    html = report.machinereport.html_section(run, None)
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
