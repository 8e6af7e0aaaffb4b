"""The run folder and its versioned on-disk formats.

Layout of a run folder (``reports/<UTC timestamp>-<name>/`` by default)::

    run.json             format "commdiag-run": spec as given and resolved, every config's
                         env, the launch order and seed, every launch's status, the
                         environment fingerprint.  Rewritten atomically after every launch.
    launches/NNNN/       one folder per launch: plan.json (what the worker was told),
                         result.json (all ranks' raw samples, written by the worker),
                         torchrun.log (launch: torchrun) or launch.log (launch: forkserver),
                         NCCL debug files, rank<N>.error.txt on failure.
    launch-servers.log   launch: forkserver only: what the launch servers themselves printed.
    samples.csv          tidy, one row per sample (max over ranks per iteration).
    summary.csv          per config x size x mode: medians, spread, launches, bandwidth, #wrong.

samples.csv and summary.csv are derived from the launch folders (``assemble``), so
an interrupted sweep loses nothing already measured.

Format history of run.json (bump RUN_FORMAT_VERSION on any incompatible change):
    1  first version (launch statuses: pending, ok, failed, timeout, incorrect).
    2  call paths: spec.vias (torch, nccl-direct) and spec.replay_stream; samples.csv and
       summary.csv gain a ``via`` column, and nccl-direct rows carry the mode labels
       ``graph-direct`` / ``eager-direct`` so every analysis keyed by mode sees four
       series; run.json gains ``explain`` (what NCCL chose) and launch ``measure_s``.
       Version 1 folders are still read (their rows are via torch).
       Later additions that keep version 2 (older readers ignore them and stay correct):
       spec.reuse_process, and per launch ``process`` (index of the launch whose folder holds
       the shared process's logs), ``process_runs``, ``process_wall_s``, ``process_error``;
       with reuse_process a launch's ``overhead_s`` is its share of the process's start and
       teardown.
    3  two-stage verdicts (verdict.py).  Every launch has ``stage``: 1 (screening, the
       interleaved trials) or 2 (confirmation: fresh rounds of default + the candidates,
       with ``round``); run.json gains ``confirmation`` (the stage-2 plan: claims, family
       size M, rounds, looks, alpha, and the screening it came from) once stage 1 is done,
       and ``spec.confirm_configs`` / ``spec.confirm_rounds``.  Version 1 and 2 folders are
       read as screening only: every launch is stage 1 and nothing is certified.
       Later additions that keep version 3 (older readers ignore them and stay correct):
       per rank ``ranks[].nccl_tuner`` when the launch's env sets NCCL_TUNER_PLUGIN (what
       NCCL and the plugin logged, nccl/tunerlog.py ``TunerLog.to_json``: ``requested``,
       ``loaded``, ``name``, ``abi``, ``library``, ``load_errors``, ``rules`` [{total, path,
       matching, nranks, nnodes, comm, abi}], ``rules_warnings``, ``fired`` {all-reduce bytes:
       {line, applied, algo, proto, channels, reg_buff}}, ``counts``, ``problems``); such a
       launch is ``failed`` unless every rank shows the plugin loaded (docs/tuner.md, 'Proof').
       ``explain.configs.NAME.tuner`` likewise (measure/explain.py).
    4  the machine during each launch (measure/machinestate.py): run.json gains
       ``machine_state`` (once per run: ``available``, and either ``reason`` why nothing is
       read, e.g. a gloo run or no NVML, or the GPUs read with their static facts; ``stopped``
       if NVML stopped answering mid-run), and every launch that ran ``machine``: ``{available:
       false}``, or per GPU the readings before and after it, the range under load while it
       ran, counter deltas (PCIe replays and recoveries, energy, throttled time), and the other
       compute processes seen.  Version 1-3 folders are still read; their launches have no
       ``machine`` and their confounders are "not recorded".
    5  launch methods (docs/launch-methods.md): ``spec.launch`` (forkserver | torchrun), run.json
       ``launch`` ({requested, method, note?, fallback?}: the method the run used, why it differs
       from the spec's, and why the launch servers were given up mid-run), and per launch
       ``launched_by``; a forkserver launch's log is ``launches/NNNN/launch.log`` and the servers'
       own output ``launch-servers.log``.  Bumped because an older commdiag cannot read a spec with
       ``launch`` (it would fail, not ignore it).  Version 1-4 folders are still read: their spec
       has no ``launch`` and was run with torchrun.
    6  forkserver exact for every variable (docs/launch-methods.md, "What a child may change after
       the fork"): run.json ``launch.server_groups`` (per group of launch servers started: ``index``,
       ``key``, ``proof``, ``closed``?) and per forkserver launch ``server_group``.  A config that
       sets a variable read before the fork (TORCH_DISTRIBUTED_DEBUG, OMP_NUM_THREADS, LD_*) now runs
       on servers started with it instead of torchrun or a child that kept the server's value.
       Bumped so that an older commdiag, whose servers did not, cannot resume or confirm such a run.
       Version 1-5 folders are still read.
    7  racing (analyse/racing.py, docs/formats.md): launch status ``dropped`` (final, never run: screening
       stopped launching its config after a trial showed it far slower than default in every band and
       mode; the launch's ``dropped`` says why), run.json ``racing`` ({enabled, looks: [{after_trial,
       dropped: [{config, after_trial, reason, margin_se}]}]}) and ``spec.racing``.  Bumped because an
       older commdiag refuses the status (it would not read, resume or confirm such a run).  Version 1-6
       folders are still read: their spec has no ``racing`` and runs every launch.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .. import readfile
from ..measure import collectives
from ..atomic import write_json, write_text
from ..errors import CommdiagError, brief

RUN_FORMAT = "commdiag-run"
RUN_FORMAT_VERSION = 7  # 7: launch status dropped, run.racing (history above)

SAMPLES_COLUMNS = ["config", "trial", "launch", "size_bytes", "tokens", "mode", "via", "iteration", "time_us",
                   "enqueue_us"]
SUMMARY_COLUMNS = ["config", "size_bytes", "tokens", "mode", "via", "median_us", "p10_us", "p90_us",
                   "launch_median_min_us", "launch_median_max_us", "launches", "samples",
                   "algbw_gbps", "busbw_gbps", "wrong"]

# Launch statuses.  "pending" launches are (re)run by --resume; the others are final.  "dropped": never
# run, racing stopped launching its config (analyse/racing.py); it neither fails nor counts as measured.
PENDING, OK, FAILED, TIMEOUT, INCORRECT, DROPPED = "pending", "ok", "failed", "timeout", "incorrect", "dropped"
FINAL_STATUSES = (OK, FAILED, TIMEOUT, INCORRECT, DROPPED)


def launch_dir(run_dir: Path, index: int) -> Path:
    return Path(run_dir) / "launches" / f"{index:04d}"


def save_run(run_dir: Path, run: dict) -> None:
    write_json(Path(run_dir) / "run.json", run)


def read_run_file(run_dir: str | Path, fmt: str, kind: str) -> tuple[Path, dict]:
    """``run_dir``/run.json read through the one reader and checked to be a ``fmt`` object: every kind of
    run folder (a sweep's, ab's) starts its load here; one error naming the file otherwise."""
    path = Path(run_dir) / "run.json"
    try:
        run = json.loads(readfile.read_text(path, what="run folder"))
    except FileNotFoundError:
        raise CommdiagError(f"{path}: not found: is {run_dir} a commdiag {kind} folder?") from None
    except (OSError, ValueError) as e:  # the reader's own refusals (as root: whose folder it is) in full
        raise CommdiagError(f"{path}: cannot read: {e}") from None
    except RecursionError:
        raise CommdiagError(f"{path}: cannot read: nested too deeply to be a run.json") from None
    if not isinstance(run, dict) or run.get("format") != fmt:
        found = run.get("format") if isinstance(run, dict) else type(run).__name__
        raise CommdiagError(f"{path}: format: {found!r} is not a commdiag {kind.removesuffix(' folder')} ({fmt!r})")
    return path, run


def load_run_json(run_dir: str | Path) -> dict:
    path, run = read_run_file(run_dir, RUN_FORMAT, "run folder")
    version = run.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CommdiagError(f"{path}: version: {version!r} is not a run format version (1..{RUN_FORMAT_VERSION})")
    if version > RUN_FORMAT_VERSION:
        raise CommdiagError(
            f"{path}: version: {version!r} is newer than this commdiag understands "
            f"(<= {RUN_FORMAT_VERSION}); upgrade commdiag to read it")
    missing = [k for k in ("spec", "configs", "launches") if not isinstance(run.get(k), (dict, list))]
    if missing:
        raise CommdiagError(f"{path}: {', '.join(missing)}: missing; the file is truncated or was not written by commdiag")
    _check_shape(run, path)
    return run


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _int(v, minimum: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= minimum


def _check_shape(run: dict, path: Path) -> None:
    """The parts every reader indexes into (configs, launches, sizes): a damaged run.json is one
    error naming the field, not a KeyError deep inside a report."""
    def bad(field: str, why: str) -> CommdiagError:
        return CommdiagError(f"{path}: {field}: {why}; the file was damaged or not written by commdiag")

    spec, configs, launches = run["spec"], run["configs"], run["launches"]
    if not isinstance(spec, dict) or not isinstance(spec.get("sizes"), list):
        raise bad("spec.sizes", "missing or not a list")
    for i, size in enumerate(spec["sizes"]):
        if not isinstance(size, dict) or not _int(size.get("bytes"), 1) or not (
                size.get("tokens") is None or _int(size.get("tokens"), 1)):
            raise bad(f"spec.sizes[{i}]", "not {bytes: integer, tokens: integer or null}")
    if not isinstance(configs, list):
        raise bad("configs", "not a list")
    names = set()
    for i, c in enumerate(configs):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not isinstance(c.get("env"), dict):
            raise bad(f"configs[{i}]", "not {name: string, env: mapping}")
        if _CONTROL.search(c["name"]):  # a spec never allows it; printed to terminals and reports
            raise bad(f"configs[{i}].name", f"{brief(c['name'])} contains control characters")
        ov = c.get("overrides")
        if ov is not None and (not isinstance(ov, dict) or not all(
                isinstance(k, str) and isinstance(v, (str, int, float)) and not isinstance(v, bool)
                for k, v in ov.items())):
            raise bad(f"configs[{i}].overrides", "not a mapping of variable names to values")
        names.add(c["name"])
    bands = spec.get("bands")
    if bands is not None:
        if not isinstance(bands, dict):
            raise bad("spec.bands", "not a mapping of band names to [low, high] token counts")
        for name, b in bands.items():
            if (not isinstance(b, list) or len(b) != 2 or not _int(b[0], 0)
                    or not (b[1] is None or _int(b[1], 0))):
                raise bad(f"spec.bands.{brief(name)}", "not [low, high] (integers; high may be null)")
    warnings = run.get("warnings")
    if warnings is not None and (not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings)):
        raise bad("warnings", "not a list of strings")
    if not isinstance(launches, list):
        raise bad("launches", "not a list")
    statuses = (PENDING, *FINAL_STATUSES)
    for i, l in enumerate(launches):
        if not isinstance(l, dict):
            raise bad(f"launches[{i}]", "not a mapping")
        if not _int(l.get("index")) or not _int(l.get("trial")):
            raise bad(f"launches[{i}]", "index and trial must be integers >= 0")
        if l.get("status") not in statuses:
            raise bad(f"launches[{i}].status", f"{brief(l.get('status'))} is not one of {', '.join(statuses)}")
        if l.get("config") not in names:
            raise bad(f"launches[{i}].config", f"{brief(l.get('config'))} is not one of the run's configs")
    ws = run.get("world_size")
    if ws is not None and not _int(ws):
        raise bad("world_size", f"{brief(ws)} is not an integer")


def read_launch_result(run_dir: Path, index: int) -> dict | None:
    try:
        return json.loads(readfile.read_text(launch_dir(run_dir, index) / "result.json", what="run folder"))
    except (OSError, ValueError):
        return None


# The series name analyses key on, per via: graph/eager via torch and for commdiag step's full step;
# graph-direct/eager-direct via libnccl; a step's ablations graph-compute (all-reduces removed) and
# graph-comm (compute removed).
VIA_SUFFIX = {"torch": "", "nccl-direct": "-direct", "step": "", "step-compute": "-compute", "step-comm": "-comm"}


def mode_label(mode: str, via: str) -> str:
    return mode + VIA_SUFFIX.get(via, f"-{via}")


def label_series(label: str, vias) -> tuple[str, str]:
    """(mode, via) of a series label among a run's ``vias``: the inverse of mode_label."""
    for via in sorted(vias, key=lambda v: -len(VIA_SUFFIX.get(v, v))):
        suffix = VIA_SUFFIX.get(via, f"-{via}")
        if suffix and label.endswith(suffix):
            return label[:-len(suffix)], via
    plain = [v for v in vias if not VIA_SUFFIX.get(v, "x")]
    return label, plain[0] if plain else "torch"


def _by_via(rank: dict, key: str) -> dict:
    """A rank's ``samples``/``enqueue_us``/``wrong`` keyed by via (launch format 1 had no via level)."""
    return rank[key] if rank.get("_v2") else {"torch": rank[key]}


def _normalize(result: dict) -> dict:
    v2 = result.get("version", 1) >= 2
    for r in result["ranks"]:
        r["_v2"] = v2
    return result


def launch_samples(result: dict, launch: dict, tokens_by_size: dict[int, int | None]) -> list[tuple]:
    """Rows of samples.csv for one launch: per iteration, the max over ranks."""
    ranks = _normalize(result)["ranks"]
    rows = []
    for via, by_mode in _by_via(ranks[0], "samples").items():
        for mode, by_size in by_mode.items():
            for size_key in by_size:
                per_rank = [_by_via(r, "samples")[via][mode][size_key] for r in ranks]
                times = [max(vals) for vals in zip(*per_rank)]
                enq = None
                if mode == "eager" and all(size_key in _by_via(r, "enqueue_us").get(via, {}) for r in ranks):
                    enq = [max(vals) for vals in zip(*(_by_via(r, "enqueue_us")[via][size_key] for r in ranks))]
                size = int(size_key)
                label = mode_label(mode, via)
                for i, t in enumerate(times):
                    rows.append((launch["config"], launch["trial"], launch["index"], size, tokens_by_size.get(size),
                                 label, via, i, round(t, 4), None if enq is None else round(enq[i], 4)))
    return rows


def launch_wrong(result: dict) -> dict[int, int]:
    """Wrong elements per size, summed over ranks and call paths."""
    out: dict[int, int] = {}
    for r in _normalize(result)["ranks"]:
        for by_size in _by_via(r, "wrong").values():
            for size_key, n in by_size.items():
                out[int(size_key)] = out.get(int(size_key), 0) + n
    return out


def _read_results(run_dir: Path, run: dict) -> tuple[list[tuple[dict, dict]], list[str]]:
    """(launch, result) for every finished launch whose result.json reads, and the problems:
    a result.json that exists but is not a launch result (truncated, corrupt)."""
    found, problems = [], []
    for launch in run["launches"]:
        if not isinstance(launch, dict) or launch.get("status") == PENDING:
            continue
        path = launch_dir(run_dir, launch["index"]) / "result.json"
        try:
            result = json.loads(readfile.read_text(path, what="run folder"))
        except FileNotFoundError:
            continue  # a crashed or timed-out launch writes none; its status says so
        except (OSError, ValueError) as e:
            problems.append(f"{path}: cannot read ({e.__class__.__name__}: {str(e)[:120]})")
            continue
        if not isinstance(result, dict) or not isinstance(result.get("ranks"), list) or not result["ranks"]:
            problems.append(f"{path}: not a commdiag launch result")
            continue
        found.append((launch, result))
    return found, problems


def assemble(run_dir: str | Path, run: dict | None = None, *, write: bool = True):
    """Build samples.csv and summary.csv from the launch folders; returns (samples, summary).

    ``write=True`` is for the sweep only (it just measured the launch folders): the tables are
    rewritten.  Read-only commands (report, compare, load_run) call ``write=False`` and refuse
    a corrupt result.json instead of silently dropping that launch's rows."""
    import pandas as pd

    run_dir = Path(run_dir)
    run = run or load_run_json(run_dir)
    tokens_by_size = {s["bytes"]: s["tokens"] for s in run["spec"]["sizes"]}
    rows, wrong = [], {}
    found, problems = _read_results(run_dir, run)
    if problems and not write:
        raise CommdiagError(f"{problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
                            + "; the run's samples cannot be rebuilt without it, and nothing was written")
    try:
        for launch, result in found:
            rows.extend(launch_samples(result, launch, tokens_by_size))
            for size, n in launch_wrong(result).items():
                wrong[(launch["config"], size)] = wrong.get((launch["config"], size), 0) + n
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CommdiagError(f"{run_dir}: a launch's result.json has an unexpected shape ({e.__class__.__name__}: "
                            f"{str(e)[:120]}); nothing was written") from None
    samples = pd.DataFrame(rows, columns=SAMPLES_COLUMNS)
    samples["tokens"] = samples["tokens"].astype("Int64")
    summary = summarize(samples, wrong, nranks=run.get("world_size") or 0)
    if write:
        write_text(run_dir / "samples.csv", samples.to_csv(index=False))
        write_text(run_dir / "summary.csv", summary.to_csv(index=False))
    return samples, summary


def summarize(samples, wrong: dict, nranks: int):
    """Per config x size x mode: median of launch medians, pooled p10/p90, the range of
    launch medians (between-launch noise), launch count, bandwidths, wrong elements."""
    import pandas as pd

    if samples.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    keys = ["config", "size_bytes", "tokens", "mode", "via"]
    per_launch = samples.groupby(keys + ["launch"], dropna=False)["time_us"].median().reset_index()
    by_launch = per_launch.groupby(keys, dropna=False)["time_us"]
    pooled = samples.groupby(keys, dropna=False)["time_us"]
    out = pd.DataFrame({
        "median_us": by_launch.median(),
        "p10_us": pooled.quantile(0.10),
        "p90_us": pooled.quantile(0.90),
        "launch_median_min_us": by_launch.min(),
        "launch_median_max_us": by_launch.max(),
        "launches": by_launch.count(),
        "samples": pooled.count(),
    }).reset_index()
    out["algbw_gbps"] = [collectives.algbw_gbps(s, t) for s, t in zip(out["size_bytes"], out["median_us"])]
    out["busbw_gbps"] = out["algbw_gbps"] * collectives.allreduce_busbw_factor(nranks)
    out["wrong"] = [wrong.get((c, int(s)), 0) for c, s in zip(out["config"], out["size_bytes"])]
    for col in ("median_us", "p10_us", "p90_us", "launch_median_min_us", "launch_median_max_us"):
        out[col] = out[col].round(3)
    for col in ("algbw_gbps", "busbw_gbps"):
        out[col] = out[col].round(4)
    return out[SUMMARY_COLUMNS].sort_values(["mode", "size_bytes", "config"]).reset_index(drop=True)


@dataclass(frozen=True)
class RunData:
    """A loaded run folder: run.json plus its tables (what report/compare/verdicts read)."""

    path: Path
    run: dict
    samples: object  # pandas.DataFrame
    summary: object  # pandas.DataFrame


def load_run(run_dir: str | Path) -> RunData:
    """run.json and its tables, read only: this never writes into the run folder.

    The tables come from samples.csv (or the archived samples.csv.gz) with summary.csv; a folder
    without them is rebuilt in memory from its launch folders.  Missing or unreadable measured
    data is one CommdiagError, never an empty table written over what was there."""
    run_dir = Path(run_dir)
    run = load_run_json(run_dir)
    # Archived runs (benchmarks/) may keep samples gzipped and no launch folders.
    samples_path = next((p for p in (run_dir / "samples.csv", run_dir / "samples.csv.gz") if p.exists()), None)
    summary_path = run_dir / "summary.csv"
    finished = [l for l in run["launches"] if isinstance(l, dict) and l.get("status") != PENDING]
    if samples_path is not None and summary_path.exists():
        samples, summary = _read_table(samples_path, _NEEDED_SAMPLES), _read_table(summary_path, _NEEDED_SUMMARY)
        _check_whole(run_dir, samples_path, samples, summary, run)
    elif (run_dir / "launches").is_dir():
        samples, summary = assemble(run_dir, run, write=False)
    elif not finished:
        samples, summary = assemble(run_dir, run, write=False)  # nothing ran yet: empty tables
    elif samples_path is not None:
        # samples without summary and without launch folders: the summary is derived in memory;
        # the wrong-element counts per size live only in the launch folders
        samples = _read_table(samples_path, _NEEDED_SAMPLES)
        if any(l.get("status") == INCORRECT for l in finished):
            raise CommdiagError(f"{summary_path}: missing, and the launch folders that hold the wrong-element "
                                f"counts are gone too; restore {summary_path.name} or launches/")
        summary = summarize(samples, {}, nranks=run.get("world_size") or 0)
    else:
        raise CommdiagError(f"{run_dir}: no measured data: samples.csv(.gz) and launches/ are both missing "
                            f"({len(finished)} launches are recorded as finished in run.json); restore them "
                            "from a copy of the run folder")
    return RunData(run_dir, run, samples, summary)


def _check_whole(run_dir: Path, samples_path: Path, samples, summary, run: dict) -> None:
    """Every verdict rests on samples.csv: a truncated or cut copy (a full disk, ``head -c``, a
    partial scp) would change verdicts silently.  It must end with a whole row, hold every sample that
    summary.csv counts per series, and hold every launch run.json records as measured; otherwise one
    error says exactly what is missing and how to get it back."""
    fix = (f"; delete {samples_path.name} and summary.csv and commdiag rebuilds them from launches/"
           if (run_dir / "launches").is_dir() else "; restore it from a copy of the run folder")
    if samples_path.suffix == ".csv":
        with open(samples_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 1))
            if size and f.read(1) != b"\n":
                raise CommdiagError(f"{samples_path}: its last row is cut off (the file does not end with a whole "
                                    f"line: truncated?){fix}")
    if "samples" in summary.columns:
        keys = ["config", "size_bytes", "mode", "via"]
        have = samples.groupby(keys, dropna=False).size()
        short = []
        for row in summary.itertuples(index=False):
            want = int(getattr(row, "samples"))
            got = int(have.get(tuple(getattr(row, k) for k in keys), 0))
            if got != want:
                short.append(f"{row.config} {row.size_bytes} B {row.mode}/{row.via}: {got} of {want}")
        if short:
            raise CommdiagError(f"{samples_path}: {len(samples)} rows where summary.csv counts "
                                f"{int(summary['samples'].sum())}: {len(short)} series differ ({'; '.join(short[:3])}"
                                f"{'; ...' if len(short) > 3 else ''}){fix}")
    measured = {l["index"] for l in run.get("launches", []) if isinstance(l, dict) and l.get("status") == OK}
    missing = sorted(measured - set(int(x) for x in samples["launch"].dropna().unique()))
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise CommdiagError(f"{samples_path}: no rows for {len(missing)} launch(es) run.json records as measured "
                            f"(launch {shown}){fix}")


_NEEDED_SAMPLES = ["config", "launch", "size_bytes", "tokens", "mode", "via", "time_us"]
_NEEDED_SUMMARY = ["config", "size_bytes", "tokens", "mode", "via", "median_us"]


def _read_table(path: Path, columns: list[str]):
    """A stored CSV (gzip by extension), checked for the columns every reader needs."""
    import io

    import pandas as pd

    try:  # the one reader first: a FIFO or device planted as samples.csv is refused, not waited on
        data = readfile.read_bytes(path, what="run folder")
        df = pd.read_csv(io.BytesIO(data), dtype={"tokens": "Int64"},
                         compression="gzip" if str(path).endswith(".gz") else None)
    except Exception as e:  # pandas raises many types for a damaged CSV (ParserError, EOFError, BadGzipFile, ...)
        raise CommdiagError(f"{path}: cannot read ({e.__class__.__name__}: {str(e)[:160]})") from None
    if "via" not in df.columns and "mode" in df.columns:  # version 1 folders: everything went through torch
        df.insert(df.columns.get_loc("mode") + 1, "via", "torch")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise CommdiagError(f"{path}: columns {', '.join(missing)} missing; not a commdiag table")
    return df
