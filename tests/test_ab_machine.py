"""ab's machine state per launch (runner + ab/machine.py) on replayed NVML readings: real benchmark
processes, the sweep's sampler watching them by their marker, confounders named beside a verdict.

There is no GPU here: the sampler reads ``nvmlreplay.ReplayNvml`` over test_machine_state's
snapshots (the 1x H200 capture's fields, values changed where a condition is needed).  Which
snapshot answers is chosen by the launch that is running: its benchmark writes its own pid into a
file named after the snapshot (load, hot, other) for as long as it runs, and NVML then lists that pid
as a compute process on every GPU, as it would list a real benchmark's.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

from commdiag.ab import machine, render, report as ab_report, runner, spec as ab_spec
from commdiag.measure import launcher, machinestate as ms, nvmlreplay

from test_machine_state import OTHER, constructed

# Writes its pid to FLAGS/<SNAPSHOT> while it "runs", then prints its value.
CMD = ["{python}", "-c", "import os,time,random,math,pathlib\n"
       "p = pathlib.Path(os.environ['FLAGS']) / os.environ['SNAPSHOT']\n"
       "p.write_text(str(os.getpid())); time.sleep(0.25); p.unlink()\n"
       "print('toks:', float(os.environ['VALUE']) * math.exp(random.gauss(0, 0.01)))"]
TOKS = {"name": "toks", "regex": r"toks: (?P<value>[0-9.]+)", "better": "higher"}


class LaunchReplay(nvmlreplay.ReplayNvml):
    """Answers from the snapshot the running benchmark names, listing the benchmark's own pid (and,
    in ``other``, a stranger's) as the GPUs' compute processes; idle between launches."""

    def __init__(self, recording: dict, flags: Path):
        super().__init__(recording, "idle")
        self.flags = flags
        self.by_label = {s["label"]: s for s in self.snapshots}

    def _pick(self) -> dict:
        for f in sorted(self.flags.iterdir()):
            try:
                pid = int(f.read_text())
            except (OSError, ValueError):
                continue  # being written or removed
            snap = copy.deepcopy(self.by_label[f.name])
            for g in snap["gpus"]:
                g["processes"] = [{"pid": pid, "used_memory": 1 << 30, "name": "/usr/bin/python3"}] + (
                    [{"pid": OTHER, "used_memory": 1 << 20, "name": "/opt/venv/bin/python"}] if f.name == "other" else [])
            return snap
        return self.by_label["idle"]

    def _field(self, h, name):
        if name == "processes" or name == "sm_clock":  # a quick reading starts with the clocks
            self.current = self._pick()
        return super()._field(h, name)


def _run(tmp_path: Path) -> dict:
    flags = tmp_path / "flags"
    flags.mkdir()
    spec = ab_spec.resolve({"name": "m", "seed": 5, "command": CMD, "metrics": [TOKS], "rounds": 9,
                            "base_env": {"VALUE": "100", "FLAGS": str(flags), "SNAPSHOT": "load"},
                            "configs": {"seed": {"VALUE": "115", "SNAPSHOT": "hot"},
                                        "busy": {"VALUE": "100", "SNAPSHOT": "other"}}})
    sampler = ms.open_sampler("gloo", nvml=LaunchReplay(constructed(), flags), period_s=0.02)
    res = runner.run_ab(spec, run_dir=tmp_path / "run", env=dict(os.environ), sampler=sampler)
    assert res.state == "complete" and res.counts == {"ok": 27}
    return runner.load(tmp_path / "run")


def test_throttling_and_another_process_are_named_beside_the_verdicts(tmp_path):
    run = _run(tmp_path)
    assert run["machine_state"]["available"] and len(run["machine_state"]["gpus"]) == 2
    for l in run["launches"]:
        m = l["machine"]
        assert m["available"] and m["samples"] >= 1, l
        # the launch's own benchmark (told by its marker) is never "another process"; the stranger is
        assert {o["pid"] for o in m["others"]} == ({OTHER} if l["config"] == "busy" else set()), l
        assert not launcher.marked_pids(l["marker"])
    m = machine.check(run)
    # throttled in seed's launches, not in default's: seed's verdict is confounded
    hot, clocks = m.for_arm("seed")
    assert clocks.startswith("SM clocks under load differed between the arms: default's launches at 1980 MHz, "
                             "seed's at 1755 MHz")
    assert hot.startswith("9 of seed's 9 launches ran with thermal throttling (HW_THERMAL_SLOWDOWN on GPU 0")
    assert hot.endswith("; 0 of default's 9")
    (beside,) = [c for c in m.for_arm("busy") if "another process" in c]
    assert beside.startswith("9 of busy's 9 launches ran beside another process on their GPUs (pid 4242")

    a = render.analyse(run)
    text = render.render_text(run, a)
    assert all(len(line) <= 100 for line in text.splitlines())
    seed_at = text.index("seed: toks is BETTER than default")
    assert "certified better, but confounded: 9 of seed's 9 launches ran with thermal throttling" in \
        " ".join(text[seed_at:].split())
    busy = next(v for v in a["verdicts"] if v.config == "busy")  # an A/A twin: equivalent or inconclusive
    head = "not certified, and" if busy.verdict == "inconclusive" else f"certified {busy.verdict}, but"
    assert busy.verdict in ("equivalent", "inconclusive")
    assert f"{head} confounded: 9 of busy's 9 launches ran beside another process" in " ".join(text.split())
    assert "machine state during the launches:" in text and "another process (pid 4242, python)" in text
    out = render.to_json(tmp_path / "run", run, a, render.counts(run))
    by = {v["config"]: v for v in out["verdicts"]}
    assert by["seed"]["verdict"] == "better" and by["seed"]["confounders"] == [hot, clocks]
    assert out["machine_state"]["recorded"] and out["machine_state"]["arms"]["seed"] == [hot, clocks]
    json.dumps(out)
    page, _ = ab_report.write_report(tmp_path / "run", run=run, a=a)
    html = page.read_text()
    assert "certified better, but confounded: 9 of seed&#x27;s 9 launches" in html
    assert f"and: {clocks}".replace("'", "&#x27;") in html  # whole sentences, not the terminal's wrapped lines
    assert 'class="faster">seed: toks is BETTER' in html
    assert "HW_THERMAL_SLOWDOWN" in html and "<th>stage</th>" not in html


def test_a_process_on_a_gpu_the_launch_did_not_use_is_not_its_confounder():
    # An 8-GPU box running the user's TP server on some GPUs: another job on a GPU the launch's own
    # processes never appeared on is named in the notes, never as this launch's condition.
    import time

    from commdiag.analyse import confounders
    from test_machine_state import OWN

    def watched(stranger_gpu: int) -> tuple[dict, dict]:
        rec = constructed()
        for snap in rec["snapshots"]:
            for g in snap["gpus"]:
                g["processes"] = ([{"pid": OWN, "name": "python3"}] if g["index"] == 0 else []) + (
                    [{"pid": OTHER, "name": "/opt/venv/bin/python"}] if g["index"] == stranger_gpu else [])
        sampler = ms.open_sampler("gloo", nvml=nvmlreplay.ReplayNvml(rec, "load"), period_s=0.02)
        with sampler.watch(lambda pid: pid == OWN) as w:
            time.sleep(0.1)
        launch = {"index": 0, "config": "seed", "status": "ok", "machine": w.record()}
        return launch, {"machine_state": sampler.describe(), "launches": [launch]}

    launch, run = watched(stranger_gpu=1)
    assert launch["machine"]["own_gpus"] == [0]
    assert {(o["gpu"], o["pid"]) for o in launch["machine"]["others"]} == {(1, OTHER)}
    assert confounders.used_gpus(launch, run) == {0}
    assert not [f for f in confounders.launch_facts(launch, run) if f.group == confounders.PROCESS]
    launch, run = watched(stranger_gpu=0)
    (fact,) = [f for f in confounders.launch_facts(launch, run) if f.group == confounders.PROCESS]
    assert fact.detail == "pid 4242, python, GPU 0"
