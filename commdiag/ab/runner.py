"""Run an A/B: rounds of launches (every arm once per round, shuffled) into a run folder.

Each launch: its own folder ``launches/NNNN/`` (``{launch_dir}``), a fresh server when the spec has
one (started with the arm's environment, ready by URL or log line, warmup runs discarded), the
measured run of the user's command (stdout.txt, stderr.txt), the server stopped, the metrics read.
A launch that fails (the server never ready, crashed, outlived its stop; the command failed or
timed out; a metric missing; no NCCL proof) is recorded with its reason and the run goes on.

The safety rules of sweep hold: run.json through the one writer after every launch, the run-folder
lock, each launch's marker in run.json before anything starts (a resume ends what a killed commdiag
left running), Ctrl-C leaves a resumable folder (the launch in flight is pending again).

The machine's state is read around every launch as in sweep (measure/machinestate.py: NVML before,
every second during and after it; the launch's own processes told by their marker): run.json's
``machine_state`` says once what is read or why nothing is (no NVML: a CPU machine), each launch's
``machine`` holds its record; ab/machine.py names the confounders beside the verdicts.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .. import __version__, atomic, metadata, procs, readfile
from ..atomic import write_json
from ..errors import CommdiagError, brief
from ..formats.spec import launch_order
from ..measure import launcher, machinestate, runlock
from ..measure.launcher import Progress
from . import presets, server
from .spec import AbSpec

RUN_FORMAT = "commdiag-ab"
RUN_FORMAT_VERSION = 2  # 2: machine_state, launches[].machine (docs/formats.md)
PENDING, OK, FAILED = "pending", "ok", "failed"
LAUNCH_KEYS = ("index", "config", "round", "marker")
TAIL_CHARS = 2000
NCCL_PROOF_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"}


@dataclass(frozen=True)
class AbResult:
    run_dir: Path
    state: str  # complete | interrupted
    counts: dict[str, int]
    warnings: tuple[str, ...] = field(default=())


def default_run_dir(spec: AbSpec, root: Path = Path("reports")) -> Path:
    return root / f"{dt.datetime.now(dt.timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-ab-{spec.name}"


def save(run_dir: Path, run: dict) -> None:
    write_json(Path(run_dir) / "run.json", run)


def load(run_dir: str | Path) -> dict:
    import json

    path = Path(run_dir) / "run.json"
    try:
        run = json.loads(readfile.read_text(path, what="run folder"))
    except FileNotFoundError:
        raise CommdiagError(f"{path}: not found: is {run_dir} a commdiag ab run folder?") from None
    except (OSError, ValueError, RecursionError) as e:
        raise CommdiagError(f"{path}: cannot read: {str(e)[:200]}") from None
    if not isinstance(run, dict) or run.get("format") != RUN_FORMAT:
        found = run.get("format") if isinstance(run, dict) else type(run).__name__
        raise CommdiagError(f"{path}: format: {found!r} is not a commdiag ab run ({RUN_FORMAT!r})")
    v = run.get("version")
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= RUN_FORMAT_VERSION:
        raise CommdiagError(f"{path}: version: {v!r} is not an ab run version this commdiag reads "
                            f"(1..{RUN_FORMAT_VERSION})")
    if not isinstance(run.get("spec"), dict) or not isinstance(run.get("launches"), list):
        raise CommdiagError(f"{path}: spec or launches missing; the file was damaged or not written by commdiag")
    _check_shape(run, path)
    return run


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_shape(run: dict, path: Path) -> None:
    """The parts the verdicts, the text and report.html index into: a damaged or hand-edited run.json
    is one error naming the field, not a TypeError deep inside the report (results._check_shape is
    sweep's)."""
    def bad(fld: str, why: str) -> CommdiagError:
        return CommdiagError(f"{path}: {fld}: {why}; the file was damaged or not written by commdiag")

    metrics = run["spec"].get("metrics", [])
    if not isinstance(metrics, list) or not all(isinstance(m, dict) and isinstance(m.get("name"), str)
                                                for m in metrics):
        raise bad("spec.metrics", "not a list of {name: string, ...}")
    configs = run.get("configs")
    if not isinstance(configs, list):
        raise bad("configs", "missing or not a list")
    names = set()
    for i, c in enumerate(configs):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not isinstance(c.get("overrides", {}), dict):
            raise bad(f"configs[{i}]", "not {name: string, overrides: mapping}")
        if _CONTROL.search(c["name"]):  # a spec never allows it; printed to terminals and the report
            raise bad(f"configs[{i}].name", f"{brief(c['name'])} contains control characters")
        names.add(c["name"])
    statuses = (PENDING, OK, FAILED)
    for i, l in enumerate(run["launches"]):
        if not isinstance(l, dict):
            raise bad(f"launches[{i}]", "not a mapping")
        for key in ("index", "round"):
            v = l.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise bad(f"launches[{i}].{key}", f"{brief(v)} is not an integer >= 0")
        if l.get("status") not in statuses:
            raise bad(f"launches[{i}].status", f"{brief(l.get('status'))} is not one of {', '.join(statuses)}")
        if l.get("config") not in names:
            raise bad(f"launches[{i}].config", f"{brief(l.get('config'))} is not one of the run's configs")
        values = l.get("values")
        if values is not None and (not isinstance(values, dict)
                                   or not all(isinstance(k, str) and _number(x) for k, x in values.items())):
            raise bad(f"launches[{i}].values", "not a mapping of metric name to number")


def new_run(spec: AbSpec) -> dict:
    seed = spec.seed if spec.seed is not None else random.SystemRandom().randrange(2 ** 31)
    return {
        "format": RUN_FORMAT, "version": RUN_FORMAT_VERSION, "commdiag_version": __version__,
        "created_utc": launcher.utc_now(), "finished_utc": None, "state": "running",
        "spec_file": spec.path, "spec_given": spec.raw, "spec": spec.to_json(), "seed": seed,
        "configs": [{"name": c.name, "env": c.env, "overrides": c.overrides} for c in spec.configs],
        "launches": [{"index": l.index, "config": l.config, "round": l.trial, "status": PENDING}
                     for l in launch_order(spec, seed)],
        "fingerprint": {"launcher": metadata.collect_host()},
        "warnings": list(spec.warnings),
    }


def run_ab(spec: AbSpec | None = None, *, run_dir: Path | None = None, resume: Path | None = None,
           env: dict[str, str] | None = None, on_progress: Callable[[Progress], None] | None = None,
           on_start: Callable[[str], None] | None = None,
           sampler: machinestate.Sampler | None = None) -> AbResult:
    """Run every pending launch of a new A/B (``spec``) or an interrupted one (``resume``).
    ``sampler``: what reads the machine's state around each launch (default: NVML when it is there;
    a replay of recorded readings in tests)."""
    base_env = dict(os.environ if env is None else env)
    if resume is None:
        assert spec is not None
        run_dir = Path(run_dir) if run_dir else default_run_dir(spec)
        if (run_dir / "run.json").exists():
            raise CommdiagError(f"{run_dir}: already holds a run; use --resume {run_dir} or another --out")
        runlock.check_folder(run_dir)  # before anything is made: no folder left behind a user's link
        atomic.make_dirs(run_dir)  # the one writer: never through a link
    else:
        run_dir = Path(resume)
    with runlock.hold(run_dir):
        if resume is None:
            if (run_dir / "run.json").exists():
                raise CommdiagError(f"{run_dir}: already holds a run; use --resume {run_dir} or another --out")
            run = new_run(spec)
        else:
            run = load(run_dir)
            spec = AbSpec.from_json(run["spec"])
            ended = runlock.reap_orphans(run)
            if ended:
                run.setdefault("warnings", []).append(
                    f"ended {len(ended)} process(es) left running by an earlier commdiag (pids "
                    f"{', '.join(map(str, ended))})")
        run["state"] = "running"
        save(run_dir, run)
        own_sampler = sampler is None
        # The user's benchmark may use any GPU of the machine: NVML is read whenever it is there.
        sampler = sampler or machinestate.open_sampler("nccl")
        try:
            return _run_pending(spec, run, run_dir, base_env, on_progress, on_start, sampler)
        finally:
            if own_sampler:
                sampler.close()


def _run_pending(spec: AbSpec, run: dict, run_dir: Path, base_env: dict, on_progress, on_start,
                 sampler: machinestate.Sampler) -> AbResult:
    procs.take_back_sigint()  # resumable after Ctrl-C, however it was started
    configs = {c["name"]: c for c in run["configs"]}
    pending = [l for l in run["launches"] if l["status"] == PENDING]
    if on_start and pending:
        on_start(f"run folder {run_dir}: {len(pending)} launch(es) to run ({len(configs)} arms x "
                 f"{spec.rounds} rounds, shuffled within each round)")
    walls: list[float] = []
    interrupted = False
    run["machine_state"] = sampler.describe()  # once per run: what is read, or why nothing is
    try:
        for n, launch in enumerate(pending, 1):
            try:
                one_launch(spec, run, run_dir, launch, configs[launch["config"]], base_env, sampler)
            except KeyboardInterrupt:
                for key in list(launch):
                    if key not in LAUNCH_KEYS:
                        launch.pop(key)
                launch["status"] = PENDING
                interrupted = True
                break
            finally:
                save(run_dir, run)
            walls.append(launch.get("wall_s", 0.0))
            if on_progress:
                on_progress(Progress(n, len(pending), launch, (len(pending) - n) * sum(walls) / len(walls)))
    except KeyboardInterrupt:  # between launches (saving, printing): resumable all the same
        interrupted = True
    run["machine_state"] = sampler.describe()  # says so if NVML stopped answering mid-run
    run["state"] = "interrupted" if interrupted else "complete"
    run["finished_utc"] = None if interrupted else launcher.utc_now()
    save(run_dir, run)
    counts: dict[str, int] = {}
    for l in run["launches"]:
        counts[l["status"]] = counts.get(l["status"], 0) + 1
    return AbResult(run_dir, run["state"], counts, tuple(run.get("warnings", ())))


def one_launch(spec: AbSpec, run: dict, run_dir: Path, launch: dict, config: dict, base_env: dict,
               sampler: machinestate.Sampler | None = None) -> None:
    """One launch, recorded into ``launch``, with the machine's state around its processes (server,
    warmups, the measured run, the stop); KeyboardInterrupt propagates after every process is ended."""
    t0 = time.monotonic()
    folder = run_dir / "launches" / f"{launch['index']:04d}"
    atomic.remove_tree(folder)  # left by an interrupted attempt: start clean (links inside removed, not followed)
    atomic.make_dirs(folder)
    marker = launcher.new_marker()
    launch["marker"] = marker
    launch["started_utc"] = launcher.utc_now()
    save(run_dir, run)  # the marker is on disk before any process carries it
    subst = {"launch_dir": str(folder.resolve()), "python": sys.executable}
    uses_port = any("{port}" in a for a in (*spec.command, *(spec.server.command if spec.server else ()),
                                            spec.server.ready_url or "" if spec.server else ""))
    if uses_port:
        subst["port"] = str(procs.free_port())
    env = {**base_env, **config["env"], launcher.MARKER: marker}
    srv = spec.server
    if srv and srv.require_nccl_proof:
        env.update(NCCL_PROOF_ENV)
    cmd = [presets.substitute(a, subst) for a in spec.command]
    proc = None
    errors: list[str] = []
    started_wall = time.time()
    sampler = sampler or machinestate.Sampler(None, "not read")
    with sampler.watch(lambda pid: launcher.carries_marker(pid, marker)) as watch:
        try:
            if srv:
                proc = server.start([presets.substitute(a, subst) for a in srv.command], env, folder / "server.log",
                                    cwd=folder)
                ready_s, why = server.wait_ready(proc, folder / "server.log",
                                                 presets.substitute(srv.ready_url, subst) if srv.ready_url else None,
                                                 srv.ready_log, srv.ready_timeout_s)
                launch["server_ready_s"] = None if ready_s is None else round(ready_s, 3)
                if why:
                    errors.append(why)
                for w in range(srv.warmup_runs if not errors else 0):
                    code, timed_out, _ = server.run_command(cmd, env, folder / f"warmup{w}.stdout.txt",
                                                            folder / f"warmup{w}.stderr.txt", spec.timeout_s,
                                                            cwd=folder)
                    if code != 0:
                        errors.append(f"warmup run {w + 1} " + (f"timed out after {spec.timeout_s:g}s" if timed_out
                                                                 else f"exited with code {code}"))
                        break
                _clear_results(spec, subst)
            if not errors:
                started_wall = time.time()
                code, timed_out, wall = server.run_command(cmd, env, folder / "stdout.txt", folder / "stderr.txt",
                                                           spec.timeout_s, cwd=folder)
                launch["command_s"] = round(wall, 3)
                launch["exit_code"] = code
                if timed_out:
                    errors.append(f"the command was killed after the {spec.timeout_s:g}s deadline")
                elif code != 0:
                    errors.append(f"the command exited with code {code}")
                if proc is not None and proc.poll() is not None:
                    errors.append(f"the server exited (code {proc.returncode}) during the measured run")
        finally:
            if proc is not None:
                stopped = server.stop_group(proc, ((signal.SIGINT, srv.stop_timeout_s),
                                                   (signal.SIGTERM, srv.stop_timeout_s)))
                launch["server_stop"] = stopped.signal
                if stopped.killed:
                    errors.append(f"the server outlived its stop (SIGINT and SIGTERM, {srv.stop_timeout_s:g}s each): "
                                  "killed with SIGKILL")
            left = (stopped.survivors if proc is not None else 0) + server.kill_marked(marker)
            if left:
                launch["killed_survivors"] = left
    launch["machine"] = watch.record()
    if not errors:
        values, missing = read_metrics(spec, folder, subst, started_wall)
        launch["values"] = values
        errors += missing
    if not errors and srv and srv.require_nccl_proof:
        proof, why = nccl_proof(folder / "server.log", config["env"])
        launch["nccl_proof"] = proof
        if why:
            errors.append(why)
    launch["wall_s"] = round(time.monotonic() - t0, 3)
    launch["status"] = FAILED if errors else OK
    if errors:
        launch["error"] = "; ".join(errors)
        launch["tail"] = _tail(folder)


def _clear_results(spec: AbSpec, subst: dict) -> None:
    """Result files the warmup runs wrote are not the measured run's (JSON lines append)."""
    for m in spec.metrics:
        if m.file:
            path = Path(presets.substitute(m.file, subst))
            if str(path).startswith(subst["launch_dir"] + os.sep) and path.is_file():
                path.unlink()


def read_metrics(spec: AbSpec, folder: Path, subst: dict, not_before: float) -> tuple[dict, list[str]]:
    values, missing = {}, []
    stdout = None
    for m in spec.metrics:
        if m.regex:
            if stdout is None:
                stdout = presets._read_tail(str(folder / "stdout.txt"))
            v, why = presets.from_stdout(stdout, m.regex)
        else:
            known = presets.preset_field(m.preset, m.field) if m.preset else None
            v, why = presets.from_file(presets.substitute(m.file, subst), m.field, m.aliases, not_before,
                                       known.hint if known else "")
        if v is None:
            missing.append(f"{m.name}: {why}")
        else:
            values[m.name] = v
    return values, missing


def nccl_proof(log: Path, arm_env: dict[str, str]) -> tuple[dict, str | None]:
    """Every NCCL process in the server's log applied every NCCL_* value of the arm (explain --log's
    parser); (what it found, why not proven or None)."""
    from ..nccl import logreport

    wanted = {k: v for k, v in arm_env.items() if k.startswith("NCCL_") and k not in NCCL_PROOF_ENV}
    try:
        report = logreport.explain_logs([log])
    except CommdiagError as e:
        return {}, f"no NCCL proof: {e}"
    procs = report.processes
    nranks = max((c.get("nranks") or 0 for p in procs for c in p["comms"]), default=0)
    found = {"processes": len(procs), "nranks": nranks, "applied": report.applied}
    if not procs:
        return found, "no NCCL proof: the server's log has no NCCL line (did it initialise NCCL?)"
    if nranks and len(procs) < nranks:
        return found, f"no NCCL proof: the log shows {len(procs)} of {nranks} ranks"
    for p in procs:
        for name, want in wanted.items():
            got = p["applied"].get(name)
            if got != want:
                return found, (f"no NCCL proof: pid {p['pid']} logged {name}="
                               f"{got if got is not None else '(nothing)'}, the arm sets {want}")
    return found, None


def _tail(folder: Path) -> str:
    parts = []
    for name in ("stderr.txt", "server.log"):
        p = folder / name
        if p.exists():
            try:
                text = presets._read_tail(str(p))[-TAIL_CHARS:]
            except OSError:
                continue
            if text.strip():
                parts.append(f"--- {name} ---\n{text}")
    return "\n".join(parts)
