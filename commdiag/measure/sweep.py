"""Run a sweep: one fresh launch per (config, trial), interleaved, into a run folder.

A launch's processes are forks of per-rank launch servers (``launch: forkserver``,
serverpool.py) or a fresh torchrun (``launch: torchrun``); docs/launch-methods.md.

``run_sweep`` is the library entry point behind ``commdiag sweep``.  It validates
prerequisites before the first launch, writes run.json after every launch
(atomically), and on Ctrl-C kills the launch in flight, marks it pending and
returns a resumable run.  ``--resume`` re-reads run.json and runs only the
launches that are still pending.  Around every launch it records the machine's state
(machinestate.py: NVML clocks, throttling, link, other processes; nccl runs only).

Two stages (verdict.py): stage 1 is the interleaved trials; when it is done the
sweep screens it, records the confirmation plan in run.json and appends stage 2's
rounds as pending launches, so an interrupted confirmation resumes like any other
launch.  ``run_confirm`` (``commdiag confirm``) runs, finishes or extends stage 2
of an existing run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.machinery
import importlib.util
import os
import random
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .. import __version__, atomic, linewrap, metadata, procs
from ..analyse import certify, paired, racing, screening, stats, verdict
from ..analyse.stats import LESS, TWO_SIDED
from . import eta, launcher, machinestate, runlock, serverpool, slurm
from .launcher import Progress
from ..formats import results
from ..errors import CommdiagError
from ..formats.spec import Spec, launch_order

TAIL_CHARS = 4000  # enough of a traceback or NCCL WARN block to see the cause
# Variables NCCL reads at every communicator's init (its tuning model), not once per process:
# the only ones reuse_process may change inside a running process.
PER_COMMUNICATOR = ("NCCL_PROTO", "NCCL_ALGO")


@dataclass(frozen=True)
class SweepResult:
    run_dir: Path
    state: str  # complete | interrupted
    counts: dict[str, int]
    warnings: tuple[str, ...] = field(default=())

    @property
    def all_ok(self) -> bool:
        return self.state == "complete" and set(self.counts) <= {results.OK, results.DROPPED}


def default_run_dir(spec: Spec, root: Path = Path("reports")) -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return root / f"{stamp}-{spec.name}"


def preflight(spec: Spec) -> int:
    """Check the machine can run ``spec`` at all; return the resolved ranks per node."""
    torch_spec = importlib.util.find_spec("torch")
    if torch_spec is None:
        raise CommdiagError("torch is not installed in this Python; install it (CPU: pip install torch==2.13.0)")
    # looked up in torch's folder: find_spec("torch.distributed.run") imports torch and torch.distributed
    # (3.5 s of CPU), which a gloo sweep's own process never needs (PathFinder finds run.py or run.pyc)
    if not any(importlib.machinery.PathFinder.find_spec("run", [str(Path(d, "distributed"))])
               for d in torch_spec.submodule_search_locations or ()):
        raise CommdiagError("torchrun (torch.distributed.run) is missing from this torch build")
    nproc = spec.nproc_per_node
    if spec.launch == "slurm":  # the ranks run on the allocation's nodes, not on this one
        return _preflight_slurm(spec, nproc)
    if spec.nnodes > 1 and spec.launch == "torchrun" and not spec.rdzv_endpoint:
        raise CommdiagError(slurm.not_in_allocation_text(spec.nnodes))
    if spec.backend == "nccl":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus == 0:
            raise CommdiagError(
                f"{spec.path}: backend: nccl needs CUDA GPUs and this machine has none visible. "
                "For a CPU run use the gloo backend, e.g. commdiag sweep sweeps/cpu-smoke.yaml")
        nproc = nproc or gpus
        if nproc > gpus and os.environ.get("COMMDIAG_SHARE_GPU") != "1":  # worker.SHARE_GPU_VAR: benchmarks
            fewer = f"use --set nproc_per_node={gpus}, or " if gpus >= 2 else ""
            raise CommdiagError(
                f"{spec.path}: nproc_per_node: {nproc} ranks but only {gpus} GPU(s) are visible; "
                f"{fewer}try the machinery on CPU with gloo: commdiag sweep sweeps/cpu-smoke.yaml")
    nproc = nproc or 2
    if nproc * spec.nnodes < 2:
        # torch skips a 1-rank all-reduce (the CUDA graph comes out empty): nothing would be measured.
        raise CommdiagError(f"{spec.path}: nproc_per_node: an all-reduce needs at least 2 ranks in all "
                            f"(got {nproc} x {spec.nnodes} node(s))"
                            + ("; on CPU try: commdiag sweep sweeps/cpu-smoke.yaml" if spec.backend == "nccl" else ""))
    return nproc


def _preflight_slurm(spec: Spec, nproc: int | None) -> int:
    """launch: slurm: inside an allocation with enough nodes; ranks per node from the spec, else from
    Slurm's GPUs per node (nccl); the GPUs are counted by the worker on its node, not here."""
    alloc = slurm.allocation()
    slurm.check_fits(alloc, spec.nnodes)
    if nproc is None:
        gpus = os.environ.get("SLURM_GPUS_ON_NODE") or os.environ.get("SLURM_GPUS_PER_NODE", "").split(":")[-1]
        if not gpus.isdigit():
            raise CommdiagError(f"{spec.path}: nproc_per_node: not set, and Slurm does not say how many GPUs a "
                                "node has (SLURM_GPUS_ON_NODE): set nproc_per_node, or salloc --gpus-per-node=N")
        nproc = int(gpus)
    if nproc * spec.nnodes < 2:
        raise CommdiagError(f"{spec.path}: nproc_per_node: an all-reduce needs at least 2 ranks in all "
                            f"(got {nproc} x {spec.nnodes} node(s))")
    return nproc


def _seed(spec: Spec) -> int:
    if spec.seed is not None:
        return spec.seed
    if spec.nnodes > 1 and spec.launch == "torchrun":  # a commdiag per node: each must draw the same order
        return zlib.crc32(repr(spec.to_json()).encode())
    return random.SystemRandom().randrange(2**31)


def _nccl_debug_env(spec: Spec, env: dict[str, str], folder: Path) -> tuple[dict[str, str], str]:
    if spec.backend != "nccl":
        return {}, "not applicable (gloo)"
    if "NCCL_DEBUG" in env:
        return {}, f"user's own NCCL_DEBUG={env['NCCL_DEBUG']} kept; NCCL's confirmation is read only if it logs ENV to a file"
    subsys = "ENV,INIT" if _tuner_requested(env) else "ENV"  # INIT: the tuner's load and rule lines
    return ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": subsys,
             "NCCL_DEBUG_FILE": str(folder.resolve() / "nccl.%h.%p.log")},  # the launch runs in its folder
            f"commdiag: NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS={subsys} (init only, no per-call logging)")


def _method(spec: Spec) -> dict:
    """How this run measures, in words: stored in run.json, shown by the report, compared by compare."""
    method = {"combine_ranks": "per iteration, the max over ranks"}
    how, why = launch_method(spec)
    method["launch"] = LAUNCH_TEXT[how] + (f" ({why})" if why else "")
    if spec.model:
        from . import tpstep
        method.update(tpstep.method_text(spec))
        return method
    if spec.reuse_process:
        method["process"] = ("reuse_process: per trial, configs that differ only in "
                             f"{'/'.join(PER_COMMUNICATOR)} share one torchrun process, each with fresh "
                             "communicators created after its variables were set; kept only where every rank's "
                             "NCCL log confirms the values for that run")
    if spec.backend == "gloo":
        method["eager"] = ("each blocking all_reduce call's wall time on a monotonic clock (batch 1), "
                           f"{_count_text(spec)} calls per size; gloo has no CUDA graphs, so eager only")
        return method
    method["sample"] = (f"a window of batch back-to-back all-reduces between two CUDA events, / batch; "
                        f"batch={spec.batch} (auto: enough calls to fill {spec.window_us:g} us of device time)")
    if "graph" in spec.modes:
        method["graph"] = (f"batch all-reduces captured in one CUDA graph; {_count_text(spec)} replays back to back "
                           f"on the {spec.replay_stream} stream, a CUDA event between replays")
    if "eager" in spec.modes:
        method["eager"] = (f"{_count_text(spec)} windows of batch back-to-back calls on the current stream; "
                           "enqueue_us = host time per call to issue it")
    method["vias"] = ", ".join(
        {"torch": "torch = torch.distributed.all_reduce",
         "nccl-direct": "nccl-direct = libnccl's ncclAllReduce through ctypes (the library torch loaded), "
                        "arguments converted once; modes graph-direct/eager-direct"}[v] for v in spec.vias)
    return method


def _count_text(spec: Spec) -> str:
    """How many samples a size gets, in words (the method block and the report show it)."""
    if spec.time_per_size_ms is None:
        return str(spec.iters)
    return (f"as many as fit {spec.time_per_size_ms:g} ms per size (at least {min(20, spec.iters)}, at most "
            f"{spec.iters}; calibrated in the launch from its warmup)")


def new_run(spec: Spec, run_dir: Path, nproc: int) -> dict:
    seed = _seed(spec)
    order = launch_order(spec, seed)
    return {
        "format": results.RUN_FORMAT, "version": results.RUN_FORMAT_VERSION,
        "commdiag_version": __version__, "created_utc": launcher.utc_now(), "finished_utc": None,
        "state": "running",
        "spec_file": spec.path, "spec_given": spec.raw, "spec": spec.to_json(),
        "nproc_per_node": nproc, "world_size": nproc * spec.nnodes, "seed": seed,
        "method": _method(spec),
        "configs": [{"name": c.name, "env": c.env, "overrides": c.overrides, "origin": c.origin} for c in spec.configs],
        "launches": [{"index": l.index, "config": l.config, "trial": l.trial, "stage": 1, "status": results.PENDING}
                     for l in order],
        "fingerprint": {"launcher": metadata.collect_host(), **_nvml_fingerprint(spec)},
        "warnings": list(spec.warnings),
        "launch": _launch_record(spec),
        "racing": {"enabled": spec.racing, "looks": []},
    }


LAUNCH_TEXT = {
    "forkserver": "each launch's ranks are fresh processes forked from per-rank launch servers that "
                  "imported torch and the worker only (no CUDA, NCCL or NVML before the fork); the child "
                  "sets the launch's variables, then initialises CUDA, NCCL and the process group",
    "torchrun": "each launch is a fresh torchrun (agent and workers each import torch)",
    "slurm": "each launch is one Slurm job step (srun) over the allocation's nodes: every rank a fresh "
             "process started by slurmstepd with the launch's environment (--export=ALL)",
}


def launch_method(spec: Spec) -> tuple[str, str | None]:
    """The method this run's launches use, and why it is not the spec's ``launch`` (None: it is)."""
    if spec.launch in ("torchrun", "slurm"):
        return spec.launch, None
    if spec.nnodes > 1:
        return "torchrun", "launch: forkserver is single-node only; nnodes > 1 runs a fresh torchrun per launch"
    # A config's variable that the servers may not change after the fork (LD_PRELOAD, OMP_NUM_THREADS,
    # TORCH_DISTRIBUTED_DEBUG, ...) gets launch servers started with it (serverpool.py): no torchrun.
    return "forkserver", None


def _launch_record(spec: Spec) -> dict:
    how, why = launch_method(spec)
    record = {"requested": spec.launch, "method": how, **({"note": why} if why else {})}
    if how == "slurm":
        record["slurm"] = slurm.allocation().to_json()
    return record


class Starter:
    """Starts each launch's processes by the run's method; owns the run's launch servers.

    Fail closed: when a server refuses a fork (it is no longer clean), the servers are closed, the
    launch runs under torchrun instead, and so does every later launch of this run; run.json's
    ``launch`` block and warnings say so."""

    def __init__(self, spec: Spec, run: dict, run_dir: Path, base_env: dict, on_plan=None):
        self.spec, self.run, self.run_dir, self.base_env, self.on_plan = spec, run, run_dir, base_env, on_plan
        self.method, _ = launch_method(spec)
        if run.get("launch", {}).get("fallback"):  # refused earlier in this run: stays off
            self.method = "torchrun"
        self.pool: serverpool.ServerPool | None = None
        self.started_servers = False

    def launch(self, folder: Path, plan: dict, *, index: int, config_env: dict, extra_env: dict,
               deadline_s: float, rdzv_id: str, mark: Callable[[str], None]) -> tuple[launcher.LaunchOutcome, str, str]:
        """Run one launch; ``mark(marker)`` records its processes' marker before any starts.
        Returns (outcome, marker, method)."""
        from ..atomic import write_json

        if self.method == "slurm":
            marker = launcher.new_marker()
            mark(marker)
            alloc = slurm.Allocation(self.run["launch"]["slurm"]["job_id"],
                                     tuple(self.run["launch"]["slurm"]["nodes"]))
            outcome = slurm.launch_worker(folder, plan, alloc=alloc, base_env=self.base_env, config_env=config_env,
                                          extra_env=extra_env, nproc=self.run["nproc_per_node"],
                                          nnodes=self.spec.nnodes, deadline_s=deadline_s, marker=marker)
            if outcome.exit_code not in (0, None) and not slurm.alive(alloc):
                # the allocation ended under the launch (time limit, scancel, salloc interrupted): not
                # the config's failure; the launch is pending again and the run resumable elsewhere
                self.run.setdefault("warnings", []).append(
                    f"Slurm job {alloc.job_id} ended mid-run: resume inside a new allocation, "
                    f"salloc -N {self.spec.nnodes} commdiag sweep --resume {self.run_dir}")
                outcome = launcher.LaunchOutcome(None, False, outcome.wall_s, outcome.killed_survivors, True)
            return outcome, marker, "slurm"
        self.started_servers = False
        if self.method == "forkserver":
            if self.pool is None:
                self.started_servers = True  # this launch carries their one-time start (eta.py leaves it out)
                self.pool = serverpool.ServerPool(self.run["nproc_per_node"], self.base_env,
                                                  self.run_dir / "launch-servers.log")
            marker = self.pool.marker
            mark(marker)
            write_json(folder / "plan.json", plan)
            try:
                outcome = self.pool.launch(index, config_env, extra_env, folder / "plan.json", deadline_s)
                if self.pool.started:  # the launch servers' groups: what tells each apart, and its proof
                    self.run.setdefault("launch", _launch_record(self.spec))["server_groups"] = self.pool.started
                return outcome, marker, "forkserver"
            except serverpool.ServerRefused as e:
                self._fall_back(str(e))
        marker = launcher.new_marker()
        mark(marker)
        outcome, marker = launcher.launch_worker(
            folder, plan, base_env=self.base_env, config_env=config_env, extra_env=extra_env,
            nproc=self.run["nproc_per_node"], nnodes=self.spec.nnodes, rdzv_endpoint=self.spec.rdzv_endpoint,
            rdzv_id=rdzv_id, deadline_s=deadline_s, marker=marker)
        return outcome, marker, "torchrun"

    def _fall_back(self, why: str) -> None:
        self.close()
        self.method = "torchrun"
        record = self.run.setdefault("launch", _launch_record(self.spec))
        record.update(method="torchrun", fallback=why)
        warning = (f"launch servers refused to fork ({why}): a child would not have been a fresh process; "
                   "this and every later launch of the run use a fresh torchrun")
        self.run.setdefault("warnings", []).append(warning)
        if self.on_plan:
            self.on_plan(StagePlan("warning", 0, None, _fit([f"commdiag: warning: {warning}"])))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def _nvml_fingerprint(spec: Spec) -> dict:
    """The GPU topology (NVML readings, the layout of ``detect --json``) of the launching node, for what
    reads a run later: ``tuner rules`` allows LL128 rules only where every GPU pair was NVLink."""
    if spec.backend != "nccl":
        return {}
    from ..environment.topology import NvmlUnavailable, read_nvml

    try:
        return {"nvml_readings": read_nvml()}
    except NvmlUnavailable as e:
        return {"nvml_readings_error": str(e)}
    except Exception as e:  # NVML must never stop a sweep; say what happened instead
        return {"nvml_readings_error": f"{e.__class__.__name__}: {str(e)[:200]}"}


@dataclass(frozen=True)
class StagePlan:
    """What the CLI prints before launches start: stage 2's claims and cost, or --certify-sizes' cost."""

    kind: str  # confirm | certify-sizes
    launches: int
    est_s: float | None
    lines: tuple[str, ...]


def run_sweep(spec: Spec | None = None, *, run_dir: Path | None = None, resume: Path | None = None,
              env: dict[str, str] | None = None,
              on_progress: Callable[[Progress], None] | None = None,
              on_plan: Callable[[StagePlan], None] | None = None,
              confirm: bool = True, certify_sizes: bool = False,
              sampler: machinestate.Sampler | None = None) -> SweepResult:
    """Run every pending launch of a new run (``spec``) or of an interrupted one (``resume``): stage 1
    (the interleaved trials), then, unless ``confirm`` is False, stage 2 (verdict.py: fresh rounds of
    default and the screening's candidates).  Both stages' launches live in run.json, so Ctrl-C and
    --resume work across them.  ``sampler``: what reads the machine's state around each launch
    (machinestate.py; default NVML for nccl runs, nothing for gloo)."""
    base_env = dict(os.environ if env is None else env)
    if resume is not None:
        run_dir = Path(resume)
        run = results.load_run_json(run_dir)
        spec = Spec.from_json(run["spec"])
        _check_reuse(spec, base_env)
        preflight(spec)
        run["state"] = "running"
    else:
        assert spec is not None
        _check_reuse(spec, base_env)
        if confirm:
            _check_confirm_rounds(spec, certify_sizes)
        nproc = preflight(spec)
        if certify_sizes:
            spec, plan = _certify_sizes_plan(spec)
            if on_plan:
                on_plan(plan)
        run_dir = Path(run_dir) if run_dir else default_run_dir(spec)
        if (run_dir / "run.json").exists():
            raise CommdiagError(f"{run_dir}: already holds a run; use --resume {run_dir} or another --out")
        runlock.check_folder(run_dir)  # before anything is made: no folder left behind a user's link
        atomic.make_dirs(run_dir)  # the one writer: never through a link
        with runlock.hold(run_dir):  # checked again under the lock: two sweeps may race for one --out
            if (run_dir / "run.json").exists():
                raise CommdiagError(f"{run_dir}: already holds a run; use --resume {run_dir} or another --out")
            run = new_run(spec, run_dir, nproc)
            run["confirm_requested"] = bool(confirm)
            if certify_sizes:
                run["certify_sizes"] = {"trials": spec.trials}
                # its per-size claims are tested on stage 1 itself, every config in every trial
                run["racing"] = {"enabled": False, "looks": [], "note": "off with --certify-sizes"}
            results.save_run(run_dir, run)
            return _run_stages(spec, run, run_dir, base_env, on_progress, on_plan, sampler)
    with runlock.hold(run_dir):
        run = results.load_run_json(run_dir)  # read again under the lock: what the last holder left
        run["state"] = "running"
        _reap(run, run_dir)
        return _run_stages(spec, run, run_dir, base_env, on_progress, on_plan, sampler)


def _spec_families(spec: Spec) -> tuple[int, int, str]:
    """(fewest, most) claims stage 2 of ``spec`` can make, and the sidedness of the fewest: every named
    config (confirm.configs) in every band with sizes, two-sided; a screening candidate per band."""
    from ..analyse.screening import in_band

    bands = sum(1 for rng in spec.bands.values() if any(in_band(s.tokens, rng) for s in spec.sizes))
    named = len(spec.confirm_configs)
    unnamed = len(spec.configs) - 1 - named
    most = bands * (named + (1 if unnamed > 0 else 0))
    return (bands * named, most, TWO_SIDED) if named else (min(1, most), most, LESS)


def _check_confirm_rounds(spec: Spec, certify_sizes: bool) -> None:
    """Before any launch: a fixed confirm.rounds that cannot certify even the spec's fewest claims is refused."""
    if not spec.confirm_rounds:
        return
    fewest, _, alt = _spec_families(spec)
    if not fewest:
        return
    thr = (stats.ALPHA / 2 if certify_sizes else stats.ALPHA) / fewest
    if paired.smallest_p(spec.confirm_rounds, alt) > thr:
        from ..errors import SpecError

        raise SpecError(spec.path, "confirm.rounds",
                        f"not certifiable with this plan: {spec.confirm_rounds} rounds give the paired within-round "
                        f"test a smallest p of {paired.smallest_p(spec.confirm_rounds, alt):.2g}, and this spec's "
                        f"{fewest} claim(s) each need p <= {thr:.2g}; set confirm.rounds: "
                        f"{paired.rounds_to_reach(thr, alt)} (or auto), or run with --no-confirm for screening only")


def run_confirm(run_dir: Path, *, rounds: int | None = None, env: dict[str, str] | None = None,
                on_progress: Callable[[Progress], None] | None = None,
                on_plan: Callable[[StagePlan], None] | None = None,
                sampler: machinestate.Sampler | None = None) -> SweepResult:
    """``commdiag confirm RUN_DIR [--rounds K]``: run stage 2 on a screened run, finish an interrupted one,
    or extend a confirmed one by K rounds (a further look, tested at a halved threshold: certify.py)."""
    with runlock.hold(run_dir):
        return _confirm_locked(Path(run_dir), rounds, env, on_progress, on_plan, sampler)


def _reap(run: dict, run_dir: Path) -> None:
    """Before a resume reruns a launch: end what a killed commdiag left running (by launch marker)."""
    ended = runlock.reap_orphans(run)
    record = run.get("launch", {})
    if record.get("method") == "slurm" and slurm.in_allocation():
        # the launches' ranks ran on the allocation's nodes: end what a killed commdiag left there too
        alloc = slurm.allocation()
        pending = {l.get("marker") for l in run["launches"] if l.get("status") == results.PENDING}
        for marker in sorted(m for m in pending if m):
            slurm.cancel_step(alloc, marker)
            found = slurm.reap(alloc, min(run["spec"].get("nnodes", 1), len(alloc.nodes)), marker, dict(os.environ))
            if found:
                run.setdefault("warnings", []).append(
                    f"ended {found} process(es) of launch marker {marker[:12]} left on the allocation's nodes")
    if ended:
        run.setdefault("warnings", []).append(
            f"ended {len(ended)} process(es) left running by an earlier commdiag in {run_dir} (pids "
            f"{', '.join(map(str, ended))})")


def _confirm_locked(run_dir: Path, rounds, env, on_progress, on_plan, sampler) -> SweepResult:
    base_env = dict(os.environ if env is None else env)
    run = results.load_run_json(run_dir)
    _reap(run, run_dir)
    spec = Spec.from_json(run["spec"])
    if any(l["status"] == results.PENDING and int(l.get("stage", 1)) == 1 for l in run["launches"]):
        raise CommdiagError(f"{run_dir}: stage 1 (screening) is unfinished; finish it first: "
                            f"commdiag sweep --resume {run_dir}")
    _check_reuse(spec, base_env)
    preflight(spec)
    run["confirm_requested"] = True
    plan = run.get("confirmation")
    pending2 = any(l["status"] == results.PENDING for l in run["launches"] if l.get("stage") == 2)
    if plan and not pending2:
        if not plan.get("claims"):
            raise CommdiagError(f"{run_dir}: stage 2 has no claims to extend (screening found no candidate)")
        _check_further_look(run_dir, plan, rounds)
        kept = [l for l in run["launches"] if l.get("status") in (results.OK, results.TIMEOUT)
                and not (results.launch_dir(run_dir, l["index"]) / "result.json").is_file()]
        if kept:  # samples.csv is rebuilt from the launch folders: extending would lose these launches
            raise CommdiagError(f"{run_dir}: {len(kept)} finished launch(es) have no launches/NNNN/result.json "
                                f"(launch {kept[0]['index']} first): this run folder cannot be extended without "
                                "losing their samples; run the spec afresh instead")
        if plan.get("test") != certify.PAIRED_TEST:  # confirmed before the paired test: judged the paired way now
            plan.update(version=certify.CONFIRMATION_VERSION, test=certify.PAIRED_TEST,
                        upgraded_from=plan.get("version", 1))
        certify.add_look(plan, rounds, launcher.utc_now())
        _add_rounds(run, plan, spec, rounds)
        if on_plan:
            on_plan(_confirm_plan_text(run, plan, rounds))
    elif plan is None:
        run["confirm_rounds_override"] = rounds
    elif rounds is not None:
        raise CommdiagError(f"{run_dir}: stage 2 is unfinished; finish it first (commdiag confirm {run_dir}, without "
                            "--rounds), then extend it")
    run["state"] = "running"
    results.save_run(run_dir, run)
    return _run_stages(spec, run, run_dir, base_env, on_progress, on_plan, sampler)


def _run_stages(spec: Spec, run: dict, run_dir: Path, base_env: dict, on_progress, on_plan,
                sampler: machinestate.Sampler | None = None) -> SweepResult:
    procs.take_back_sigint()  # the sweep's interrupt-and-resume needs Ctrl-C
    configs = {c["name"]: c for c in run["configs"]}
    run.setdefault("launch", _launch_record(spec))  # a run stored before launch methods: torchrun
    if on_plan and any(l["status"] == results.PENDING for l in run["launches"]):
        on_plan(_start_banner(spec, run, run_dir))
    own_sampler = sampler is None
    sampler = sampler or machinestate.open_sampler(spec.backend)
    starter = Starter(spec, run, run_dir, base_env, on_plan)
    try:
        run["machine_state"] = sampler.describe()  # once per run: what is read, or why nothing is
        interrupted = _run_pending(spec, run, run_dir, configs, base_env, on_progress, sampler, starter)
        if not interrupted and run.get("confirm_requested", True) and run.get("confirmation") is None:
            plan = _plan_stage2(spec, run, run_dir, run.pop("confirm_rounds_override", None) or spec.confirm_rounds)
            results.save_run(run_dir, run)
            if on_plan:
                on_plan(plan)
            interrupted = _run_pending(spec, run, run_dir, configs, base_env, on_progress, sampler, starter)
        run["machine_state"] = sampler.describe()  # says so if NVML stopped answering mid-run
    finally:
        starter.close()
        if own_sampler:
            try:
                sampler.close()  # waits for a reading thread still inside NVML (at most a few seconds)
            except KeyboardInterrupt:  # a second Ctrl-C meanwhile: the run is still saved, resumable
                interrupted = True
    run["state"] = "interrupted" if interrupted else "complete"
    run["finished_utc"] = None if interrupted else launcher.utc_now()
    results.save_run(run_dir, run)
    results.assemble(run_dir, run)
    counts: dict[str, int] = {}
    for l in run["launches"]:
        counts[l["status"]] = counts.get(l["status"], 0) + 1
    return SweepResult(run_dir, run["state"], counts, tuple(run.get("warnings", ())))


def _start_banner(spec: Spec, run: dict, run_dir: Path) -> StagePlan:
    """The first thing a sweep prints: where it writes, how many launches, about how long."""
    pending = [l for l in run["launches"] if l["status"] == results.PENDING]
    stage1 = sum(1 for l in pending if int(l.get("stage", 1)) == 1)
    later = run.get("confirm_requested", True) and run.get("confirmation") is None
    most = stage2_at_most(spec) if later else 0
    then = (f"; then stage 2 (confirmation; its plan is printed when screening ends): at most {most} launches"
            if later else "")
    cost = eta.measured(run) or eta.recorded(spec, run.get("launch", {}).get("method") or launch_method(spec)[0])
    est = eta.remaining_s(spec, run, cost, pending, most)
    line = (f"run folder {run_dir}: {len(pending)} launch{'es' if len(pending) != 1 else ''} to run"
            + (f" ({stage1} screening: {len(run['configs'])} configs x {spec.trials} trials"
               + ("; racing may drop clear losers" if (run.get("racing") or {}).get("enabled") else "") + ")"
               if stage1 else "") + then)
    lines = [line, f"  expected: {_minutes(est)} in all" + (" at most" if most else "") + f" ({cost.note})"
             if est is not None else f"  expected: from the first launch on ({cost.note})"]
    how = run.get("launch", {})
    if how.get("method"):
        lines.append(f"  launch: {how['method']}" + (f" ({how['note']})" if how.get("note") else "")
                     + (f"; fell back earlier in this run: {how['fallback']}" if how.get("fallback") else ""))
    if spec.confirm_rounds and then:
        _, most, _ = _spec_families(spec)
        thr = (stats.ALPHA / 2 if run.get("certify_sizes") else stats.ALPHA) / max(most, 1)
        if most and paired.smallest_p(spec.confirm_rounds, TWO_SIDED if spec.confirm_configs else LESS) > thr:
            lines.append(f"  confirm.rounds: {spec.confirm_rounds} is too few if screening adds every claim it can "
                         f"({most}): claims beyond its reach would be not certifiable with this plan (auto plans "
                         "the rounds every claim needs)")
    return StagePlan("start", len(pending), est, _fit(lines))


def _minutes(seconds: float) -> str:
    return f"about {seconds / 60:.1f} min" if seconds >= 90 else f"about {seconds:.0f} s"


def stage2_at_most(spec: Spec) -> int:
    """The most stage-2 launches a sweep of ``spec`` can plan, known before screening: every band adds a
    screening candidate besides confirm.configs, each round runs default and every claimed config."""
    fewest, most, _ = _spec_families(spec)
    if not most:
        return 0
    alt = TWO_SIDED if spec.confirm_configs else LESS
    rounds = spec.confirm_rounds or paired.rounds_to_reach(stats.ALPHA / most, alt)
    bands = sum(1 for rng in spec.bands.values() if any(screening.in_band(s.tokens, rng) for s in spec.sizes))
    unnamed = len(spec.configs) - 1 - len(spec.confirm_configs)
    return rounds * (1 + len(spec.confirm_configs) + min(bands, max(unnamed, 0)))


def dry_run(spec: Spec) -> StagePlan:
    """``commdiag sweep SPEC --dry-run``: the plan (launches per stage, at most how many stage-2 rounds) and
    its expected wall time from recorded components (eta.py), without launching anything."""
    how, why = launch_method(spec)
    cost = eta.recorded(spec, how)
    n1 = len(spec.configs) * spec.trials
    most = stage2_at_most(spec)
    fewest, claims, alt = _spec_families(spec)
    rounds = (spec.confirm_rounds or paired.rounds_to_reach(stats.ALPHA / claims, TWO_SIDED if spec.confirm_configs
                                                            else LESS)) if claims else 0
    one1 = cost.launch_s()
    one2 = cost.launch_s(eta.stage2_graph_share(spec))
    lines = [f"plan for {spec.path} (nothing is launched):",
             f"  launch: {how}" + (f" ({why})" if why else ""),
             f"  stage 1 (screening): {len(spec.configs)} configs x {spec.trials} trials = {n1} launches"
             + (f", {len(spec.sizes)} sizes x {eta.series(spec)} series each" if spec.sizes else "")
             + ("; racing stops launching configs that lose clearly after each trial (fewer launches)"
                if spec.racing else "")]
    if most:
        lines.append(f"  stage 2 (confirmation): at most {rounds} rounds x {most // max(rounds, 1)} configs = {most} "
                     f"launches (up to {claims} claim(s); fewer when screening nominates fewer configs)")
    else:
        lines.append("  stage 2 (confirmation): none (no config besides default)")
    if one1 is None:
        lines.append(f"  expected: start-up {cost.startup_s * (n1 + most) / 60:.1f} min for {n1 + most} launches, "
                     f"plus measuring, known from the first launch ({cost.note})")
        est = None
    else:
        est = eta.SERVER_START_S.get(spec.backend, 0.0) * (how == "forkserver") + n1 * one1 + most * one2
        lines.append(f"  expected: {_minutes(est)} at most: {n1} x {one1:.1f} s + {most} x {one2:.1f} s "
                     f"(stage 2 times one series)" + (" + the launch servers' start" if how == "forkserver" else ""))
        lines.append(f"    {cost.note}")
    return StagePlan("dry-run", n1 + most, est, _fit(lines))


def _run_pending(spec: Spec, run: dict, run_dir: Path, configs: dict, base_env: dict, on_progress,
                 sampler: machinestate.Sampler, starter: Starter) -> bool:
    """Run every pending launch in order; True when interrupted (the launch in flight is pending again)."""
    pending = [l for l in run["launches"] if l["status"] == results.PENDING]
    done_walls: list[float] = []
    done = 0
    for batch in process_batches(pending, configs, spec.reuse_process):
        batch = [l for l in batch if l["status"] == results.PENDING]  # racing dropped the rest
        if not batch:
            continue
        try:
            outcome = _one_process(spec, run, run_dir, batch, configs, base_env, sampler, starter)
        except KeyboardInterrupt:  # outside the supervised wait: the launch has no result yet
            outcome = launcher.LaunchOutcome(None, False, 0.0, 0, interrupted=True)
        if outcome.interrupted:
            for launch in batch:
                if launch.get("marker"):  # whatever it had started ends with it (Ctrl-C mid-start)
                    launcher.kill_marked(launch["marker"])
                for key in list(launch):
                    if key not in LAUNCH_KEYS:
                        launch.pop(key)
                launch["status"] = results.PENDING
            results.save_run(run_dir, run)
            return True
        try:
            done_walls.append(outcome.wall_s / len(batch))
            drops = race(spec, run, run_dir)
            if drops and starter.on_plan:
                starter.on_plan(StagePlan("racing", 0, None, _fit(
                    [f"racing: {d['config']} {d['reason']}" for d in drops])))
            results.save_run(run_dir, run)
            remaining = sum(1 for l in pending if l["status"] == results.PENDING)  # dropped ones are not
            for i, launch in enumerate(batch):
                done += 1
                if on_progress:
                    left = remaining + len(batch) - 1 - i
                    on_progress(Progress(done, done + left, launch, _eta(spec, run, pending, [])))
        except KeyboardInterrupt:  # between launches (saving, printing): the finished batch stands
            results.save_run(run_dir, run)
            return True
    return False


def race(spec: Spec, run: dict, run_dir: Path) -> list[dict]:
    """After a launch: when it completed a screening trial (and trials remain), screen the trials so far
    and drop the configs that clearly lose (analyse/racing.py): their pending stage-1 launches become
    ``dropped``, with the reason, and run.json's ``racing.looks`` records the look.  Returns the drops."""
    record = run.get("racing") or {}
    if not record.get("enabled"):
        return []
    stage1 = [l for l in run["launches"] if int(l.get("stage", 1)) == 1]
    open_trials = {l["trial"] for l in stage1 if l["status"] == results.PENDING}
    if not open_trials:
        return []
    after = min(open_trials)  # trials 0 .. after-1 are final
    if after == 0 or any(lk["after_trial"] >= after for lk in record["looks"]):
        return []
    samples, summary = results.assemble(run_dir, run)
    scr, _ = verdict.screening_of(results.RunData(run_dir, run, samples, summary))
    already = {d["config"] for lk in record["looks"] for d in lk["dropped"]}
    drops = racing.decide(scr, after_trial=after, protected=spec.confirm_configs, already=already)
    record["looks"].append({"after_trial": after, "dropped": [d.to_json() for d in drops]})
    why = {d.config: d.reason for d in drops}
    for l in stage1:
        if l["status"] == results.PENDING and l["config"] in why:
            l["status"], l["dropped"] = results.DROPPED, why[l["config"]]
    return [d.to_json() for d in drops]


def _eta(spec: Spec, run: dict, pending: list[dict], rest_of_batch: list[dict]) -> float | None:
    """The progress line's ETA: this run's measured cost (eta.py: the servers' start left out) for what is left."""
    cost = eta.measured(run)
    if cost is None:
        return None
    left = [l for l in pending if l["status"] == results.PENDING] + rest_of_batch
    return eta.remaining_s(spec, run, cost, left)


# What a pending launch keeps when it is reset: its identity and place in the plan.
LAUNCH_KEYS = ("index", "config", "trial", "stage", "round", "marker")


def _mean_wall(run: dict) -> float | None:
    walls = [l["wall_s"] for l in run["launches"] if l.get("wall_s")]
    return sum(walls) / len(walls) if walls else None


def _plan_stage2(spec: Spec, run: dict, run_dir: Path, rounds: int | None) -> StagePlan:
    """Screen stage 1, record the confirmation plan in run.json and append its pending launches."""
    samples, summary = results.assemble(run_dir, run)  # the tables just built, not read back from disk
    scr, _ = verdict.screening_of(results.RunData(run_dir, run, samples, summary))
    claims = certify.plan_claims(scr, spec.confirm_configs)
    stage1 = sum(1 for l in run["launches"] if int(l.get("stage", 1)) == 1)
    alpha = stats.ALPHA / 2 if run.get("certify_sizes") else stats.ALPHA  # --certify-sizes spends the other half
    plan = certify.confirmation_plan(claims, rounds, stage1, launcher.utc_now(), alpha)
    plan["measure"] = _stage2_measure(spec, claims, scr.band_sizes)
    run["confirmation"] = plan
    run["version"] = results.RUN_FORMAT_VERSION
    k2 = plan["looks"][0]["rounds"]
    if claims:
        _add_rounds(run, plan, spec, k2)
    return _confirm_plan_text(run, plan, k2)


def _stage2_measure(spec: Spec, claims, band_sizes: dict) -> dict:
    """The worker plan of a stage-2 launch: only the claims' series (graph via torch, graph-direct via
    nccl-direct, ...), at every band's sizes (a winner's ratio in the other bands decides profile.env);
    a stage-2 launch then costs little more than its start."""
    series = [results.label_series(c.mode, spec.vias) for c in claims]
    modes = sorted({m for m, _ in series}, key=list(spec.modes).index)
    vias = sorted({v for _, v in series}, key=list(spec.vias).index)
    sizes = sorted({s for sizes in band_sizes.values() for s in sizes} | {c.size_bytes for c in claims
                                                                         if c.size_bytes is not None})
    return {"modes": modes, "vias": vias, "sizes": sizes or [s.bytes for s in spec.sizes]}


def _check_further_look(run_dir: Path, plan: dict, rounds: int | None) -> None:
    """Before any launch of a further look: refuse one whose rounds in all cannot reach its threshold."""
    claims = certify.claims_of(plan)
    total = certify.total_rounds(plan)
    thr = certify.next_threshold(plan)
    need = max(paired.rounds_to_reach(thr, c.alternative) for c in claims)
    least = min(paired.rounds_to_reach(thr, c.alternative) for c in claims)
    if rounds is None:
        if certify.unreachable(plan) == claims:
            raise CommdiagError(f"{run_dir}: not certifiable with this plan ({total} rounds); give --rounds "
                                f"{max(1, need - total)} to add the rounds the paired test needs "
                                f"(p <= {thr:.2g})")
        raise CommdiagError(f"{run_dir}: already confirmed ({len(plan['looks'])} look(s)); give --rounds K to "
                            "extend it: a further look is tested at half the previous threshold")
    if total + rounds < least:
        raise CommdiagError(f"{run_dir}: --rounds {rounds}: with {total + rounds} rounds in all the paired "
                            f"within-round test cannot reach this look's p <= {thr:.2g} for any claim "
                            f"(smallest p: {paired.smallest_p(total + rounds, claims[0].alternative):.2g}); "
                            f"--rounds {least - total} can" + (f" ({need - total} for every claim)"
                                                               if need > least else ""))


def _confirm_plan_text(run: dict, plan: dict, rounds: int) -> StagePlan:
    claims = certify.claims_of(plan)
    if not claims:
        return StagePlan("confirm", 0, 0.0, ("stage 2: nothing to confirm (screening found no config at least 3% "
                                              "faster than default in any band, and the spec names no "
                                              "confirm.configs): keep NCCL defaults",))
    n = rounds * len(plan["configs"])
    wall = _mean_wall(run)
    look = plan["looks"][-1]
    thr, total = look["threshold"], certify.total_rounds(plan)
    cannot = certify.unreachable(plan)
    lines = []
    if len(cannot) == len(claims):
        need = max(paired.rounds_to_reach(thr, c.alternative) for c in claims)
        asked = total or plan.get("rounds_requested") or 0  # a first look that launched nothing: what was asked
        lines.append(f"stage 2 (confirmation, look {look['look']}): not certifiable with this plan: {asked} rounds "
                     f"cannot reach p <= {thr:.2g} for any of its {len(claims)} claim(s) (smallest p of the paired "
                     f"test with {asked} rounds: {paired.smallest_p(asked, cannot[0].alternative):.2g}); nothing "
                     f"is launched. {need} rounds can: confirm.rounds: auto in the spec, or commdiag confirm "
                     f"RUN_DIR --rounds {max(1, need - total)}")
    else:
        lines.append(f"stage 2 (confirmation, look {look['look']}): {rounds} fresh rounds x {len(plan['configs'])} "
                     f"configs = {n} launches" + (f", at most about {n * wall / 60:.1f} min ({wall:.1f} s a stage-1 "
                                                   "launch; stage 2 measures less)" if wall else "")
                     + f"; {len(claims)} claim(s), each must reach p <= {thr:.2g}")
        lines.append("  " + _why_rounds(claims, total, thr))
        if cannot:
            need = max(paired.rounds_to_reach(thr, c.alternative) for c in cannot)
            lines.append(f"  not certifiable with this plan: {', '.join(sorted({c.config for c in cannot}))} "
                         f"(tested either way) would need {need} rounds; not launched")
    if look["look"] > 1:
        spent = len(claims) * sum(lk["threshold"] for i, lk in enumerate(plan["looks"])
                                  if certify.look_spent(plan, i + 1))
        lines.append(f"  a further look at the same claims: the run's family-wise error rate is now at most "
                     f"{spent:.2%} (each look that could certify spends its threshold x {len(claims)} claims)")
    for c in claims:
        scr = "" if c.screening_ratio is None else f" (screening ratio {c.screening_ratio:.3f})"
        lines.append(f"  claim: {c.config} {'faster' if c.alternative == 'less' else 'faster or slower'} than "
                     f"default in {c.where}, {c.mode} mode{scr} [{c.reason}]")
    return StagePlan("confirm", n, n * wall if wall else None, _fit(lines))


def _fit(lines) -> tuple[str, ...]:
    """Plan lines within 100 columns (linewrap.py)."""
    return tuple(out for line in lines for out in linewrap.fit_line(line))


def _why_rounds(claims, total: int, thr: float) -> str:
    """Why this many rounds: the paired test's smallest p with k rounds is 1/2^k (2/2^k two-sided)."""
    alt = TWO_SIDED if any(c.alternative == TWO_SIDED for c in claims) else LESS
    k = paired.rounds_to_reach(thr, alt)
    num = "2" if alt == TWO_SIDED else "1"
    why = (f"why {total} rounds: the paired within-round test's smallest p with k rounds is {num}/2^k "
           f"({'two-sided' if alt == TWO_SIDED else 'one-sided'} claims); {num}/2^{k} = "
           f"{paired.smallest_p(k, alt):.2g} <= {thr:.2g}")
    if k > 1:
        why += f", {num}/2^{k - 1} = {paired.smallest_p(k - 1, alt):.2g} is not"
    if total > k:
        why += f"; {total} rounds leave room for {total - k} rounds of opposite sign or small ranks"
    return why




def _add_rounds(run: dict, plan: dict, spec: Spec, rounds: int) -> None:
    """Append ``rounds`` rounds of pending stage-2 launches: default + every claimed config, shuffled."""
    done_rounds = sum(lk["rounds"] for lk in plan["looks"][:-1])
    rng = random.Random(f"{run['seed']}-confirm-{len(plan['looks'])}")
    for r in range(done_rounds, done_rounds + rounds):
        names = list(plan["configs"])
        rng.shuffle(names)
        for n in names:
            run["launches"].append({"index": len(run["launches"]), "config": n, "trial": spec.trials + r,
                                    "stage": 2, "round": r, "status": results.PENDING})


# Launches a 1-2 token all-reduce launch takes, for cost estimates before any launch (recorded: 2x H200
# 12-17 s with both call paths, CPU gloo 2-4 s).
EST_LAUNCH_S = {"nccl": 15.0, "gloo": 3.0}


def _certify_sizes_plan(spec: Spec) -> tuple[Spec, StagePlan]:
    """--certify-sizes: enough trials for a one-stage exact test of every config x size (primary mode),
    paired by trial (certify.certify_sizes)."""
    m, floor = certify.size_claims_needed(len(spec.configs) - 1, len(spec.sizes), stats.ALPHA / 2)
    k = floor + certify.SIZES_SPARE_TRIALS
    if spec.trials < k:
        spec = dataclasses.replace(spec, trials=k)
    n = spec.trials * len(spec.configs)
    est = n * EST_LAUNCH_S.get(spec.backend, 15.0)
    return spec, StagePlan("certify-sizes", n, est, (
        f"per-size certification: {len(spec.configs) - 1} configs x {len(spec.sizes)} sizes = {m} claims, each must "
        f"reach p <= {stats.ALPHA / 2 / m:.2g} (half the run's 1%; stage 2's band claims get the other half), paired by trial: {spec.trials} trials "
        f"(launches per config; {floor} reach it only if every one is complete and of one sign, so "
        f"{certify.SIZES_SPARE_TRIALS} spare take a failed launch), {n} launches in stage 1 "
        f"(about {est / 60:.0f} min at ~{EST_LAUNCH_S.get(spec.backend, 15.0):.0f} s a launch)",))


def _check_reuse(spec: Spec, base_env: dict) -> None:
    if spec.reuse_process and spec.backend == "nccl" and "NCCL_DEBUG" in {**base_env, **spec.base_env}:
        raise CommdiagError(f"{spec.path}: reuse_process: true needs NCCL's own log to prove each setting took "
                            "effect, and NCCL_DEBUG is set in your environment or base_env; unset it, or "
                            "set reuse_process: false")


def process_batches(launches: list[dict], configs: dict[str, dict], reuse: bool) -> list[list[dict]]:
    """The launches each torchrun process runs, in launch order: one each (the default), or with
    reuse_process every launch of one trial round whose configs differ only in PER_COMMUNICATOR
    variables (each then gets its own communicators inside the shared process)."""
    if not reuse:
        return [[l] for l in launches]
    batches: list[list[dict]] = []
    by_key: dict[tuple, list[dict]] = {}
    for l in launches:
        fixed = tuple(sorted((k, v) for k, v in configs[l["config"]]["env"].items() if k not in PER_COMMUNICATOR))
        key = (l["trial"], fixed)
        if key not in by_key:
            by_key[key] = []
            batches.append(by_key[key])
        by_key[key].append(l)
    return batches


def _one_process(spec: Spec, run: dict, run_dir: Path, batch: list[dict], configs: dict[str, dict],
                 base_env: dict, sampler: machinestate.Sampler, starter: "Starter") -> launcher.LaunchOutcome:
    """One launch's processes for ``batch`` (one launch, or several with reuse_process); record each,
    with the machine's state around it (the same for every launch of a shared process)."""
    folders = []
    for launch in batch:
        folder = results.launch_dir(run_dir, launch["index"])
        atomic.remove_tree(folder)  # left by an interrupted attempt: start clean (links inside removed, not followed)
        atomic.make_dirs(folder)
        folders.append(folder)
    first, folder = batch[0], folders[0]
    config = configs[first["config"]]
    reuse = spec.reuse_process
    process_env = ({k: v for k, v in config["env"].items() if k not in PER_COMMUNICATOR} if reuse
                   else config["env"])
    debug_env, debug_note = _nccl_debug_env(spec, {**base_env, **config["env"]}, folder)
    run["nccl_debug"] = debug_note
    plan = {
        "backend": spec.backend, "dtype": spec.dtype, "sizes": [s.bytes for s in spec.sizes],
        "modes": list(spec.modes), "warmup": spec.warmup, "iters": spec.iters, "batch": spec.batch,
        "time_per_size_ms": spec.time_per_size_ms,
        "window_us": spec.window_us,
        "vias": list(spec.vias), "replay_stream": spec.replay_stream,
        "watch_env": sorted(set(config["env"]) | set(spec.base_env)),
        "out_dir": str(folder.resolve()), "config": config["name"], "launch": first["index"],
        "nccl_debug_file": debug_env.get("NCCL_DEBUG_FILE"),
    }
    if spec.model:
        plan["model"] = spec.model  # commdiag step: the worker runs the TP layer's step (tpstep.py)
        plan["tokens"] = {str(s.bytes): s.tokens for s in spec.sizes}
    if first.get("stage") == 2 and run.get("confirmation", {}).get("measure"):
        plan.update(run["confirmation"]["measure"])  # stage 2 measures only what its claims test
    if reuse:
        plan["runs"] = [{
            "config": l["config"], "launch": l["index"], "out_dir": str(f.resolve()),
            "watch_env": sorted(set(configs[l["config"]]["env"]) | set(spec.base_env) | set(PER_COMMUNICATOR)),
            # unset in the config: what the user's environment has (None: unset), as a fresh launch would see
            "set_env": {k: configs[l["config"]]["env"].get(k, base_env.get(k)) for k in PER_COMMUNICATOR},
        } for l, f in zip(batch, folders)]
    started = launcher.utc_now()
    # The marker (COMMDIAG_LAUNCH_ID of this launch's processes) is in run.json before anything starts,
    # so a resume after kill -9 can find and end what this launch left running (runlock.reap_orphans).
    current = {"marker": starter.pool.marker if starter.pool else ""}

    def mark(marker: str) -> None:
        current["marker"] = marker
        for launch in batch:
            launch["marker"] = marker
        results.save_run(run_dir, run)

    with sampler.watch(lambda pid: bool(current["marker"]) and launcher.carries_marker(pid, current["marker"])) as watch:
        outcome, marker, method = starter.launch(
            folder, plan, index=first["index"], config_env=process_env, extra_env=debug_env,
            deadline_s=spec.timeout_s * len(batch),
            rdzv_id=f"commdiag-{spec.name}-{run['seed']}-{first['index']}", mark=mark)
    if outcome.interrupted:
        return outcome
    machine = watch.record()
    found = [results.read_launch_result(run_dir, l["index"]) for l in batch]
    measured = sum(max(r.get("measure_s", 0.0) for r in res["ranks"]) for res in found if res)
    for n, (launch, result) in enumerate(zip(batch, found)):
        launch["started_utc"], launch["marker"], launch["launched_by"] = started, marker, method
        if method == "forkserver" and starter.pool is not None and starter.pool.last_group is not None:
            launch["server_group"] = starter.pool.last_group  # run.json launch.server_groups[N]
        _record(spec, run, launch, outcome, result, folder, shared=reuse)
        launch["machine"] = machine
        if n == 0 and starter.started_servers:
            launch["starts_servers"] = True
        if reuse:
            # one process measured every launch of the batch: its start and teardown are shared
            share = max(outcome.wall_s - measured, 0.0) / len(batch)
            launch.update(process=first["index"], process_runs=len(batch), process_wall_s=round(outcome.wall_s, 3))
            if result:
                launch["overhead_s"] = round(share, 3)
                launch["wall_s"] = round(launch["measure_s"] + share, 3)
            if spec.backend == "nccl" and result and launch["status"] == results.OK:
                _require_nccl_proof(launch, plan["runs"][n]["set_env"], result)
        if spec.backend == "nccl" and result and launch["status"] == results.OK:
            _require_tuner_proof(launch, {**base_env, **configs[launch["config"]]["env"]}, result)
    return outcome


def _require_nccl_proof(launch: dict, set_env: dict, result: dict) -> None:
    """reuse_process: each rank's NCCL must have logged, for this run's own communicators, every
    PER_COMMUNICATOR value the run set (and none it did not): otherwise the run measured something else."""
    for r in result["ranks"]:
        applied = r.get("nccl_applied") or {}
        for name, want in set_env.items():
            got = applied.get(name)
            if got != want:
                launch["status"] = results.FAILED
                launch["error"] = (f"reuse_process: rank {r['rank']}'s NCCL did not confirm {name}="
                                   f"{want if want is not None else '(unset)'} for this run's communicators "
                                   f"(it logged {got if got is not None else 'nothing'}); the measurement may "
                                   "not be of this setting: run without reuse_process")
                return


def _tuner_requested(env: dict) -> str | None:
    value = env.get("NCCL_TUNER_PLUGIN")
    return value if value and value.lower() != "none" else None


def _require_tuner_proof(launch: dict, env: dict, result: dict) -> None:
    """A config naming NCCL_TUNER_PLUGIN is kept only if every rank's NCCL log shows the plugin loaded
    (and, for commdiag's plugin, rules loaded for its communicator): else it measured NCCL's defaults."""
    wanted = _tuner_requested(env)
    if not wanted:
        return
    for r in result["ranks"]:
        evidence = r.get("nccl_tuner")
        if evidence is None:
            why = ("no NCCL log to read (NCCL_DEBUG is set in your environment or base_env, so commdiag did not "
                   "set its own debug file; unset it)" if "NCCL_DEBUG" in env else "NCCL printed no tuner line")
        else:
            why = "; ".join(evidence.get("problems") or []) or None
            if why is None and not evidence.get("loaded"):
                why = "NCCL printed no tuner load line"
        if why:
            launch["status"] = results.FAILED
            launch["error"] = f"tuner plugin {wanted}: rank {r['rank']}: {why}; the launch measured NCCL's own choices"
            return


def _record(spec: Spec, run: dict, launch: dict, outcome: launcher.LaunchOutcome, result: dict | None,
            process_folder: Path, shared: bool) -> None:
    """Status, timings and what each rank saw, for one launch, from its process's outcome
    (``shared``: the process ran other launches too; its logs are in ``process_folder``)."""
    launch.update(exit_code=outcome.exit_code, timed_out=outcome.timed_out, wall_s=round(outcome.wall_s, 3),
                  killed_survivors=outcome.killed_survivors, results_complete=result is not None)
    wrong = sum(results.launch_wrong(result).values()) if result else None
    launch["wrong"] = wrong
    if result:  # what a launch costs besides measuring: torchrun start, init, teardown
        launch["measure_s"] = max(r.get("measure_s", 0.0) for r in result["ranks"])
        launch["overhead_s"] = round(outcome.wall_s - launch["measure_s"], 3)
    if shared and result:
        # reuse_process: this run's results are complete; a later run of the same process that
        # failed or hung does not make them wrong (that run is recorded as failed on its own)
        launch["status"] = results.INCORRECT if wrong else results.OK
        if wrong:
            launch["error"] = f"{wrong} wrong elements in the all-reduce check"
        if outcome.timed_out or outcome.exit_code != 0:
            launch["process_error"] = ("the process timed out later" if outcome.timed_out
                                       else f"the process exited {outcome.exit_code} later")
    elif outcome.timed_out:
        launch["status"] = results.TIMEOUT
        launch["error"] = (f"killed after the {spec.timeout_s:g}s deadline"
                           + (" (all results were written: hung in teardown)" if result else ""))
    elif outcome.exit_code != 0 or result is None:
        launch["status"] = results.FAILED
        launch["error"] = f"exit code {outcome.exit_code}" + ("" if result else "; no result written")
    elif wrong:
        launch["status"] = results.INCORRECT
        launch["error"] = f"{wrong} wrong elements in the all-reduce check"
    else:
        launch["status"] = results.OK
    if launch["status"] != results.OK:
        launch["stderr_tail"] = _tail(process_folder)
    if result:
        launch["ranks"] = [{k: v for k, v in r.items() if k not in ("samples", "enqueue_us")} for r in result["ranks"]]
        if "worker" not in run["fingerprint"] and launch["status"] == results.OK:
            run["fingerprint"]["worker"] = _worker_fingerprint(result["ranks"])


def _worker_fingerprint(ranks: list[dict]) -> dict:
    r0 = ranks[0]
    keys = ("hostname", "python", "torch", "cuda", "nccl", "driver", "cuda_driver", "kernel", "gpu_count")
    fp = {k: r0[k] for k in keys if k in r0}
    fp["gpus"] = [{"rank": r["rank"], "hostname": r.get("hostname"), "gpu_name": r.get("gpu_name"),
                   "pci_bus_id": r.get("pci_bus_id")} for r in ranks]
    return fp


def _clip(text: str, head: int, tail: int) -> str:
    return text if len(text) <= head + tail else f"{text[:head]}\n[...]\n{text[-tail:]}"


def _tail(folder: Path, max_ranks: int = 4) -> str:
    """What a failed launch said: the end of each rank's traceback (the exception is last), and
    torchrun.log's head and tail -- the first error a worker printed comes before torchrun's
    long failure report, which a plain tail would keep instead."""
    parts = []
    errors = sorted(folder.glob("rank*.error.txt"))
    for err in errors[:max_ranks]:
        parts.append(f"--- {err.name} ---\n{_clip(err.read_text(errors='replace'), 0, TAIL_CHARS // 2)}")
    if len(errors) > max_ranks:
        parts.append(f"--- and {len(errors) - max_ranks} more rank*.error.txt in {folder} ---")
    for name in ("torchrun.log", serverpool.LOG_NAME):  # a launch's log under either method
        log = folder / name
        if log.exists() and log.stat().st_size:
            parts.append(f"--- {name} ---\n{_clip(log.read_text(errors='replace'), TAIL_CHARS // 2, TAIL_CHARS)}")
    return "\n".join(parts)
