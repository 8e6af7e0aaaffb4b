"""``commdiag trace`` on real Kineto traces (tests/fixtures/traces/: a TP=2 decode step recorded on an
H200, eager and as a CUDA graph, see README there) and on synthetic ones of the same shape
(tests/kineto_synth.py) for what the real ones do not show: a launch-bound eager step.

The split is checked against Holistic Trace Analysis 0.5.0's temporal breakdown of every rank and step
(hta-per-step.json, made by hta_per_step.py beside the traces) and of the whole trace (hta-reference.txt,
as recorded with the traces).  The two differ by about 0.1% of a step, and only because HTA rounds
every event to whole microseconds (ts up, end down: hta.common.trace_parser.round_down_time_stamps):
with that rounding applied to the same events, the split equals HTA's to the nanosecond.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kineto_synth
from commdiag.errors import CommdiagError
from commdiag.trace import analysis, analyse_paths, reader, render
from conftest import REPO, assert_fits, one_message, run_cli, words

TRACES = Path(__file__).parent / "fixtures" / "traces"
HTA = json.loads((TRACES / "hta-per-step.json").read_text())


def traces(mode: str) -> list[Path]:
    return [TRACES / f"trace-{mode}-rank{r}.json.gz" for r in (0, 1)]


def hta_rounded(t: reader.Trace) -> reader.Trace:
    """The trace as HTA sees it: every GPU event's start rounded up and its end down to a microsecond."""
    t.gpu = [(math.ceil(g[0]), math.floor(g[0] + g[1]) - math.ceil(g[0])) + g[2:] for g in t.gpu]
    return t


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_split_per_rank_and_step_agrees_with_hta_and_the_difference_is_its_rounding(mode):
    rep = analysis.analyse([reader.read(p) for p in traces(mode)])
    rounded = analysis.analyse([hta_rounded(reader.read(p)) for p in traces(mode)])
    rows = HTA["modes"][mode]
    assert len(rows) == 10  # 2 ranks x 5 steps, each found by HTA from its own ProfilerStep annotations
    for row in rows:
        for r, tol in ((rep, 0.01), (rounded, 1e-6)):
            sp = r.ranks[row["rank"]].steps[row["step"]].split
            assert sp.step_us == pytest.approx(row["kernel_time_us"], abs=tol * sp.step_us + 1e-3)
            assert sp.compute_us == pytest.approx(row["compute_us"], abs=tol * sp.step_us + 1e-3)
            assert sp.idle_us == pytest.approx(row["idle_us"], abs=tol * sp.step_us + 1e-3)
            # HTA's non-compute time is communication and memory copies while no compute kernel runs
            assert sp.comm_exposed_us + sp.memory_us == pytest.approx(row["non_compute_us"],
                                                                      abs=tol * sp.step_us + 1e-3)
        assert sp.compute_us + sp.comm_exposed_us + sp.memory_us + sp.idle_us == pytest.approx(sp.step_us)
    # and the raw difference is small but not nothing: HTA loses ~1 us per kernel
    sp = rep.ranks[0].steps[1].split
    assert 0.0005 < abs(sp.compute_us - rows[1]["compute_us"]) / sp.step_us < 0.002


def _hta_whole(mode: str) -> dict[int, dict]:
    """The temporal breakdown rows of hta-reference.txt (the whole trace, per rank)."""
    text = (TRACES / "hta-reference.txt").read_text()
    block = text.split(f"{mode} temporal breakdown", 1)[1].split(f"{mode} comm/comp overlap", 1)[0]
    out = {}
    for line in block.strip().splitlines()[1:]:
        _i, rank, idle, compute, non_compute, kernel, *_ = line.split()
        out[int(rank)] = {"idle": float(idle), "compute": float(compute), "non_compute": float(non_compute),
                          "span": float(kernel)}
    return out


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_whole_trace_split_agrees_with_the_recorded_hta_reference(mode):
    for rank, ref in _hta_whole(mode).items():
        t = reader.read(traces(mode)[rank])
        start, end = min(g[0] for g in t.gpu), max(g[0] + g[1] for g in t.gpu)
        sp, _ = analysis.split(t, start, end)
        for mine, theirs in ((sp.step_us, ref["span"]), (sp.compute_us, ref["compute"]), (sp.idle_us, ref["idle"]),
                             (sp.comm_exposed_us + sp.memory_us, ref["non_compute"])):
            assert abs(mine - theirs) <= 0.01 * sp.step_us
        exact, _ = analysis.split(hta_rounded(t), math.ceil(start), math.floor(end))
        assert (exact.compute_us, exact.idle_us) == (ref["compute"], ref["idle"])
    # HTA's comm/comp overlap is 0.0% on both: nothing here overlaps
    assert all(analysis.split(reader.read(p), 0, 1e300)[0].comm_overlapped_us == 0 for p in traces(mode))


def test_host_wait_agrees_with_hta_idle_breakdown():
    """HTA's idle breakdown of eager rank 0 (one stream): host_wait 529 us over the trace."""
    t = reader.read(traces("eager")[0])
    start, end = min(g[0] for g in t.gpu), max(g[0] + g[1] for g in t.gpu)
    sp, _ = analysis.split(hta_rounded(t), math.ceil(start), math.floor(end))
    assert sp.host_idle_us == 529.0


def test_cli_names_ring_ll_the_sizes_the_straggler_and_the_bottleneck(tmp_path):
    proc = run_cli("trace", *traces("eager"))
    assert proc.returncode == 0, proc.stderr
    assert_fits(proc)
    out = proc.stdout
    first = out.split("\n\n", 1)[0]
    assert first.startswith("communication is 99% of this step (NCCL chose AllReduce 64 KiB RING/LL)")
    assert "the GPU waits for the CPU 0% of the time: communication is where the time is" in " ".join(first.split())
    assert "AllReduce 32768 x BFloat16 = 64 KiB, group of 2: NCCL chose RING/LL; 80 calls" in " ".join(out.split())
    # the first step of rank 0 sat 245 ms in its first all-reduce waiting for rank 1 to arrive
    assert re.search(r"step 0: slowest rank 0 317\.8 ms, \S+ over rank 1; rank 1 arrived last: the others waited "
                     r"up to 245\.0 ms", words(out)), out
    assert "steps: the annotations decode_step_N (record_function)" in out

    proc = run_cli("trace", "--json", *traces("graph"))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert (data["format"], data["version"], data["verdict"]) == ("commdiag-trace", 1, "communication-bound")
    sizes = [z for r in data["ranks"] for z in r["sizes"]]
    assert {(z["algorithm"], z["protocol"], z["nelems"], z["dtype"]) for z in sizes} == {("RING", "LL", None, "bfloat16")}
    assert [len(r["steps"]) for r in data["ranks"]] == [5, 5]
    assert "CUDA graph replays record no record_param_comms" in " ".join(data["ranks"][0]["notes"])


def test_eager_launch_bound_step_against_its_graph(tmp_path):
    """Same step twice: eager with a launch every 20 us for 5 us kernels, and as one graph replay."""
    eager = kineto_synth.write(tmp_path / "eager.json", "eager", world_size=1)
    graph = kineto_synth.write(tmp_path / "graph.json.gz", "graph", world_size=1)
    e, g = analyse_paths([eager]), analyse_paths([graph])
    assert e.verdict == "launch-bound" and g.verdict != "launch-bound"
    assert e.headline.endswith("(eager launches): CUDA graphs, not NCCL settings, are where the time is")
    assert e.typical["host_idle"] > 0.4 and g.typical["host_idle"] == 0
    assert e.ranks[0].step_source.startswith("ProfilerStep#N")
    # the real TP=2 traces: neither is launch-bound (the CPU runs 68 ms ahead of a 72 ms step), both say so
    for mode in ("eager", "graph"):
        rep = analyse_paths(traces(mode))
        assert rep.verdict == "communication-bound" and rep.typical["host_idle"] < 0.001
        assert all(s.cpu_us < 0.2 * s.split.step_us for r in rep.ranks for s in r.steps[1:])


def test_a_folder_of_plain_json_reads_as_the_gzipped_files_and_a_small_window_changes_nothing(tmp_path,
                                                                                               monkeypatch):
    for p in traces("eager"):
        (tmp_path / p.name[:-3]).write_bytes(gzip.decompress(p.read_bytes()))
    folder = analyse_paths([tmp_path]).to_json()
    monkeypatch.setattr(reader, "CHUNK", 997)  # events cut at every possible place between chunks
    small = analyse_paths(traces("eager")).to_json()
    for d in (folder, small):
        for r in d["ranks"]:
            r.pop("path")
    assert folder == small


def test_the_reader_holds_one_window_of_text_never_the_file(tmp_path, monkeypatch):
    path = kineto_synth.write(tmp_path / "big.json", "eager", world_size=1, steps=20, layers=20, filler=2)
    size = Path(path).stat().st_size
    widest = []
    more = reader._Text.more

    def spy(self):
        got = more(self)
        widest.append(len(self.buf))
        return got

    monkeypatch.setattr(reader, "CHUNK", 16384)
    monkeypatch.setattr(reader._Text, "more", spy)
    t = reader.read(path)
    assert size > 50 * 16384 and len(widest) > 50
    assert max(widest) < 2 * 16384  # what is left of a window + one chunk: never the whole file
    assert len(t.gpu) == 20 * 20 * 4 and t.events > 20 * 20 * 4 * 6


def test_a_graph_trace_without_step_annotations_gives_one_step_per_replay(tmp_path):
    path = kineto_synth.write(tmp_path / "g.json", "graph", world_size=1, step_name="forward {i}",
                              steps=4)
    t = reader.read(path)
    t.cpu_annotations = []  # a server that annotates nothing
    r = analysis.rank_trace(t, 0)
    assert r.step_source.startswith("CUDA graph launches") and len(r.steps) == 4
    r = analysis.rank_trace(reader.read(path), 0, step=r"^forward 2$")
    assert [s.name for s in r.steps] == ["forward 2"]


def test_profiler_steps_win_over_other_annotations_and_a_bad_step_pattern_is_refused(tmp_path):
    path = kineto_synth.write(tmp_path / "t.json", "eager", world_size=1)
    t = reader.read(path)
    # a server's own numbered annotation around each step too: ProfilerStep#N still sets the steps
    t.cpu_annotations += [(f"decode {i}", a[1], a[2], a[3], a[4]) for i, a in enumerate(t.cpu_annotations)]
    assert analysis.rank_trace(t, 0).step_source.startswith("ProfilerStep#N")
    assert [s.name for s in analysis.rank_trace(t, 0, step="^decode").steps] == ["decode 0", "decode 1", "decode 2"]
    with pytest.raises(CommdiagError, match=r"--step: '\(' is not a regular expression"):
        analyse_paths([path], step="(")


def _bad(tmp_path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _cpu_only(tmp_path) -> Path:
    """The real eager trace of rank 1 less its GPU events: what activities=[CPU] records."""
    d = json.loads(gzip.decompress(traces("eager")[1].read_bytes()))
    d["traceEvents"] = [e for e in d["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")]
    return _bad(tmp_path, "cpu.json", json.dumps(d).encode())


@pytest.mark.parametrize("case,expected", [
    ("text", "not a Chrome trace JSON file: it starts with"),
    ("no-events", "no traceEvents: a JSON file, but not a profiler trace"),
    ("cpu-only", "no GPU events (kernels, memory copies): a CPU-only profile"),
    ("truncated-gz", "truncated gzip: the compressed data ends before the trace does"),
    ("truncated-json", "the file ends inside a value (truncated)"),
    ("schema-2", "schemaVersion: 2 is a trace format this commdiag does not read"),
    ("legacy", "no schemaVersion: not a Kineto (torch.profiler) trace"),
    ("same-rank", "rank 0 again"),
    ("fifo", "not a regular file (a FIFO, device, socket or folder): not read"),
    ("empty-folder", "a folder without trace files (*.json, *.json.gz)"),
])
def test_bad_input_is_one_clear_line_and_exit_2(tmp_path, case, expected):
    real = traces("graph")[0].read_bytes()
    text = gzip.decompress(real)
    path = {
        "text": lambda: _bad(tmp_path, "log.json", b"NCCL INFO Bootstrap : Using eth0\n"),
        "no-events": lambda: _bad(tmp_path, "run.json", b'{"format": "commdiag-run", "version": 5}'),
        "cpu-only": lambda: _cpu_only(tmp_path),
        "truncated-gz": lambda: _bad(tmp_path, "t.json.gz", real[: len(real) // 2]),
        "truncated-json": lambda: _bad(tmp_path, "t.json", text[: len(text) // 2]),
        "schema-2": lambda: _bad(tmp_path, "t.json", text.replace(b'"schemaVersion": 1', b'"schemaVersion": 2')),
        "legacy": lambda: _bad(tmp_path, "t.json", b'[{"name": "aten::mm", "ph": "X", "cat": "cpu", "ts": 1, "dur": 2}]'),
        "same-rank": lambda: _bad(tmp_path, "copy.json.gz", real),
        "fifo": lambda: (os.mkfifo(tmp_path / "p.json"), tmp_path / "p.json")[1],  # never blocks
        "empty-folder": lambda: tmp_path,
    }[case]()
    args = [traces("graph")[0], path] if case == "same-rank" else [path]
    proc = run_cli("trace", *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    msg = one_message(proc.stderr)
    assert msg.startswith(f"commdiag: error: {path}: " if case != "same-rank" else "commdiag: error: ")
    assert " ".join(expected.split()) in msg, msg


def test_sweep_winner_saves_at_most_its_ratio_times_the_band_share(tmp_path):
    from test_report import add_stage2, make_run

    sizes = [4096, 65536, 1048576]  # tokens 1 and 16 (decode), 256 (prefill)
    table = {"default": {s: [10.0, 10.3, 9.9] for s in sizes}, "fast": {s: [8.0, 8.2, 7.9] for s in sizes}}
    run_dir = make_run(tmp_path / "run", table, configs={"default": {}, "fast": {"NCCL_PROTO": "LL"}})
    add_stage2(run_dir, {"default": 10.0, "fast": 8.0})
    rep = analyse_paths(traces("eager"), sweep=run_dir)
    decode = next(s for s in rep.savings if s.band == "decode")
    assert decode.config == "fast" and decode.sizes == (65536,) and 0.75 < decode.ratio < 0.85
    assert decode.band_share == pytest.approx(0.99, abs=0.01)  # 80 all-reduces of 64 KiB are the whole step
    assert decode.at_most == pytest.approx((1 - decode.ratio) * decode.band_share)
    prefill = next(s for s in rep.savings if s.band == "prefill")
    assert prefill.sizes == () and prefill.band_share == 0
    text = words(render.render(rep))
    assert re.search(r"decode \(64 KiB; 99% of the step\): fast, ratio 0\.\d+ \(graph\): at most \d+% of the step",
                     text), text
    assert "prefill (no all-reduce of this trace; 0% of the step)" in text
    # graph replays carry no sizes: nothing is placed in a band, and the note says what it could be at most
    graph = next(s for s in analyse_paths(traces("graph"), sweep=run_dir).savings if s.band == "decode")
    assert graph.sizes == () and graph.at_most == 0
    assert "99% of the step is all-reduce of unknown size (graph replays): if all of it were in this band" in graph.note
    with pytest.raises(CommdiagError, match="a commdiag run folder"):  # said before any trace is read
        analyse_paths(["/nonexistent.json"], sweep=tmp_path)


def test_trace_never_imports_torch():
    code = ("import sys\nfrom commdiag import cli\nsys.argv = ['commdiag', 'trace', '--json', %r]\n"
            "try:\n    cli.main()\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n" % str(traces("eager")[0]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["format"] == "commdiag-trace"


def test_html_page_draws_the_split_and_one_timeline_per_rank(tmp_path):
    from test_report import assert_drawn, render

    html = tmp_path / "trace.html"
    proc = run_cli("trace", "--html", html, *traces("eager"))
    assert proc.returncode == 0, proc.stderr
    text = html.read_text()
    assert "communication is 99% of this step" in text and "RING" in text and "64 KiB" in text
    dom, console = render(html)
    assert_drawn(dom, console, 3)  # the split, the timelines of rank 0 and rank 1
    assert 'id="timeline-rank0"' in dom and 'id="timeline-rank1"' in dom


def test_interval_difference_and_gaps_against_a_brute_force_count():
    import random

    from commdiag.trace import intervals

    rng = random.Random(3)
    for _ in range(200):
        a = intervals.union((x, x + rng.randint(0, 6)) for x in (rng.randint(0, 40) for _ in range(6)))
        b = intervals.union((x, x + rng.randint(0, 6)) for x in (rng.randint(0, 40) for _ in range(6)))
        cover = lambda u, t: any(s <= t < e for s, e in u)  # noqa: E731
        ticks = [t + 0.5 for t in range(-1, 50)]
        assert intervals.length(intervals.difference(a, b)) == sum(cover(a, t) and not cover(b, t) for t in ticks)
        assert intervals.overlap(a, b) == sum(cover(a, t) and cover(b, t) for t in ticks)
        assert intervals.length(intervals.gaps(a, 0, 45)) == sum(not cover(a, t) for t in ticks if 0 <= t < 45)


def test_split_of_literal_overlapping_streams():
    """Compute on stream 7, NCCL on stream 20 overlapping it, a copy, then a gap the CPU caused."""
    t = reader.Trace("literal", meta={"schemaVersion": 1})
    t.names = ["gemm", "ncclDevKernel_AllGather_RING_SIMPLE(x)", "Memcpy DtoD (Device -> Device)"]
    t.gpu = [(0.0, 10.0, 7, "kernel", 0, 1, None), (5.0, 15.0, 20, "kernel", 1, 2, None),
             (18.0, 7.0, 7, "memcpy", 2, 3, None), (30.0, 10.0, 7, "kernel", 0, 4, None)]
    t.launches = {1: (-5.0, 1.0, 0), 2: (-4.0, 1.0, 0), 3: (-3.0, 1.0, 0), 4: (27.0, 1.0, 0)}
    sp, segments = analysis.split(t, 0.0, 40.0)
    assert (sp.compute_us, sp.comm_us, sp.comm_overlapped_us, sp.comm_exposed_us) == (20, 15, 5, 10)
    assert (sp.memory_us, sp.idle_us, sp.host_idle_us, sp.kernels) == (5, 5, 5, 4)
    assert sp.by_collective == (("AllGather", 15, 10),)
    assert segments == ((0, 10, "compute"), (10, 20, "communication"), (20, 25, "memory"),
                        (25, 30, "idle (host)"), (30, 40, "compute"))
    # launched before the gap began: the GPU had work queued (waiting on something else), not the host's doing
    t.launches[4] = (20.0, 1.0, 0)
    assert analysis.split(t, 0.0, 40.0)[0].host_idle_us == 0


H200 = Path(__file__).parent / "fixtures" / "traces" / "h200-2026-12-04"


def test_real_h200_traces_name_the_launch_bound_eager_step_and_the_communication_bound_one():
    """Recorded on the 1x H200 (benchmarks/gpu_traces.sh, 2026-12-04; step times measured outside the
    profiler in steps.jsonl): TP=1, the decode step eager (4.6 ms a step) and as a CUDA graph (2.0 ms);
    TP=2 on one GPU over sockets (each rank its own NCCL_HOSTID), where the all-reduce is the step."""
    eager = analyse_paths([H200 / "trace-tp1-eager-rank0.json.gz"])
    graph = analyse_paths([H200 / "trace-tp1-graph-rank0.json.gz"])
    assert eager.verdict == "launch-bound" and eager.typical["host_idle"] > 0.5
    assert "CUDA graphs, not NCCL settings, are where the time is" in eager.headline
    assert graph.verdict == "compute-bound" and graph.typical["host_idle"] < 0.05
    # the graph replay's GPU step is the shorter one, as the wall clock outside the profiler said
    steps = [json.loads(l) for l in (H200 / "steps.jsonl").read_text().splitlines()]
    wall = {s["mode"]: s["step_ms_median"] for s in steps if s["world_size"] == 1}
    assert wall["graph"] < wall["eager"]
    tp2 = analyse_paths(sorted(H200.glob("trace-tp2-hostid-eager-rank*.json.gz")))
    assert tp2.verdict == "communication-bound" and len(tp2.ranks) == 2
    assert "RING/LL" in tp2.headline
