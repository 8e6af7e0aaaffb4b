"""Proof that a tuner plugin loaded and which rule fired: NCCL's and the plugin's
lines parsed from the real 2x H200 recording and from failure lines built from NCCL 2.28.9's source,
check-env's and explain's verdicts on them, spec validation of tuned configs, and the sweep's proof."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from commdiag.environment import envcheck
from commdiag.errors import SpecError
from commdiag.formats import results
from commdiag.formats.spec import load_spec
from commdiag.measure import explain, sweep, worker
from commdiag.nccl import ncclvars, tunerlog
from commdiag.tuner import rules

from conftest import REPO, write_spec

PROBE = REPO / "benchmarks" / "h200x2-2026-11-30" / "tuner-probe"
FIX = Path(__file__).parent / "fixtures" / "tuner"
BUILT = "nccl-2.28.9-source-strings-not-a-gpu-recording-"
LIB = "/tmp/tuner/libnccl-tuner-commdiag.so"
SIZES = [917504, 1835008, 3670016, 7340032]


def recording(pids: tuple[int, ...] | None = None) -> str:
    """plugin-lines.txt is `sort | uniq -c` of the run's NCCL logs: the lines verbatim after the count."""
    lines = [re.sub(r"^\s*\d+ ", "", l, count=1) for l in (PROBE / "plugin-lines.txt").read_text().splitlines()]
    lines = [l for l in lines if " NCCL " in l]
    return "\n".join(l for l in lines if pids is None or int(l.split(":")[1]) in pids) + "\n"


def built(case: str) -> str:
    return (FIX / f"{BUILT}{case}.log").read_text()


# ----------------------------------------------------------------------------- the parser


def test_recording_explain_launch_every_line_type():
    logs = tunerlog.parse(recording((874, 875)))
    assert sorted(logs) == [874, 875]
    for dev, pid in enumerate((874, 875)):
        t = logs[pid]
        assert (t.host, t.device, t.requested, t.name, t.abi, t.library) == ("vm", dev, LIB, "commdiag", 5, LIB)
        assert t.loaded and t.closed and t.load_errors == [] and t.rules_warnings == [] and t.notes == []
        assert t.rules == [tunerlog.RulesLoaded(2, "/tmp/tuner/rules.txt", 2, 2, 1, "f83f9b9cb22626f3", 5)]
        by = t.rule_by_size()
        assert sorted(by) == [1835008, 3670016]  # 0.9 and 7.3 MB: no rule matched, nothing logged
        assert (by[1835008].line, by[1835008].algo, by[1835008].proto, by[1835008].channels) == (2, "ring", "ll", 0)
        assert (by[3670016].line, by[3670016].proto, by[3670016].reg_buff, by[3670016].applied) == (3, "ll128", 0, True)
        assert by[1835008].note == "cost was 20.814"
        assert sorted((c.line, c.applied, c.not_applied) for c in t.counts) == [(2, 4, 0), (3, 4, 0)]
        assert t.problems() == []
        assert t.summary().startswith(f"loaded commdiag (tuner ABI v5) from {LIB}; 2 of 2 rules")


def test_recording_sweep_launch_logged_env_only_which_proves_nothing():
    # the probe's timed launches ran with NCCL_DEBUG_SUBSYS=ENV: only the request is in their logs,
    # which is why a tuned launch now logs ENV,INIT
    logs = tunerlog.parse(recording((684, 685)))
    for t in logs.values():
        assert t.requested == LIB and not t.loaded
        (why,) = t.problems()
        assert "printed no tuner load line" in why and "NCCL_DEBUG_SUBSYS with INIT" in why


def test_recording_default_config_nccl_searched_and_found_nothing_which_is_fine():
    logs = tunerlog.parse(recording((811, 812)))
    for t in logs.values():
        assert t.requested is None and not t.loaded
        assert t.load_errors == ["TUNER/Plugin: Could not find: libnccl-tuner.so"]
        assert t.problems() == [] and t.summary() == "no tuner plugin requested"


@pytest.mark.parametrize("case, words", [
    ("missing-library", "Could not find: /opt/commdiag/libnccl-tuner-commdiag.so"),
    ("unsupported-abi", "External tuner plugin /opt/commdiag/libnot-a-tuner.so is unsupported"),
    ("dlopen-error", "TUNER/Plugin: /opt/commdiag/rules.txt: /opt/commdiag/rules.txt: invalid ELF header"),
])
def test_failure_lines_from_nccl_source_name_ncclS_reason(case, words):
    logs = tunerlog.parse(built(case))
    assert len(logs) == 2
    for t in logs.values():
        assert t.wanted and not t.loaded
        (why,) = t.problems()
        assert why.startswith("NCCL did not load the tuner plugin /opt/commdiag/") and words in why
        assert t.summary().startswith("FAILED: NCCL did not load")


def test_net_plugin_tuner_instead_of_the_named_library_is_a_failure():
    for t in tunerlog.parse(built("net-plugin-tuner")).values():
        assert t.loaded and t.name == "nettuner" and t.library is None
        (why,) = t.problems()
        assert "took tuner 'nettuner' from elsewhere" in why


def test_another_plugin_loaded_shows_its_name_and_is_not_judged_by_commdiag_rules():
    for t in tunerlog.parse(built("other-plugin-loaded")).values():
        assert t.problems() == []
        assert t.summary() == "loaded example (tuner ABI v4) from /opt/example/libnccl-tuner-example.so"


def test_commdiag_plugin_with_no_rule_for_this_communicator_is_a_failure():
    for t in tunerlog.parse(built("rules-for-another-size")).values():
        (why,) = t.problems()
        assert "none of the 2 rules in /opt/commdiag/rules.txt is for nRanks=2 nNodes=1" in why


def test_rules_warn_names_the_file_line(tmp_path):
    # the WARN's words after the path are rules.py's RulesError.detail, which test_tuner.py holds
    # equal to commdiag_tuner.c's; the line layout is commdiag_tuner.c's format string
    bad = tmp_path / "rules.txt"
    bad.write_text("# commdiag-tuner-rules 1\n\ncoll=allreduce min_bytes=0\n")
    with pytest.raises(rules.RulesError) as e:
        rules.load(bad)
    text = (recording((874,)).replace("commdiag-tuner: loaded 2 rules from /tmp/tuner/rules.txt, 2 for nRanks=2 "
                                      "nNodes=1 (comm 0xf83f9b9cb22626f3, tuner ABI v5)", "x")
            + f"vm:874:874 [0] NCCL WARN commdiag-tuner: NCCL_TUNER_CONFIG_FILE={bad}: {e.value.detail}; no rules, "
              "NCCL chooses every collective\n")
    t = tunerlog.parse(text)[874]
    assert t.rules_warnings == [f"NCCL_TUNER_CONFIG_FILE={bad}: line 3: {e.value.why}"]
    assert t.problems() == [f"commdiag-tuner: NCCL_TUNER_CONFIG_FILE={bad}: line 3: {e.value.why}"]


def test_disabled_and_outside_table_lines():
    pre = "vm:5:5 [0] NCCL INFO commdiag-tuner: "
    text = (pre + "rule line 4 not applied: allreduce nBytes=65536 regBuff=1: NCCL disabled algo=nvls proto=simple "
            "for this collective (cost -1.0); NCCL's choice stands\n"
            + pre + "rule line 5 not applied: allgather nBytes=8: algo=pat proto=ll is outside NCCL's cost table; "
            "NCCL's choice stands\n"
            + pre + "rule line 4: further applications are counted, not logged\n")
    t = tunerlog.parse(text)[5]
    e4, e5 = t.events
    assert (e4.line, e4.applied, e4.reg_buff, e4.algo, e4.note) == (4, False, 1, "nvls", "cost -1.0")
    assert (e5.collective, e5.reg_buff, e5.channels, e5.applied) == ("allgather", None, None, False)
    assert t.notes == ["rule line 4: further applications are counted, not logged"]


def test_merge_load_keeps_the_process_load_with_this_runs_rules():
    whole = tunerlog.parse(recording((874,)))[874]
    part = tunerlog.TunerLog("vm", 874, 0, rules=whole.rules[:1])
    merged = tunerlog.merge_load(whole, part)
    assert merged.loaded and merged.library == LIB and merged.rules == whole.rules and merged.events == []


# ----------------------------------------------------------------------------- check-env --nccl


def test_check_env_tuner_proof_on_the_recording():
    proof = envcheck.compare_tuner(recording((874, 875)), LIB, {874: 0, 875: 1}, SIZES, [874, 875])
    assert proof["format"] == "commdiag-tuner-proof" and proof["version"] == 1 and proof["ok"]
    assert [r["rank"] for r in proof["ranks"]] == [0, 1]
    r0 = proof["ranks"][0]
    assert r0["sizes"] == {"917504": None, "1835008": {"line": 2, "applied": True, "algo": "ring", "proto": "ll"},
                           "3670016": {"line": 3, "applied": True, "algo": "ring", "proto": "ll128"},
                           "7340032": None}
    text = "\n".join(envcheck.render_tuner(proof))
    assert f"tuner plugin {LIB}: ok" in text and "rank 1 pid 875: loaded commdiag (tuner ABI v5)" in text
    assert "1835008 B: rule line 2 applied -> ring/ll" in text and "917504 B: no rule" in text


@pytest.mark.parametrize("case", ["missing-library", "unsupported-abi", "dlopen-error", "net-plugin-tuner"])
def test_check_env_plugin_requested_not_loaded_fails_the_check(case):
    text = built(case)
    pids = sorted(tunerlog.parse(text))
    proof = envcheck.compare_tuner(text, "/opt/commdiag/x.so", {p: n for n, p in enumerate(pids)}, [4096], pids)
    assert not proof["ok"] and all(r["problems"] for r in proof["ranks"])
    check = envcheck.NcclCheck({}, "none", envcheck.compare_nccl(text, {}), tuner=proof)
    assert not check.ok  # the CLI exits EXIT_CHECK_FAILED on it
    assert "FAILED" in "\n".join(envcheck.render_tuner(proof))
    assert check.to_json()["tuner"]["format"] == "commdiag-tuner-proof"


def test_check_env_a_silent_rank_fails():
    # rank 1 printed nothing about the plugin (e.g. its log was cut): not proof for that rank
    proof = envcheck.compare_tuner(recording((874,)), LIB, {874: 0, 999: 1}, [4096], [874, 999])
    assert not proof["ok"]
    assert proof["ranks"][1]["problems"] == [f"NCCL_TUNER_PLUGIN={LIB} but this rank's NCCL printed no tuner line"]
    assert envcheck.compare_tuner("", None) is None and envcheck.compare_tuner("", "none") is None


def test_check_env_sizes_cover_both_ends_of_every_allreduce_rule(tmp_path):
    (tmp_path / "rules.txt").write_text((PROBE / "rules.txt").read_text())
    env = {"NCCL_TUNER_PLUGIN": LIB, "NCCL_TUNER_CONFIG_FILE": str(tmp_path / "rules.txt")}
    assert envcheck.check_sizes(env) == [4096, 1048576, 2097152, 2097156, 4194304]
    assert envcheck.check_sizes({**env, "NCCL_TUNER_CONFIG_FILE": str(tmp_path / "absent")}) == [4096]
    assert envcheck.check_sizes({}) == [4096]


# ----------------------------------------------------------------------------- explain


def test_explain_names_the_rule_beside_nccls_choice_and_shouts_when_not_loaded():
    fired = explain.tuner_by_size(recording((874, 875)), SIZES, LIB)
    assert fired["ok"] and fired["sizes"] == {"917504": {"rule": None}, "1835008": {"rule": 2, "applied": True},
                                              "3670016": {"rule": 3, "applied": True}, "7340032": {"rule": None}}
    missing = explain.tuner_by_size(built("missing-library"), SIZES, "/opt/commdiag/libnccl-tuner-commdiag.so")
    assert not missing["ok"]
    assert explain.tuner_by_size(recording((811, 812)), SIZES, None) is None
    choice = {"algo": "Ring", "proto": "LL", "channels": 24, "calls": 3}
    data = {"nccl_version": "2.28.9+cuda13.0", "configs": {
        "default": {"status": "ok", "error": None, "sizes": {str(s): choice for s in SIZES}},
        "tuned": {"status": "ok", "error": None, "sizes": {str(s): choice for s in SIZES}, "tuner": fired},
        "broken": {"status": "ok", "error": None, "sizes": {str(s): choice for s in SIZES}, "tuner": missing}}}
    text = explain.render(data, [{"bytes": s, "tokens": None} for s in SIZES])
    lines = text.splitlines()
    assert lines[1].startswith("TUNER PLUGIN NOT PROVEN [broken]: NCCL did not load the tuner plugin")
    assert "Could not find" in lines[1] and "NCCL's own choice" in lines[2]
    row = next(l for l in lines if l.strip().startswith("1835008"))
    assert "Ring/LL/24 rule 2" in row and row.count("rule") == 1  # not beside the broken config
    assert "Ring/LL/24 no rule" in next(l for l in lines if l.strip().startswith("917504"))


# ----------------------------------------------------------------------------- spec: tuned configs


def test_tuner_variables_are_known():
    assert ncclvars.check_setting("NCCL_TUNER_CONFIG_FILE", "/x/rules.txt") == (None, None)
    assert ncclvars.check_setting("NCCL_TUNER_PLUGIN", "/x/lib.so") == (None, None)


def _tuned(tmp_path, **env):
    return write_spec(tmp_path / "spec.yaml", configs={"tuned": env})


def test_spec_tuned_config_with_real_files_is_accepted(tmp_path):
    lib, rf = tmp_path / "lib.so", tmp_path / "rules.txt"
    lib.write_bytes(b"\x7fELF")
    rf.write_text((PROBE / "rules.txt").read_text())
    spec = load_spec(_tuned(tmp_path, NCCL_TUNER_PLUGIN=str(lib), NCCL_TUNER_CONFIG_FILE=str(rf)))
    assert spec.config("tuned").env["NCCL_TUNER_CONFIG_FILE"] == str(rf)
    assert not [w for w in spec.warnings if "TUNER" in w]  # no longer "not an NCCL variable commdiag knows"


@pytest.mark.parametrize("var, value, words", [
    ("NCCL_TUNER_PLUGIN", "libnccl-tuner-commdiag.so", "must be an absolute path to the tuner plugin library"),
    ("NCCL_TUNER_PLUGIN", "{tmp}/absent.so", "no such file; it must be the tuner plugin library"),
    ("NCCL_TUNER_PLUGIN", "{tmp}", "not a regular file"),
    ("NCCL_TUNER_CONFIG_FILE", "rules.txt", "must be an absolute path to the tuner rules file"),
    ("NCCL_TUNER_CONFIG_FILE", "{tmp}/absent.txt", "no such file"),
])
def test_spec_tuner_paths_one_error_naming_the_field(tmp_path, var, value, words):
    value = value.format(tmp=tmp_path)
    path = _tuned(tmp_path, **{var: value})
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert e.value.field == f"configs.tuned.{var}" and words in e.value.problem
    assert str(e.value).startswith(f"{path}: configs.tuned.{var}: ")


def test_spec_bad_rules_file_error_names_field_and_rules_line(tmp_path):
    rf = tmp_path / "rules.txt"
    rf.write_text("# commdiag-tuner-rules 1\n# fine\ncoll=allreduce min_bytes=0 max_bytes=10 nranks=2 nnodes=1 "
                  "algo=ring proto=fast\n")
    path = _tuned(tmp_path, NCCL_TUNER_CONFIG_FILE=str(rf))
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert e.value.field == "configs.tuned.NCCL_TUNER_CONFIG_FILE"
    assert f"'{rf}': line 3: " in e.value.problem and "proto" in e.value.problem
    assert str(e.value).count("\n") == 0


def test_spec_base_env_tuner_is_checked_too(tmp_path):
    path = write_spec(tmp_path / "spec.yaml", base_env={"NCCL_TUNER_PLUGIN": "relative.so"})
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert e.value.field == "base_env.NCCL_TUNER_PLUGIN"
    write_spec(tmp_path / "ok.yaml", base_env={"NCCL_TUNER_PLUGIN": "none"})  # NCCL's "no plugin"
    load_spec(tmp_path / "ok.yaml")


# ----------------------------------------------------------------------------- sweep proof


def _launch_result(text: str, pids=(874, 875)) -> dict:
    logs = tunerlog.parse(text)
    return {"ranks": [{"rank": n, "nccl_tuner": logs[p].to_json() if p in logs else None} for n, p in enumerate(pids)]}


def test_sweep_keeps_a_tuned_launch_the_recording_proves():
    launch = {"status": results.OK}
    result = _launch_result(recording((874, 875)))
    sweep._require_tuner_proof(launch, {"NCCL_TUNER_PLUGIN": LIB}, result)
    assert launch == {"status": results.OK}
    fired = result["ranks"][0]["nccl_tuner"]["fired"]  # what run.json keeps per rank: which rule, which size
    assert fired["1835008"]["line"] == 2 and fired["3670016"]["proto"] == "ll128" and "917504" not in fired


@pytest.mark.parametrize("text, pids, words", [
    (None, (684, 685), "printed no tuner load line"),  # the probe's own ENV-only launch
    ("missing-library", (901, 902), "Could not find"),
    ("rules-for-another-size", (951, 952), "none of the 2 rules"),
])
def test_sweep_fails_a_tuned_launch_without_proof(text, pids, words):
    launch = {"status": results.OK}
    log = recording(pids) if text is None else built(text)
    sweep._require_tuner_proof(launch, {"NCCL_TUNER_PLUGIN": LIB}, _launch_result(log, pids))
    assert launch["status"] == results.FAILED
    assert launch["error"].startswith(f"tuner plugin {LIB}: rank 0: ") and words in launch["error"]
    assert "measured NCCL's own choices" in launch["error"]


def test_sweep_without_a_log_to_read_fails_and_says_why():
    launch = {"status": results.OK}
    sweep._require_tuner_proof(launch, {"NCCL_TUNER_PLUGIN": LIB, "NCCL_DEBUG": "WARN"},
                               {"ranks": [{"rank": 0}]})
    assert launch["status"] == results.FAILED and "NCCL_DEBUG is set" in launch["error"]
    untouched = {"status": results.OK}
    sweep._require_tuner_proof(untouched, {"NCCL_TUNER_PLUGIN": "none"}, {"ranks": [{"rank": 0}]})
    assert untouched == {"status": results.OK}


def test_sweep_logs_init_for_tuned_configs_only(tmp_path):
    spec = load_spec(write_spec(tmp_path / "s.yaml", backend="nccl", modes=["graph"]))
    plain, _ = sweep._nccl_debug_env(spec, {}, tmp_path)
    tuned, note = sweep._nccl_debug_env(spec, {"NCCL_TUNER_PLUGIN": LIB}, tmp_path)
    assert plain["NCCL_DEBUG_SUBSYS"] == "ENV" and tuned["NCCL_DEBUG_SUBSYS"] == "ENV,INIT"
    assert "TUNING" not in note  # TUNING prints a line per NCCL call: never in a timed launch


def test_worker_reads_the_tuner_evidence_from_its_debug_file(tmp_path, monkeypatch):
    log = tmp_path / "nccl.h.874.log"
    text = recording((874,))
    log.write_text(text)
    monkeypatch.setattr(worker.os, "getpid", lambda: 874)
    got = worker._nccl_tuner(str(tmp_path / "nccl.h.%p.log"))
    assert got["loaded"] and got["name"] == "commdiag" and got["problems"] == []
    assert {s: f["line"] for s, f in got["fired"].items()} == {"1835008": 2, "3670016": 3}
    # reuse_process: a later run's slice has none of the per-process load lines; the load comes from the whole file
    start = len(text.encode()) - len(text.splitlines(True)[-1].encode())
    later = worker._nccl_tuner(str(tmp_path / "nccl.h.%p.log"), start)
    assert later["loaded"] and later["library"] == LIB
    assert worker._nccl_tuner(str(tmp_path / "absent.%p.log")) is None
