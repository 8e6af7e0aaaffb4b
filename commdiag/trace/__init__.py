"""``commdiag trace``: is communication the bottleneck in *your* server?  Reads the Kineto traces
(torch.profiler's Chrome trace JSON, plain or gzipped) that SGLang, vLLM or any torch.profiler run
writes, one per rank, and splits each step's GPU time into compute, NCCL (by collective), memory
copies and idle, with the exposed communication, the idle the host caused, the collectives' sizes
and what NCCL chose for them, and the straggler per step.  Never imports torch: a trace is a file.

    reader.py     one file -> Trace (streaming: bounded memory for a 500 MB trace)
    kernels.py    what a kernel is from its name (HTA's classes; NCCL's algorithm/protocol)
    intervals.py  union/overlap of GPU time intervals
    analysis.py   steps, the split, sizes, stragglers, the one-line answer (pure)
    savings.py    --sweep: what a run's certified winner would save of the step at most
    result.py     the result dataclasses and the versioned JSON (commdiag-trace)
    render.py     the text; page.py the HTML report
"""

from __future__ import annotations

from pathlib import Path

from ..errors import CommdiagError

TRACE_SUFFIXES = (".json", ".json.gz", ".gz")


def trace_files(paths) -> list[str]:
    """The trace files named: files as given, and a folder's ``*.json``/``*.json.gz`` files (not its
    subfolders), sorted; CommdiagError for a missing path or a folder without traces."""
    out: list[str] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(str(f) for f in p.iterdir() if f.is_file() and f.name.endswith((".json", ".json.gz")))
            if not found:
                raise CommdiagError(f"{p}: a folder without trace files (*.json, *.json.gz)")
            out += found
        elif p.exists() or p.is_symlink():
            out.append(str(p))
        else:
            raise CommdiagError(f"{p}: no such file or folder")
    if not out:
        raise CommdiagError("no trace given: commdiag trace TRACE... (files or folders)")
    return out


def analyse_paths(paths, step: str | None = None, sweep: str | Path | None = None):
    """Read every trace named (files or folders) and answer: a ``result.TraceReport``."""
    import re

    from . import analysis, reader

    if step is not None:
        try:
            re.compile(step)
        except re.error as e:
            raise CommdiagError(f"--step: {step!r} is not a regular expression ({e})") from None
    sweep_data = None
    if sweep is not None:  # before reading traces: a wrong run folder is said at once
        from . import savings

        sweep_data = savings.load(sweep)
    files = trace_files(paths)
    traces = [reader.read(f) for f in files]
    seen: dict[int, str] = {}
    for t in traces:
        if t.rank is not None:
            if t.rank in seen:
                raise CommdiagError(f"{t.path}: rank {t.rank} again (also {seen[t.rank]}): give one job's traces "
                                    "at a time, one file per rank")
            seen[t.rank] = t.path
    rep = analysis.analyse(traces, step)
    if sweep_data is not None:
        from dataclasses import replace

        from . import savings

        notes = rep.notes
        out = savings.outside(rep, sweep_data)
        if out:
            notes += (f"all-reduce sizes the sweep did not measure in any band: "
                      f"{', '.join(str(b) + ' B' for b in out)}; sweep them to know",)
        if sweep_data.status != "confirmed":
            notes += (f"{sweep}: {sweep_data.status}: only a confirmed (stage 2) winner is certified",)
        rep = replace(rep, sweep=str(sweep), savings=tuple(savings.savings(rep, sweep_data)), notes=notes)
    return rep
