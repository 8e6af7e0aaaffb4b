"""Run an A/B: rounds of launches (every arm once per round, shuffled) into a run folder.

Each launch: its own folder ``launches/NNNN/`` (``{launch_dir}``), a fresh server when the spec has
one (started with the arm's environment, ready by URL or log line, warmup runs discarded), the
measured run of the user's command (stdout.txt, stderr.txt), the server stopped, the metrics read.
A launch that fails (the server never ready, crashed, outlived its stop; the command failed or
timed out; a metric missing; no NCCL proof) is recorded with its reason and the run goes on.

The run folder lives the life of sweep's, through the same engine (measure/runner.py): the lock,
orphans of a killed commdiag ended by marker, run.json (ab/runfile.py) saved after every launch,
Ctrl-C back to pending; this module is only ab's run.json head and ``one_launch``, which records the
launch's marker before anything starts.  A complete run is published (its analysis, report.html).

The machine's state is read around every launch as in sweep (measure/machinestate.py: NVML before,
every second during and after it; the launch's own processes told by their marker): run.json's
``machine_state`` says once what is read or why nothing is (no NVML: a CPU machine), each launch's
``machine`` holds its record; ab/machine.py names the confounders beside the verdicts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import atomic, metadata, procs
from ..errors import CommdiagError
from ..formats.spec import launch_order
from ..measure import launcher, machinestate, runner as engine
from ..measure.launcher import Progress
from . import presets, server
from .runfile import FAILED, OK, PENDING, RUN_FORMAT, RUN_FORMAT_VERSION, load, save  # noqa: F401 (ab's names)
from .spec import AbSpec

LAUNCH_KEYS = ("index", "config", "round", "marker")
TAIL_CHARS = 2000
NCCL_PROOF_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"}


# What run_ab returns (measure/runner.py): the run folder, its state (complete | interrupted | stopped:
# run["stopped"] says why), launches per status and, when complete, what was published (AbPublished:
# the analysis and report.html).
AbResult = engine.RunResult


@dataclass(frozen=True)
class AbPublished:
    analysis: dict  # render.analyse(run): what the text, the JSON and the report show
    report: Path


def default_run_dir(spec: AbSpec, root: Path = Path("reports")) -> Path:
    return root / f"{dt.datetime.now(dt.timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-ab-{spec.name}"


def new_run(spec: AbSpec) -> dict:
    seed = spec.seed if spec.seed is not None else random.SystemRandom().randrange(2 ** 31)
    return {
        **engine.head(RUN_FORMAT, RUN_FORMAT_VERSION, spec), "seed": seed,
        "configs": [{"name": c.name, "env": c.env, "overrides": c.overrides} for c in spec.configs],
        "launches": [{"index": l.index, "config": l.config, "round": l.trial, "status": PENDING}
                     for l in launch_order(spec, seed)],
        "fingerprint": {"launcher": metadata.collect_host()},
        "warnings": list(spec.warnings),
    }


def run_ab(spec: AbSpec | None = None, *, run_dir: Path | None = None, resume: Path | None = None,
           env: dict[str, str] | None = None, on_progress: Callable[[Progress], None] | None = None,
           on_start: Callable[[str], None] | None = None, publish: bool = True,
           sampler: machinestate.Sampler | None = None) -> AbResult:
    """Run every pending launch of a new A/B (``spec``) or an interrupted one (``resume``); a complete
    run is then published (``publish``: its analysis and report.html, the result's ``published``), as
    ``commdiag ab`` does.  ``sampler``: what reads the machine's state around each launch (default:
    NVML when it is there; a replay of recorded readings in tests)."""
    base_env = dict(os.environ if env is None else env)
    if resume is None:
        assert spec is not None
        run_dir = Path(run_dir) if run_dir else default_run_dir(spec)
    else:
        run_dir = Path(resume)
    new = (lambda: new_run(spec)) if resume is None else None
    with engine.opened(run_dir, load=load, save=save, new=new) as folder:
        run = folder.run
        spec = spec if resume is None else AbSpec.from_json(run["spec"])
        run["state"] = "running"
        run.pop("stopped", None)  # a resumed stopped run: this call decides again
        folder.save()
        configs = {c["name"]: c for c in run["configs"]}
        pending = folder.pending()
        if on_start and pending:
            on_start(f"run folder {run_dir}: {len(pending)} launch(es) to run ({len(configs)} arms x "
                     f"{spec.rounds} rounds, shuffled within each round)")

        def one(batch: list[dict]) -> float:
            one_launch(spec, run, run_dir, batch[0], configs[batch[0]["config"]], base_env, sampler)
            return batch[0].get("wall_s", 0.0)

        # The user's benchmark may use any GPU of the machine: NVML is read whenever it is there.
        with folder.watching(sampler, "nccl") as sampler:
            folder.run_pending(one, keys=LAUNCH_KEYS, on_progress=on_progress,
                               stop=lambda pending: same_failure(run, pending[0]["round"]) if pending else None)
        res = folder.finish()
    if publish and res.state == "complete":
        from . import report

        page, analysis = report.write_report(run_dir, run=load(run_dir))
        res = dataclasses.replace(res, published=AbPublished(analysis, page))
    return res


def same_failure(run: dict, first_round: int) -> str | None:
    """Why to stop: every launch of ``first_round`` (the first round this call ran) is done and every
    one failed with the same error (a metric that never matches, a server that never starts): every
    later round would fail the same way, and no verdict can come from no values.  None: go on."""
    launches = [l for l in run["launches"] if l["round"] == first_round]
    errors = {l.get("error", "") for l in launches}
    if any(l["status"] != FAILED for l in launches) or len(errors) != 1:
        return None
    return (f"every launch of round {first_round + 1} ({len(launches)} arms) failed the same way, so every "
            f"round would: {errors.pop()}")


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
