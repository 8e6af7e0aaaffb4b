"""ab's HTML report (ab/report.py, the sweep report's page), rendered in a real headless Chromium:
a real CPU ab run through the CLI, its report as ``commdiag ab`` writes it and as ``commdiag report``
rewrites it, and the same run folder with hostile config, metric and stdout values.

Without chromium these tests skip, unless COMMDIAG_REQUIRE_CHROMIUM=1 (CI sets it): then they fail.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from commdiag.ab import report as ab_report, runner

from conftest import assert_fits, run_cli, words
from test_report import HOSTILE, assert_drawn, render

# The first launch (whichever arm it is) prints a hostile value where the number belongs and a hostile
# stderr: a failed launch whose error and tail carry it.  Every other launch prints VALUE x 1% noise.
CMD = ["{python}", "-c", "import os,sys,random,math\n"
       "f = os.environ['FLAG']\n"
       "if os.path.exists(f):\n"
       "    os.remove(f); print('toks:', os.environ['HOSTILE']); sys.stderr.write(os.environ['HOSTILE']); sys.exit(0)\n"
       "print('toks:', float(os.environ['VALUE']) * math.exp(random.gauss(0, 0.01)))"]
TOKS = {"name": "toks", "regex": r"toks: (?P<value>\S+)", "better": "higher"}


@pytest.fixture(scope="module")
def ab_run(tmp_path_factory) -> tuple[Path, object]:
    """One real run for the module's tests (they only read it, or copy it)."""
    import yaml

    tmp_path = tmp_path_factory.mktemp("ab-report")
    flag = tmp_path / "fail-first"
    flag.write_text("")
    spec = tmp_path / "ab.yaml"
    spec.write_text(yaml.safe_dump({"name": "report", "seed": 11, "command": CMD, "metrics": [TOKS], "rounds": 9,
                                    "base_env": {"VALUE": "100", "FLAG": str(flag), "HOSTILE": HOSTILE},
                                    "configs": {"seed": {"VALUE": "115"}}}))
    out = tmp_path / "run"
    return out, run_cli("ab", spec, "--out", out, timeout=180)


def _hostile_copy(run_dir: Path, dest: Path) -> Path:
    """The run folder with its arm and metric renamed to hostile strings in run.json (a hand-edited or
    damaged file: the spec itself refuses such names)."""
    shutil.copytree(run_dir, dest)
    text = (dest / "run.json").read_text()
    run = json.loads(text)
    arm, metric = "seed" + HOSTILE, "toks" + HOSTILE
    for c in run["configs"]:
        if c["name"] == "seed":
            c["name"] = arm
    for l in run["launches"]:
        if l["config"] == "seed":
            l["config"] = arm
        if "toks" in (l.get("values") or {}):
            l["values"] = {metric: l["values"]["toks"]}
    run["spec"]["metrics"][0]["name"] = metric
    (dest / "run.json").write_text(json.dumps(run))
    return dest


def test_the_report_of_a_real_ab_run_shows_every_launch_the_intervals_and_the_verdicts(ab_run, tmp_path):
    run_dir, r = ab_run
    assert r.returncode == 3, r.stderr[-2000:]  # one launch failed (its hostile value): the run went on
    assert f"report: {run_dir / 'report.html'}" in r.stdout
    assert_fits(r)
    run = runner.load(run_dir)
    if run["machine_state"]["available"]:  # a GPU machine: NVML read around every launch
        assert all(isinstance(l["machine"], dict) for l in run["launches"])
        assert any(l["machine"].get("available") is True for l in run["launches"])
    else:  # no NVML on this machine: the record says so once, and nothing broke
        assert "machine state during the launches: not recorded (NVML" in words(r.stdout)
        assert all(l["machine"] == {"available": False} for l in run["launches"])
    (failed,) = [l for l in run["launches"] if l["status"] == "failed"]
    assert failed["index"] == 0 and "not a number > 0" in failed["error"]

    dom, console = render(run_dir / "report.html")
    assert_drawn(dom, console, expected=2)  # toks per launch in time order; the verdicts' intervals
    assert "seed: toks is BETTER than default" in dom and "(certified)" in dom
    assert 'class="faster">seed: toks is BETTER' in dom  # coloured: certified
    assert "Failed launches (1)" in dom and "&lt;img src=x" in dom  # its error and tail, as text
    assert not re.search(r"<body[^>]*data-pwned", dom)
    glossary = (ab_report.page_mod.DOCS / "glossary.md").read_text()
    for term, anchor in ab_report.TERMS:  # every term the report links has its entry
        assert f'<a id="{anchor}"></a>' in glossary and f"#{anchor}" in dom, anchor
    # every successful launch is a point of its arm's series, in launch order
    figs = json.loads(re.search(r'<script id="figs" type="application/json">(.*?)</script>',
                                (run_dir / "report.html").read_text(), re.S).group(1))
    series = {t["name"]: t["x"] for t in figs[0]["data"]}
    assert series == {c: [l["index"] for l in run["launches"] if l["config"] == c and l["status"] == "ok"]
                      for c in ("default", "seed")}
    (iv,) = figs[1]["data"]
    assert iv["error_y"]["arrayminus"][0] > 0 and iv["y"][0] > 1.1

    # commdiag report on the ab folder: the same page, the same verdicts printed, --json too
    rep = run_cli("report", run_dir, "--json")
    assert rep.returncode == 0, rep.stderr[-2000:]
    out = json.loads(rep.stdout)
    assert out["format"] == "commdiag-ab-result" and out["report"] == str(run_dir / "report.html")
    assert [(v["config"], v["verdict"]) for v in out["verdicts"]] == [("seed", "better")]


def test_hostile_names_and_stdout_values_are_shown_never_run(ab_run, tmp_path):
    run_dir, r = ab_run
    assert r.returncode == 3, r.stderr[-2000:]
    evil = _hostile_copy(run_dir, tmp_path / "evil")
    rep = run_cli("report", evil, "--out", tmp_path / "evil.html")
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert "is BETTER than default" in rep.stdout
    text = (tmp_path / "evil.html").read_text()
    assert HOSTILE not in text and "<img src=x" not in text and "&lt;img src=x" in text
    dom, console = render(tmp_path / "evil.html")
    assert_drawn(dom, console, expected=2)
    assert not re.search(r"<body[^>]*data-pwned", dom) and 'data-pwned="' not in dom  # no script ran
    assert "<img src=\"x\"" not in dom and "<img src=x" not in dom
    assert "is BETTER than default" in dom and "&lt;img src=x onerror=" in dom  # shown as text
