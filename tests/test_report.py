"""The HTML report, rendered in a real headless Chromium; the sweep's verdicts, report and profiles.

Without chromium these tests skip, unless COMMDIAG_REQUIRE_CHROMIUM=1 (CI sets it): then they fail.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import pytest

from commdiag.analyse import certify, report, stats, verdict
from commdiag.formats import profile, results
import browser
from conftest import run_cli, one_message, words

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
HOSTILE = ("<img src=x onerror=\"document.body.setAttribute('data-pwned','img')\">"
           "</script><script>document.body.setAttribute('data-pwned','script')</script>&amp;")


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe:
        return exe
    if os.environ.get("COMMDIAG_REQUIRE_CHROMIUM") == "1":
        pytest.fail("chromium is required (COMMDIAG_REQUIRE_CHROMIUM=1) but not installed")
    pytest.skip("chromium not installed (apt-get install chromium); CI requires it")


def render(html_file: Path, budget_ms: int = 20000) -> tuple[str, list[str]]:
    """Load the file in headless Chromium (one per test process: tests/browser.py); return (DOM after
    scripts ran, console messages and uncaught exceptions)."""
    return browser.load(chromium(), html_file.resolve().as_uri(), budget_ms)


def assert_drawn(dom: str, console: list[str], expected: int) -> None:
    assert not console, console
    assert f'data-plots-expected="{expected}"' in dom
    assert f'data-plots-drawn="{expected}"' in dom, "not every plot finished drawing"
    # plotly draws each figure into its own <svg class="main-svg">: count real drawn plots.
    drawn = len(re.findall(r'<div[^>]*class="[^"]*js-plotly-plot', dom))
    assert drawn == expected
    assert len(re.findall(r'<svg[^>]*class="main-svg"', dom)) >= expected
    assert re.search(r'id="js-errors"></div>', dom), "the page reported a script error"


def path_text(run_dir: Path) -> str:
    return (run_dir / "report.html").read_text()


def copy_run(name: str, dest: Path) -> Path:
    shutil.copytree(FIXTURES / name, dest)
    return dest


# ------------------------------------------------------------------ synthetic run folders

def make_run(folder: Path, table: dict, modes=("graph", "eager"), configs: dict | None = None,
             statuses: dict | None = None, iters: int = 5, tokens: dict | None = None) -> Path:
    """A run folder from literal launch medians: {config: {size: [median per launch]}}."""
    import pandas as pd

    folder.mkdir(parents=True)
    configs = configs or {c: ({} if c == "default" else {"NCCL_PROTO": "LL"}) for c in table}
    sizes = sorted({s for by in table.values() for s in by})
    tokens = tokens or {s: s // 4096 or None for s in sizes}
    rng = random.Random(0)
    launches, rows = [], []
    trials = max(len(v) for by in table.values() for v in by.values())
    for trial in range(trials):
        for c in table:
            idx = len(launches)
            status = (statuses or {}).get((c, trial), "ok")
            launches.append({"index": idx, "config": c, "trial": trial, "status": status, "wrong": 0,
                             "error": None if status == "ok" else f"{status}: {HOSTILE if 'evil' in c else 'x'}",
                             "stderr_tail": None if status == "ok" else "Traceback ...\nRuntimeError: boom",
                             "ranks": [{"rank": r, "env_seen": {k: {"environ": v, "getenv": v}
                                                                for k, v in configs[c].items()},
                                        "nccl_applied": dict(configs[c])} for r in range(2)]})
            for mode in modes:
                for s in sizes:
                    med = table[c][s][trial] * (1.5 if mode == "eager" else 1.0)
                    for i in range(iters):
                        rows.append((c, trial, idx, s, tokens.get(s), mode, "torch", i,
                                     round(med * (1 + rng.uniform(-0.01, 0.01)), 4), None))
    samples = pd.DataFrame(rows, columns=results.SAMPLES_COLUMNS)
    samples["tokens"] = samples["tokens"].astype("Int64")
    samples.to_csv(folder / "samples.csv", index=False)
    results.summarize(samples, {}, nranks=2).to_csv(folder / "summary.csv", index=False)
    run = {"format": results.RUN_FORMAT, "version": results.RUN_FORMAT_VERSION, "state": "complete",
           "spec": {"name": "synthetic", "backend": "nccl", "modes": list(modes),
                    "sizes": [{"bytes": s, "tokens": tokens.get(s)} for s in sizes],
                    "bands": {"decode": [1, 64], "prefill": [256, None]}},
           "world_size": 2, "configs": [{"name": c, "env": {"NCCL_NVLS_ENABLE": "0", **e}, "overrides": e,
                                         "origin": "configs"} for c, e in configs.items()],
           "launches": launches, "fingerprint": {"worker": {"nccl": "2.28.9", "torch": "2.13.0"}}}
    (folder / "run.json").write_text(json.dumps(run))
    return folder


def add_stage2(folder: Path, fresh: dict[str, float], confirm: tuple[str, ...] = (), rounds: int | None = None,
               iters: int = 5) -> dict:
    """Plan stage 2 with commdiag's own screening of ``folder`` and append its rounds: each config's
    fresh launches at ``fresh[config]`` x a small per-round wobble (graph mode, every size)."""
    import pandas as pd

    data = results.load_run(folder)
    scr, _ = verdict.screening_of(data)
    plan = certify.confirmation_plan(certify.plan_claims(scr, confirm), rounds, len(data.run["launches"]), "t")
    run = data.run
    run["confirmation"] = plan
    sizes = [s["bytes"] for s in run["spec"]["sizes"]]
    tokens = {s["bytes"]: s["tokens"] for s in run["spec"]["sizes"]}
    rows = []
    wobble = [1.0, 1.01, 0.995, 1.005, 0.99, 1.008, 0.997, 1.003]
    for r in range(plan["looks"][0]["rounds"]):
        for c in plan["configs"]:
            idx = len(run["launches"])
            run["launches"].append({"index": idx, "config": c, "trial": 100 + r, "stage": 2, "round": r,
                                    "status": "ok", "wrong": 0})
            for s in sizes:
                for i in range(iters):
                    rows.append((c, 100 + r, idx, s, tokens.get(s), "graph", "torch", i,
                                 round(fresh[c] * wobble[(r + len(c)) % len(wobble)] * (1 + 0.001 * i), 4), None))
    samples = pd.concat([data.samples, pd.DataFrame(rows, columns=results.SAMPLES_COLUMNS)], ignore_index=True)
    samples["tokens"] = samples["tokens"].astype("Int64")
    samples.to_csv(folder / "samples.csv", index=False)
    results.summarize(samples, {}, nranks=2).to_csv(folder / "summary.csv", index=False)
    (folder / "run.json").write_text(json.dumps(run))
    return plan


# ------------------------------------------------------------------ tests

def test_report_of_a_real_cpu_run_draws_every_plot(tmp_path):
    run_dir = copy_run("cpu-aa-a", tmp_path / "run")
    proc = run_cli("report", run_dir)
    assert proc.returncode == 0, proc.stderr
    assert "screening (stage 1: estimates, not verdicts" in proc.stdout and "report:" in proc.stdout
    dom, console = render(run_dir / "report.html")
    assert_drawn(dom, console, expected=3)  # gloo: eager only -> latency, busbw, screening heatmap
    assert "screening only" in dom and "Certified answer" in dom
    # every time in the HTML itself with its spread and launch count, not only on hover
    summary = results.load_run(run_dir).summary
    rows = re.findall(r"<tr><td>[^<]*</td><td>(default|aa)</td><td>([\d.]+)</td><td>([\d.]+-[\d.]+)</td>"
                      r"<td>(\d+)</td><td>([\d.]+-[\d.]+)</td>", path_text(run_dir))
    assert len(rows) == len(summary) and {r[3] for r in rows} == {str(n) for n in summary["launches"]}
    # the time is the gmean, named so: the same number the sweep table (and compare) shows for the cell
    from commdiag import cli

    shown = {(l.split()[3], l.split()[0], l.split()[4]) for l in cli.render_table(results.load_run(run_dir))
             .splitlines() if l.split()[0].isdigit()}
    assert {(c, gm) for c, gm, *_ in rows} == {(c, gm) for c, _, gm in shown}
    assert "gmean (us)" in path_text(run_dir) and "median of the launches" not in path_text(run_dir)
    assert "(README, Verdicts)" not in dom and "docs/verdicts.md" in dom


def test_report_with_both_modes_failures_and_a_hostile_label(tmp_path):
    evil = "evil" + HOSTILE
    sizes = [4096, 65536, 1048576, 4194304]
    table = {"default": {s: [10.0, 10.3, 9.9] for s in sizes},
             evil: {s: [9.0, 9.2, 8.9] for s in sizes},
             "other": {s: [10.1, 9.8, 10.2] for s in sizes}}
    run_dir = make_run(tmp_path / "run", table, configs={"default": {}, evil: {"NCCL_PROTO": HOSTILE},
                                                          "other": {"NCCL_ALGO": "Ring"}},
                       statuses={("other", 1): "failed"})
    add_stage2(run_dir, {"default": 10.0, evil: 9.0})
    path, verdicts = report.write_report(run_dir)
    text = path.read_text()
    # The raw file: the hostile string never appears unescaped, in HTML or in the plot JSON.
    assert HOSTILE not in text and "<img src=x" not in text
    assert "&lt;img src=x" in text
    dom, console = render(path)
    assert_drawn(dom, console, expected=8)  # stage 2 + 3 per mode x 2 modes + graph-vs-eager
    assert not re.search(r"<body[^>]*data-pwned", dom) and 'data-pwned="' not in dom  # no script ran
    assert "<img src=\"x\"" not in dom and "<img src=x" not in dom
    assert "&lt;img src=x onerror=" in dom  # shown as text
    assert "Failed, timed-out and incorrect launches (1)" in dom and "RuntimeError: boom" in dom
    # The failed config is excluded; the hostile one is a certified 10% winner and is shown as such.
    assert "other" in verdicts.excluded
    assert re.search(r"certified (9\.9|10\.[0-2])% faster: ratio 0\.[89]\d\d", dom), "the certified row"
    assert verdicts.band_winner("decode", "graph").config == evil


def test_large_report_stays_lean_and_opens_quickly(tmp_path):
    rng = random.Random(3)
    sizes = [4096 * 2 ** i for i in range(20)]
    table = {"default": {s: [10 + s / 1e5 * rng.uniform(0.95, 1.05) for _ in range(3)] for s in sizes}}
    for i in range(49):
        table[f"PROTO=LL,ALGO=Ring,NCHANNELS={i}"] = {s: [(10 + s / 1e5) * rng.uniform(0.8, 1.2) for _ in range(3)]
                                                      for s in sizes}
    run_dir = make_run(tmp_path / "run", table, iters=20)
    path, _ = report.write_report(run_dir)
    text = path.read_text()
    data_part = len(text) - len(report.plotly_js())
    assert data_part < 1_500_000, f"report data is {data_part} bytes: plots must carry launch medians, not samples"
    dom, console = render(path, budget_ms=30000)  # its time: benchmarks/ (no timed tests)
    assert_drawn(dom, console, expected=7)


def test_publish_writes_a_loadable_profile_for_a_certified_winner_and_removes_it_when_gone(tmp_path):
    sizes = [4096, 65536, 1048576]
    table = {"default": {s: [10.0, 10.3, 9.9] for s in sizes}, "fast": {s: [8.0, 8.2, 7.9] for s in sizes}}
    run_dir = make_run(tmp_path / "run", table, configs={"default": {}, "fast": {"NCCL_PROTO": "LL"}})
    assert report.publish(run_dir).profiles == ()  # screening alone never writes a profile
    add_stage2(run_dir, {"default": 10.0, "fast": 8.0})
    pub = report.publish(run_dir)
    assert set(pub.profiles) == {"profile.env", "profile-decode.env", "profile-prefill.env"}
    prof = profile.load(run_dir / "profile.env")
    assert prof.settings == {"NCCL_NVLS_ENABLE": "0", "NCCL_PROTO": "LL"}
    assert prof.meta["config"] == "fast" and "p = 0.00049 (stage 2, paired signed-rank test)" in prof.meta["certified"]
    # The same folder whose confirmation no longer certifies it (e.g. extended): stale profiles go.
    run = json.loads((run_dir / "run.json").read_text())
    data = results.load_run(run_dir)
    same = data.samples.assign(time_us=data.samples["time_us"].where(data.samples["config"] != "fast", 10.0))
    gone = verdict.evaluate(stats.launch_values(same, None, stats.launch_stages(run)), run, {})
    assert report.write_profiles(run_dir, gone, run) == ()
    assert not list(run_dir.glob("profile*.env"))


@pytest.mark.parametrize("text,expected", [
    ("[]", "not a commdiag run"),
    ('{"format": "commdiag-run", "version": 2}', "spec"),
])
def test_report_of_a_damaged_run_json_is_one_usage_error(tmp_path, text, expected):
    (tmp_path / "run.json").write_text(text)
    for cmd in (["report", tmp_path], ["compare", tmp_path, tmp_path]):
        proc = run_cli(*cmd)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith("commdiag: error:") and words(proc.stderr).startswith(f"commdiag: error: {tmp_path / 'run.json'}: ") and expected in words(proc.stderr)


def test_verdict_text_shows_screening_per_band_and_the_stage_2_status():
    v = verdict.evaluate_run(results.load_run(FIXTURES / "cpu-aa-b"))
    text = report.render_verdicts(v)
    assert len([l for l in text.splitlines() if l.strip().startswith(("decode", "prefill"))]) == 2
    assert "confirmation (stage 2): screening only" in text and "keep NCCL defaults" in text
    assert max(len(l) for l in text.splitlines() if not l.startswith(("warning", "confirmation"))) <= 120


def test_long_config_names_are_never_cut_into_the_same_text():
    a, b = "PROTO=LL,ALGO=Ring,MAX_NCHANNELS=8,BUFFSIZE=4194304", "PROTO=LL,ALGO=Ring,MAX_NCHANNELS=8,BUFFSIZE=16777216"
    assert report._fit(a, 28) != report._fit(b, 28) and len(report._fit(a, 28)) == 28


def test_report_of_a_real_run_with_crashed_and_incorrect_launches(tmp_path):
    # Recorded with tests/fixtures/runs/cpu-faults/spec.yaml: COMMDIAG_TEST_FAULT crash / wrong.
    run_dir = copy_run("cpu-faults", tmp_path / "run")
    data = results.load_run(run_dir)
    v = verdict.evaluate_run(data)
    assert set(v.excluded) == {"crash", "wrongsum"}
    assert {c.config for c in v.screening.cells} == {"aa"}  # crashed and incorrect launches are not timed
    path, _ = report.write_report(run_dir, tmp_path / "elsewhere.html")
    dom, console = render(path)
    assert_drawn(dom, console, expected=3)
    n_bad = sum(l["status"] in ("failed", "incorrect") for l in data.run["launches"])
    assert n_bad == 4 and f"Failed, timed-out and incorrect launches ({n_bad})" in dom
    assert "crashing rank 0 on purpose" in dom  # the stderr tail of the crash


def test_plot_labels_escape_markup_but_show_quotes_as_quotes(tmp_path):
    name = 'a"b\'c&<i>'
    run_dir = make_run(tmp_path / "run", {"default": {4096: [10.0, 10.1, 9.9]}, name: {4096: [9.0, 9.1, 8.9]}},
                       configs={"default": {}, name: {"NCCL_PROTO": "LL"}})
    data = results.load_run(run_dir)
    figs = report.figures(data, verdict.evaluate_run(data), stats.launch_values(data.samples))
    names = {t.get("name") for f in figs for t in f["data"]}
    assert 'a"b\'c&amp;&lt;i&gt;' in names  # plotly.js shows &quot; literally: quotes stay quotes
    assert not [n for n in names if n and ("&quot;" in n or "<i>" in n)]


def test_a_fifo_named_like_a_profile_never_blocks_publishing(tmp_path):
    import os
    import threading

    run_dir = make_run(tmp_path / "run", {"default": {4096: [10.0, 10.1, 9.9]}, "x": {4096: [9.9, 10.0, 10.1]}})
    os.mkfifo(run_dir / "profile-stale.env")
    done = threading.Event()
    worker = threading.Thread(target=lambda: (report.publish(run_dir), done.set()), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert done.is_set(), "publish blocked reading a FIFO"
    assert (run_dir / "profile-stale.env").exists()  # not ours to remove: it is not a commdiag profile file


def test_heatmap_colours_only_certified_differences_and_greys_estimates(tmp_path):
    sizes = [4096, 65536, 1048576]
    # 'fast' is certified 20% faster in stage 2; 'noisy' looks 99% slower in screening but is never tested
    table = {"default": {s: [10.0, 10.3, 9.9] for s in sizes}, "fast": {s: [8.0, 8.2, 7.9] for s in sizes},
             "noisy": {s: [19.0, 21.0, 19.9] for s in sizes}}
    run_dir = make_run(tmp_path / "run", table, modes=("graph",))
    add_stage2(run_dir, {"default": 10.0, "fast": 8.0})
    data = results.load_run(run_dir)
    v = verdict.evaluate_run(data)
    assert [c.claim.config for c in v.certifications if c.certified] == ["fast", "fast"]
    (heat,) = [f for f in report.figures(data, v, verdict.run_values(data)) if f["id"] == "speedup-graph"]
    grey, colour = heat["data"]
    rows = heat["data"][0]["y"]
    fast, noisy = rows.index("fast"), rows.index("noisy")
    assert all(z is not None and z < -3 for z in colour["z"][fast]) and not any(grey["text"][fast])
    assert all(z is None for z in colour["z"][noisy])  # never certified: no colour at all
    assert grey["z"][noisy] == [0.0] * 3 and all(t.startswith("(+") for t in grey["text"][noisy])
    assert set(grey["colorscale"][0][1:]) == {"#e4e4e4"}  # one grey: an estimate's size shows no colour


def test_log_axes_label_every_tick_in_full_and_the_report_links_the_docs(tmp_path):
    run_dir = copy_run("cpu-aa-b", tmp_path / "run")
    path, _ = report.write_report(run_dir)
    dom, console = render(path)
    assert_drawn(dom, console, expected=3)
    latency = dom.split('id="latency-eager"', 1)[1].split("<h3>", 1)[0]
    labels = re.findall(r'class="[xy]tick"><text[^>]*>([^<]*)</text>', latency)
    assert len(labels) >= 4, labels
    assert not [t for t in labels if re.fullmatch(r"\d", t)], labels  # no bare minor-tick digits
    assert any(t.endswith(("KiB", "MiB")) for t in labels)  # sizes as sizes
    assert 'href="file://' in dom and "docs/verdicts.md" in dom and "(README, Verdicts)" not in dom
    glossary = (report.DOCS / "glossary.md").read_text()
    for term, anchor in report.TERMS:
        assert f'<a id="{anchor}"></a>' in glossary, anchor  # every term the report links has its entry
        assert f'glossary.md#{anchor}">{term}</a>' in dom


def test_without_plotly_a_finished_run_keeps_its_verdicts_and_profiles_and_says_how_to_get_the_report(
        tmp_path, monkeypatch, capsys):
    """A server's venv installed without commdiag's dependencies may lack plotly: the launches are done, so
    the sweep's end still gives the verdicts and profiles, and its report line says what to install;
    ``commdiag report`` says the same as one error (exit 2), in a real child where plotly cannot import."""
    import sys
    from types import SimpleNamespace

    from commdiag import cli

    sizes = [4096, 65536, 1048576]
    table = {"default": {s: [10.0, 10.3, 9.9] for s in sizes}, "fast": {s: [8.0, 8.2, 7.9] for s in sizes}}
    run_dir = make_run(tmp_path / "run", table, configs={"default": {}, "fast": {"NCCL_PROTO": "LL"}})
    add_stage2(run_dir, {"default": 10.0, "fast": 8.0})
    monkeypatch.setitem(sys.modules, "plotly.offline", None)  # `from plotly.offline import ...` fails
    monkeypatch.setattr(report, "PLOTLY_BUNDLE", tmp_path / "gone.js")  # and no vendored bundle either
    pub = report.publish(run_dir)
    assert pub.report is None and not (run_dir / "report.html").exists()
    assert pub.report_note == f"not written: plotly is not installed here (pip install plotly); then  " \
                              f"commdiag report {run_dir}"
    assert "profile.env" in pub.profiles and (run_dir / "profile.env").is_file()  # the certified winner's
    with pytest.raises(SystemExit) as ended:
        # what run_sweep returns for it (the library publishes; the CLI prints what was published)
        cli._finish_run(SimpleNamespace(run_dir=run_dir, state="complete", counts={"ok": 1}, all_ok=True,
                                        published=pub), False)
    assert ended.value.code == 0  # the sweep succeeded: only its page is missing
    out = words(capsys.readouterr().out)
    assert "report: not written: plotly is not installed here (pip install plotly)" in out
    assert "fast" in out and "profiles: " in out
    hidden = tmp_path / "no-plotly" / "plotly"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('plotly is hidden by this test')\n")
    # with the vendored plotly.js bundle (commdiag/analyse/plotlyjs) the page needs no plotly package
    proc = run_cli("report", run_dir, env={"PYTHONPATH": str(hidden.parent)})
    assert proc.returncode == 0 and (run_dir / "report.html").is_file(), proc.stderr
    assert "plotly.js (cartesian - minified) v4.1.1" in (run_dir / "report.html").read_text()[:100_000]


def test_every_page_loads_in_a_fresh_browser_context(tmp_path):
    """tests/browser.py loads pages in one browser: nothing an earlier page stored reaches the next
    (each hostile page is judged on its own)."""
    (tmp_path / "set.html").write_text("<html><body><script>localStorage.setItem('k', '1');"
                                       "document.cookie = 'c=1';</script></body></html>")
    (tmp_path / "read.html").write_text(
        "<html><body><script>document.body.setAttribute('data-ls', String(localStorage.getItem('k')));"
        "document.body.setAttribute('data-cookie', document.cookie || 'none');</script></body></html>")
    render(tmp_path / "set.html")
    dom, console = render(tmp_path / "read.html")
    assert not console and 'data-ls="null"' in dom and 'data-cookie="none"' in dom
