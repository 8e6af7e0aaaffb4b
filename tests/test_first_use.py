"""What a new user meets (issue #36): output that never claims more than it measured, and says how
much it left out.  Real CLI subprocesses over real run folders (a recorded cpu-smoke sweep)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

from conftest import REPO, run_cli, words

RUNS = REPO / "tests" / "fixtures" / "runs"


def copy_run(tmp_path, name="cpu-smoke"):
    dst = tmp_path / name
    shutil.copytree(RUNS / name, dst)
    return dst


def test_aa_headline_claims_stage_2_only_for_the_twin_stage_2_tested(tmp_path):
    # cpu-smoke under gloo: seed and simple are twins of default; only simple was a stage-2 claim
    proc = run_cli("report", copy_run(tmp_path))
    assert proc.returncode == 0, proc.stderr
    out = words(proc.stdout)
    assert ("A/A check: PASS: seed, simple, identical to default under gloo (gloo never loads NCCL): simple "
            "tested in stage 2 and not certified; seed not tested in stage 2 (not a claim)") in out


def test_default_is_never_listed_as_not_a_stage_2_claim(tmp_path):
    # a sweep stopped in stage 2 before default's first stage-2 launch: default is still the reference
    import json

    from commdiag.cli import render_table
    from commdiag.formats import results
    run = copy_run(tmp_path)
    meta = json.loads((run / "run.json").read_text())
    gone = {l["index"] for l in meta["launches"] if l.get("stage") == 2 and l["config"] == "default"}
    meta["launches"] = [l for l in meta["launches"] if l["index"] not in gone]
    (run / "run.json").write_text(json.dumps(meta))
    rows = (run / "samples.csv").read_text().splitlines(keepends=True)
    col = rows[0].split(",").index("launch")
    (run / "samples.csv").write_text("".join(rows[:1] + [r for r in rows[1:] if int(r.split(",")[col]) not in gone]))
    (run / "summary.csv").unlink()  # it counts the removed launches' samples: derived again in memory
    table = words(render_table(results.load_run(run)))
    assert "note: seed: screening launches only (not a stage-2 claim)" in table
    assert "default" not in table.split("note: seed:")[0].split("note:")[-1] and "default, seed" not in table


def test_the_test_command_says_how_many_slow_tests_it_left_out():
    # the README's test command (xdist workers, -m 'not slow') over one file: its one slow test is counted
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
                           "tests/test_report.py", "-k", "large_report_stays_lean"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "NOTE: 1 slow test left out (tests/conftest.py SLOW); `pytest -m slow` runs them" in proc.stdout, proc.stdout
    assert all(len(l) <= 100 for l in proc.stdout.splitlines() if l.startswith("NOTE"))


def test_a_sweep_spec_with_empty_configs_is_refused_before_any_work(tmp_path):
    spec = (REPO / "sweeps" / "cpu-smoke.yaml").read_text().split("\nconfigs:", 1)[0] + "\nconfigs: {}\n"
    (tmp_path / "s.yaml").write_text(spec)
    proc = run_cli("sweep", tmp_path / "s.yaml", "--out", tmp_path / "run")
    assert proc.returncode == 2 and not (tmp_path / "run").exists()
    assert words(proc.stderr).startswith(f"commdiag: error: {tmp_path / 's.yaml'}: configs: empty: give at least "
                                         "one config besides default"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_ab_spec_whose_program_is_missing_is_refused_naming_the_field_before_a_folder(tmp_path):
    toy = (REPO / "ab" / "cpu-toy.yaml").read_text()
    for field, spec in (("command[0]", toy.replace('command: ["{python}", -m, commdiag.ab.toy, client',
                                                   'command: [no-such-bench, client')),
                        ("server.command[0]", toy.replace('  command: ["{python}", -m, commdiag.ab.toy, server',
                                                          '  command: [/nonexistent/server')),):
        (tmp_path / "ab.yaml").write_text(spec)
        proc = run_cli("ab", tmp_path / "ab.yaml", "--out", tmp_path / "run")
        assert proc.returncode == 2 and not (tmp_path / "run").exists(), proc.stderr
        assert f"ab.yaml: {field}: " in words(proc.stderr) and "--debug" not in proc.stderr, proc.stderr


def test_ab_stops_after_a_first_round_that_failed_the_same_way_for_every_arm(tmp_path):
    # a metric whose regex matches nothing: every launch would fail; one round says so
    toy = (REPO / "ab" / "cpu-toy.yaml").read_text().replace(
        "field: median_itl_ms}", 'field: median_itl_ms}\n  - {name: nothing, regex: "NEVER(\\\\d+)", better: higher}')
    (tmp_path / "ab.yaml").write_text(toy)
    proc = run_cli("ab", tmp_path / "ab.yaml", "--out", tmp_path / "run")
    out = words(proc.stdout)
    assert proc.returncode == 3, proc.stderr
    assert ("stopped: every launch of round 1 (3 arms) failed the same way, so every round would: nothing: "
            "stdout: no line matches 'NEVER(\\\\d+)'. No verdicts from no values") in out, out
    assert "rounds would decide" not in out and "verdicts against default" not in out
    import json
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["state"] == "stopped" and [l["status"] for l in run["launches"]].count("failed") == 3
    assert proc.stderr.count("] ") == 3  # three progress lines: one round, then the stop


def test_ab_verdict_from_no_complete_round_estimates_no_rounds():
    from commdiag.ab import render, verdict
    v = verdict.judge([], ["b"], [("tok", "higher")], 0.03)[0]
    assert v.rounds == 0 and "rounds would decide" not in render._plain(v, 0.03)


def test_step_ranges_read_with_negative_shares_and_the_alone_line_is_plain():
    from commdiag.analyse import steptable
    share = steptable.Spread(-0.113, -0.492, 0.266, 4)
    assert share.text("{:.1f}%", 100.0) == "-11.3% [-49.2% to 26.6%] n=4"
    assert steptable._alone_meaning(0.595, 0.8) == ": less than they add: inside the step they run slower"


def test_small_messages_a_new_user_meets(tmp_path):
    from conftest import write_spec
    # a typo'd top-level key: the near miss is named
    spec = write_spec(tmp_path / "t.yaml", configs={"ll": {"NCCL_PROTO": "LL"}})
    spec.write_text(spec.read_text().replace("trials:", "trails:"))
    proc = run_cli("sweep", spec, "--out", tmp_path / "r1")
    assert proc.returncode == 2 and "trails: unknown key: did you mean `trials`?" in words(proc.stderr), proc.stderr
    # ab's rounds: the message names auto too
    toy = (REPO / "ab" / "cpu-toy.yaml").read_text().replace("rounds: auto", "rounds: -1")
    (tmp_path / "ab.yaml").write_text(toy)
    proc = run_cli("ab", tmp_path / "ab.yaml", "--out", tmp_path / "r2")
    assert proc.returncode == 2 and "rounds: -1 must be auto or 1..200" in words(proc.stderr), proc.stderr
    # ab --config with a file that is not a profile: where the format is documented
    (tmp_path / "ll.env").write_text("NCCL_PROTO=LL\n")
    proc = run_cli("ab", "--config", f"ll={tmp_path / 'll.env'}", "--metric", "t:higher:(\\d+)", "--", "true")
    assert proc.returncode == 2 and "docs/formats.md#profiles" in words(proc.stderr), proc.stderr
    # tuner build writes nowhere it was not told to
    proc = run_cli("tuner", "build", cwd=tmp_path)
    assert proc.returncode == 2 and not list(tmp_path.glob("*.so")), proc.stderr
    assert "give --out DIR" in words(proc.stderr) or "as root, give --out DIR" in words(proc.stderr), proc.stderr
    # install-hook --status with nothing installed answers, exit 0; asked about an interpreter, exit 1
    proc = run_cli("install-hook", "--status", "--root", tmp_path / "root")
    assert proc.returncode == 0 and "no commdiag install recorded" in proc.stdout, proc.stdout + proc.stderr
    proc = run_cli("install-hook", "--status", "--root", tmp_path / "root", "--python", sys.executable)
    assert proc.returncode == 1 and "nothing installed for this interpreter" in proc.stdout, proc.stdout + proc.stderr


def test_the_sweep_start_line_counts_in_singular_and_plural(tmp_path):
    from commdiag.formats import spec as specmod
    from commdiag.measure import runner, stages, sweep
    from conftest import write_spec
    spec = specmod.load_spec(write_spec(tmp_path / "t.yaml"))
    run = {"configs": [{"name": "default"}], "launches": [{"index": 0, "status": "pending", "stage": 1}]}
    line = words("\n".join(stages.start_banner(spec, run, tmp_path).lines))
    assert "1 launch to run (1 screening: 1 config x 1 trial)" in line, line


def test_gpu_only_commands_say_no_gpu_without_importing_torch(tmp_path):
    import os

    import pytest

    from commdiag.environment import gpusigns
    if not gpusigns.no_cuda_driver():
        pytest.skip("this machine has an NVIDIA driver: torch is asked, as it should be")
    # a torch that records being imported (and has the torchrun file sweep's preflight looks for)
    fake = tmp_path / "site" / "torch"
    (fake / "distributed").mkdir(parents=True)
    (fake / "distributed" / "run.py").write_text("")
    (fake / "__init__.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\nraise ImportError('fake')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO)])}
    for args in (("sweep", REPO / "sweeps" / "nvlink2-aa.yaml", "--out", tmp_path / "run"), ("check-env", "--nccl")):
        proc = subprocess.run([sys.executable, "-m", "commdiag.cli", *map(str, args)], capture_output=True, text=True,
                              env={**os.environ, **env}, timeout=60)
        assert proc.returncode == 2 and "none visible" in words(proc.stderr), proc.stderr
        assert not (tmp_path / "imported").exists(), args
    # the driver's files, staged: then torch is asked
    assert gpusigns.no_cuda_driver(tmp_path)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").write_text("")
    assert not gpusigns.no_cuda_driver(tmp_path)


def test_install_hook_under_root_prints_the_staged_paths_it_writes(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "p.env").write_text("# commdiag-profile 1\nNCCL_PROTO=LL\n")
    proc = run_cli("install-hook", "--profile", tmp_path / "p.env", "--root", root, "--python", sys.executable,
                   "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    heads = [l for l in proc.stdout.splitlines() if l.startswith("--- ")]
    assert heads and all(l.startswith(f"--- {root}/") for l in heads), heads
    assert "staged under --root: every file below is written inside it" in words(proc.stdout)
    # a line over 100 columns is one long path and a few words (the test's tmp paths are long)
    def words_beside_path(line):
        return len(line) - max((len(t) for t in line.split() if t.startswith("/")), default=0)
    long = [l for l in proc.stdout.splitlines() if len(l) > 100 and words_beside_path(l) > 60
            and not l.startswith("+")]  # a file's own lines are its content
    assert not long, long
    proc = run_cli("install-hook", "--profile", tmp_path / "p.env", "--root", root, "--python", sys.executable,
                   "--no-verify")
    out = words(proc.stdout)
    assert out.count(f"commdiag's file: {root}/") == 2 and f"commdiag's file: {sys.prefix}" not in out, out


def test_a_truncated_samples_csv_is_refused_saying_what_is_missing(tmp_path):
    run = copy_run(tmp_path)
    whole = (run / "samples.csv").read_bytes()
    # head -c 3000: the last row cut in the middle
    subprocess.run(f"head -c 3000 {RUNS / 'cpu-smoke' / 'samples.csv'} > {run / 'samples.csv'}", shell=True, check=True)
    proc = run_cli("report", run)
    assert proc.returncode == 2 and "samples.csv: its last row is cut off" in words(proc.stderr), proc.stderr
    assert "A/A check" not in proc.stdout and not (run / "report.html").exists()
    # cut at a line end: whole rows, but fewer than summary.csv counts
    rows = whole.decode().splitlines(keepends=True)
    (run / "samples.csv").write_text("".join(rows[:100]))
    proc = run_cli("report", run)
    assert proc.returncode == 2 and "samples.csv: 99 rows where summary.csv counts 1980" in words(proc.stderr), proc.stderr
    # the whole file again: the report as before
    (run / "samples.csv").write_bytes(whole)
    assert run_cli("report", run).returncode == 0


# --------------------------------------------------------------------------- one table of times

DURATION = re.compile(r"\d+(\.\d+)?( ?- ?\d+(\.\d+)?)? ?(s|min|minutes?|seconds?)\b")


def times_table() -> dict[str, str]:
    """docs/times.md's rows: spec -> its time cell (read by benchmarks/times.py's own parser)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("times", REPO / "benchmarks" / "times.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {name: cells[2] for name, cells in mod.read_rows((REPO / "docs" / "times.md").read_text()).items()}


def mentions(text: str, name: str) -> list[str]:
    """Lines of ``text`` naming the spec file ``name``.yaml and a duration."""
    pat = re.compile(rf"(?<![\w-]){re.escape(name.split('/')[-1])}\.yaml")
    return [l for l in text.splitlines() if pat.search(l) and DURATION.search(l)]


def test_every_time_stated_anywhere_is_the_one_in_docs_times_md():
    table = times_table()
    specs = {p.stem: p for p in (REPO / "sweeps").glob("*.yaml")} | {f"ab/{p.stem}": p for p in (REPO / "ab").glob("*.yaml")}
    assert set(table) <= set(specs) and {"cpu-smoke", "cpu-aa", "ab/cpu-toy", "nvlink2-aa", "pcie8"} <= set(table)
    readme = (REPO / "README.md").read_text()
    shipped = readme.split("## Shipped specs and how long they take", 1)[1].split("\n## ", 1)[0]
    helptext = run_cli("--help").stdout
    for name, time in table.items():
        # each spec's leading comment: the table's time, a pointer to the table, no other duration
        head = "\n".join(l for l in specs[name].read_text().split("\nname:", 1)[0].splitlines() if l.startswith("#"))
        if DURATION.search(head) or name.startswith("cpu") or name == "ab/cpu-toy":
            assert time in head and "docs/times.md" in head, (name, time, head)
            assert [m.group(0) for m in DURATION.finditer(head.replace(time, ""))] == [], (name, head)
        # the README's specs table: the time cell itself
        row = next(l for l in shipped.splitlines() if l.startswith(f"| `{name.split('/')[-1]}.yaml`")
                   or l.startswith(f"| `{name}.yaml`"))
        assert row.rstrip(" |").rsplit(" | ", 1)[1] == time, (name, row)
        # any other README or --help line naming the spec with a duration quotes the table
        for line in mentions(readme.replace(row, ""), name) + mentions(helptext, name):
            assert time in line, (name, time, line)
    assert f"cpu-smoke.yaml ({table['cpu-smoke']}, docs/times.md)" in words(helptext)
    # the README's prose that names a spec's time without its file name on the same line
    prose = words(readme)
    for said in (f"runs the CPU smoke sweep (gloo, 2 ranks; {table['cpu-smoke']} on 2 cores",
                 f"quiet enough to trust?** ({table['nvlink2-aa']} on 2x H200, estimated",
                 f"`sweeps/cpu-aa.yaml`, {table['cpu-aa']} on 2 cores",
                 f"**{table['pcie8']}** on 8 GPUs, estimated", f"{table['ab/cpu-toy']} on 2 cores"):
        assert said in prose, said


def test_the_first_eta_leaves_out_the_servers_start_and_the_start_bounds_the_whole_run(tmp_path):
    import json

    from commdiag.formats import spec as specmod
    from commdiag.measure import runner, stages, sweep
    run = json.loads((RUNS / "cpu-smoke" / "run.json").read_text())
    first, second = run["launches"][0], run["launches"][1]  # 4.3 s with the servers' start, then 0.5 s
    assert first["wall_s"] > 5 * second["wall_s"] and first["launched_by"] == "forkserver"
    assert runner.per_launch([first["wall_s"]], [first]) == first["measure_s"]
    assert runner.per_launch([first["wall_s"], second["wall_s"]], [second]) == second["wall_s"]
    # at the start: the most stage 2 can add (cpu-smoke: 2 bands, 2 candidates, 11 rounds of 3 configs:
    # the paired test's floor of 9 for 2 claims plus 2 spare)
    spec = specmod.load_spec(REPO / "sweeps" / "cpu-smoke.yaml")
    assert stages.stage2_at_most(spec) == 33
    pending = {"configs": [{"name": c.name} for c in spec.configs],
               "launches": [{"index": i, "status": "pending", "stage": 1} for i in range(6)]}
    text = words("\n".join(stages.start_banner(spec, pending, tmp_path).lines))
    assert "then stage 2 (confirmation; its plan is printed when screening ends): at most 33 launches" in text, text
    # nvlink2-aa as shipped: 13 rounds of default, aa and seed (4 two-sided claims: 11 + 2 spare)
    assert stages.stage2_at_most(specmod.load_spec(REPO / "sweeps" / "nvlink2-aa.yaml")) == 39


def test_a_gloo_report_reads_plainly_and_draws_the_stage_2_plot_with_a_legend(tmp_path):
    import test_report
    run = copy_run(tmp_path)
    assert run_cli("report", run).returncode == 0
    html = (run / "report.html").read_text()
    # gloo: no advice to run explain (it refuses gloo runs), and no NCCL line before the environment table
    assert "<code>commdiag explain RUN_DIR</code>" not in html
    assert "Not applicable: gloo never loads NCCL, so NCCL chose nothing" in html
    assert "<p>not applicable (gloo)</p>" not in html and "NCCL itself: not applicable (gloo never loads NCCL)" in html
    # fingerprint, method and spec as key/value tables, not JSON dumps
    for head in ("Environment fingerprint", "Method", "Spec"):
        section = html.split(f"<h2>{head}</h2>", 1)[1].split("<h2>", 1)[0]
        assert section.startswith("\n<table><tr><th>key</th><th>value</th>") and "<pre>" not in section, head
    assert "<td>backend</td><td>gloo</td>" in html
    # plotly.js's cartesian bundle (commdiag/analyse/plotlyjs), not the 4.8 MB full one
    assert "plotly.js (cartesian - minified) v4.1.1" in html[:100_000] and len(html.encode()) < 2_000_000
    dom, console = test_report.render(run / "report.html")
    assert not console, console
    stage2 = dom.split('id="stage2"', 1)[1].split('class="plot"', 1)[0]
    assert "default (the reference)" in stage2 and "the claim's config" in stage2  # the legend
    assert "simple, prefill band" in stage2 and ": default" not in stage2  # short two-level ticks
