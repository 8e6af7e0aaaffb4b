"""Run a sweep: one fresh launch per (config, trial), interleaved, into a run folder.

A launch's processes are forks of per-rank launch servers (``launch: forkserver``,
serverpool.py) or a fresh torchrun (``launch: torchrun``); docs/launch-methods.md.

``run_sweep`` is the library entry point behind ``commdiag sweep`` (and ``step``): it validates
prerequisites before the first launch and, once the run is complete, publishes it (verdicts,
report.html, profiles: what the CLI prints and writes).  The run folder's life (the lock, orphans
of a killed commdiag, run.json after every launch, Ctrl-C back to pending, ``--resume`` running
only what is pending) is runner.py's; this module is sweep's kind of launch: its run.json head,
the worker's plan, how a launch's outcome is recorded and proven.  Around every launch the machine's
state is recorded (machinestate.py: NVML clocks, throttling, link, other processes; nccl runs only).

Two stages (verdict.py): stage 1 is the interleaved trials; when it is done the sweep screens it
and stages.py records the confirmation plan in run.json and appends stage 2's rounds as pending
launches, so an interrupted confirmation resumes like any other launch.  ``run_confirm``
(``commdiag confirm``) runs, finishes or extends stage 2 of an existing run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.machinery
import importlib.util
import os
import random
from pathlib import Path
from typing import Callable

from .. import atomic, metadata
from ..analyse import racing, verdict
from . import eta, hosts, launcher, machinestate, runner, serverpool, slurm, stages
from .launcher import Progress
from ..formats import results
from ..errors import CommdiagError
from ..formats.spec import Spec, launch_order

TAIL_CHARS = 4000  # enough of a traceback or NCCL WARN block to see the cause
# Variables NCCL reads at every communicator's init (its tuning model), not once per process:
# the only ones reuse_process may change inside a running process.
PER_COMMUNICATOR = ("NCCL_PROTO", "NCCL_ALGO")


# What run_sweep and run_confirm return (runner.py): the run folder, its state, launches per status and,
# when complete, what was published (analyse/report.Published).
SweepResult = runner.RunResult


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
    if spec.hosts:  # one torchrun agent per host, through the spec's node_command (measure/hosts.py)
        return hosts.preflight(spec)
    if spec.nnodes > 1 and spec.launch == "torchrun" and not spec.rdzv_endpoint:
        raise CommdiagError(slurm.not_in_allocation_text(spec.nnodes))
    if spec.backend == "nccl":
        from ..environment import gpusigns

        if gpusigns.no_cuda_driver():  # seconds sooner than torch's answer (environment/gpusigns.py)
            gpus = 0
        else:
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
    """The launch order's seed: the spec's, else a fresh one per run (a rerun must not repeat the order
    that may have favoured a config by luck).  Multi-node torchrun runs cannot draw one on each node (every
    node must run the same order), so they need it in the spec (``_check_seed``)."""
    if spec.seed is not None:
        return spec.seed
    _check_seed(spec)
    return random.SystemRandom().randrange(2**31)


def _check_seed(spec: Spec) -> None:
    """Before any launch: a multi-node torchrun spec (a commdiag on every node) names its seed, the same on
    every node and a new one per run; launch: slurm runs one commdiag for all nodes, which draws it."""
    if spec.nnodes > 1 and spec.launch == "torchrun" and not spec.hosts and spec.seed is None:
        from ..errors import SpecError

        fresh = random.SystemRandom().randrange(2**31)
        raise SpecError(spec.path, "seed", f"required when nnodes > 1: every node must run the same launch order, "
                                           "and a seed derived from the spec would repeat it in every rerun; give "
                                           f"the same fresh one on every node, e.g. --set seed={fresh} (drawn now), "
                                           "and a new one for each run")


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
    method["launch"] = (hosts.METHOD_TEXT if spec.hosts else LAUNCH_TEXT[how]) + (f" ({why})" if why else "")
    if spec.model:
        from . import tpstep
        method.update(tpstep.method_text(spec))
        return method
    if spec.reuse_process:
        method["process"] = ("reuse_process: per trial, when all configs (default included) differ only in "
                             f"{'/'.join(PER_COMMUNICATOR)}, they share one torchrun process, each with fresh "
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
            f"{spec.iters}; calibrated in the launch from its fastest warmup call; warmup within a tenth "
            f"of the budget, at most {spec.warmup} calls or one graph replay)")


def _reuse_warning(spec: Spec) -> list[str]:
    if not spec.reuse_process or reuse_shared(spec):
        return []
    return [f"reuse_process: every launch runs in its own process: the configs do not all differ only in "
            f"{'/'.join(PER_COMMUNICATOR)} (default included), and sharing a process among some of them would "
            "make the first run in a process (first communicator, first kernels) theirs, not the shuffle's"]


def new_run(spec: Spec, run_dir: Path, nproc: int) -> dict:
    seed = _seed(spec)
    order = launch_order(spec, seed)
    return {
        **runner.head(results.RUN_FORMAT, results.RUN_FORMAT_VERSION, spec),
        "nproc_per_node": nproc, "world_size": nproc * spec.nnodes, "seed": seed,
        "seed_source": "spec" if spec.seed is not None else "drawn",
        "method": _method(spec),
        "configs": [{"name": c.name, "env": c.env, "overrides": c.overrides, "origin": c.origin} for c in spec.configs],
        "launches": [{"index": l.index, "config": l.config, "trial": l.trial, "stage": 1, "status": results.PENDING}
                     for l in order],
        "fingerprint": {"launcher": metadata.collect_host(), **_nvml_fingerprint(spec)},
        "warnings": list(spec.warnings) + _reuse_warning(spec),
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
    if spec.hosts:
        record["hosts"] = hosts.record(spec)
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
        if spec.hosts and any(l["status"] == results.PENDING for l in run["launches"]):
            # node_command reaches every host, which sees the run folder: one error, not a failed launch each
            checked = hosts.check(spec, run_dir, base_env)
            run.setdefault("launch", _launch_record(spec)).setdefault("hosts", hosts.record(spec))["checked"] = checked

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
        if self.spec.hosts:  # one agent per host through the user's node_command
            outcome = hosts.launch_worker(
                folder, plan, hosts=self.spec.hosts, node_command=self.spec.node_command, base_env=self.base_env,
                config_env=config_env, extra_env=extra_env, nproc=self.run["nproc_per_node"],
                nnodes=self.spec.nnodes, rdzv_endpoint=self.spec.rdzv_endpoint, deadline_s=deadline_s, marker=marker)
            return outcome, marker, "torchrun"
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
            self.on_plan(stages.StagePlan("warning", 0, None, stages.fit([f"commdiag: warning: {warning}"])))

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


def run_sweep(spec: Spec | None = None, *, run_dir: Path | None = None, resume: Path | None = None,
              env: dict[str, str] | None = None,
              on_progress: Callable[[Progress], None] | None = None,
              on_plan: Callable[[stages.StagePlan], None] | None = None,
              confirm: bool = True, certify_sizes: bool = False, explain: bool = False, publish: bool = True,
              sampler: machinestate.Sampler | None = None) -> SweepResult:
    """Run every pending launch of a new run (``spec``) or of an interrupted one (``resume``): stage 1
    (the interleaved trials), then, unless ``confirm`` is False, stage 2 (verdict.py: fresh rounds of
    default and the screening's candidates).  Both stages' launches live in run.json, so Ctrl-C and
    --resume work across them.  ``sampler``: what reads the machine's state around each launch
    (machinestate.py; default NVML for nccl runs, nothing for gloo).  A complete run is then explained
    (``explain``: explain.py) and published (``publish``: verdicts, report.html, profiles; the result's
    ``published``), as ``commdiag sweep`` does."""
    base_env = dict(os.environ if env is None else env)
    if resume is not None:
        run_dir = Path(resume)
        spec = Spec.from_json(results.load_run_json(run_dir)["spec"])
        _check_reuse(spec, base_env)
        preflight(spec)
        new = None
    else:
        assert spec is not None
        _check_reuse(spec, base_env)
        _check_seed(spec)
        if confirm:
            stages.check_confirm_rounds(spec, certify_sizes)
        nproc = preflight(spec)
        if certify_sizes:
            spec, plan = stages.certify_sizes_plan(spec)
            if on_plan:
                on_plan(plan)
        run_dir = Path(run_dir) if run_dir else default_run_dir(spec)

        def new() -> dict:
            run = new_run(spec, run_dir, nproc)
            run["confirm_requested"] = bool(confirm)
            if certify_sizes:
                run["certify_sizes"] = {"trials": spec.trials}
                # its per-size claims are tested on stage 1 itself, every config in every trial
                run["racing"] = {"enabled": False, "looks": [], "note": "off with --certify-sizes"}
            return run
    with runner.opened(run_dir, load=results.load_run_json, save=results.save_run, new=new) as folder:
        _reap_slurm(folder.run)
        res = _run_stages(spec, folder, base_env, on_progress, on_plan, sampler)
    return _publish(res, base_env, explain, publish)


def run_confirm(run_dir: Path, *, rounds: int | None = None, env: dict[str, str] | None = None,
                on_progress: Callable[[Progress], None] | None = None,
                on_plan: Callable[[stages.StagePlan], None] | None = None, publish: bool = True,
                sampler: machinestate.Sampler | None = None) -> SweepResult:
    """``commdiag confirm RUN_DIR [--rounds K]``: run stage 2 on a screened run, finish an interrupted one,
    or extend a confirmed one by K rounds (a further look, at half of what the earlier looks left: certify.py)."""
    base_env = dict(os.environ if env is None else env)
    with runner.opened(run_dir, load=results.load_run_json, save=results.save_run) as folder:
        _reap_slurm(folder.run)
        _confirm_plan(folder, rounds, base_env, on_plan)
        res = _run_stages(Spec.from_json(folder.run["spec"]), folder, base_env, on_progress, on_plan, sampler)
    return _publish(res, base_env, False, publish)


def _reap_slurm(run: dict) -> None:
    """launch: slurm, before a resume reruns a launch: the launches' ranks ran on the allocation's nodes,
    so end what a killed commdiag left there too (runner.opened ended what it left on this node)."""
    record = run.get("launch", {})
    if record.get("method") == "slurm" and slurm.in_allocation():
        alloc = slurm.allocation()
        pending = {l.get("marker") for l in run["launches"] if l.get("status") == results.PENDING}
        for marker in sorted(m for m in pending if m):
            slurm.cancel_step(alloc, marker)
            found = slurm.reap(alloc, min(run["spec"].get("nnodes", 1), len(alloc.nodes)), marker, dict(os.environ))
            if found:
                run.setdefault("warnings", []).append(
                    f"ended {found} process(es) of launch marker {marker[:12]} left on the allocation's nodes")
    if record.get("hosts") and run["spec"].get("hosts"):  # the agents ran on the spec's hosts
        found = hosts.reap_pending(run, dict(os.environ))
        if found:
            run.setdefault("warnings", []).append(f"ended {found} process(es) left on the hosts by an earlier commdiag")


def _publish(res: SweepResult, base_env: dict, explain: bool, publish: bool) -> SweepResult:
    """A complete run's end, as the CLI shows it: explained (with ``explain``), then its verdicts,
    report.html and profiles written (analyse/report.publish); an interrupted run has none of them."""
    if res.state != "complete":
        return res
    if explain:
        from . import explain as explain_mod

        explain_mod.run_explain(res.run_dir, env=base_env)
    if not publish:
        return res
    from ..analyse import report

    return dataclasses.replace(res, published=report.publish(res.run_dir))


def _confirm_plan(folder: runner.Folder, rounds, base_env: dict, on_plan) -> None:
    """Before stage 2's launches: refuse what cannot run, and plan a first or a further look."""
    run_dir, run = folder.path, folder.run
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
        stages.check_further_look(run_dir, plan, rounds)
        kept = [l for l in run["launches"] if l.get("status") in (results.OK, results.TIMEOUT)
                and not (results.launch_dir(run_dir, l["index"]) / "result.json").is_file()]
        if kept:  # samples.csv is rebuilt from the launch folders: extending would lose these launches
            raise CommdiagError(f"{run_dir}: {len(kept)} finished launch(es) have no launches/NNNN/result.json "
                                f"(launch {kept[0]['index']} first): this run folder cannot be extended without "
                                "losing their samples; run the spec afresh instead")
        text = stages.further_look(spec, run, plan, rounds, launcher.utc_now())
        if on_plan:
            on_plan(text)
    elif plan is None:
        run["confirm_rounds_override"] = rounds
    elif rounds is not None:
        raise CommdiagError(f"{run_dir}: stage 2 is unfinished; finish it first (commdiag confirm {run_dir}, without "
                            "--rounds), then extend it")


def _run_stages(spec: Spec, folder: runner.Folder, base_env: dict, on_progress, on_plan,
                sampler: machinestate.Sampler | None = None) -> SweepResult:
    run, run_dir = folder.run, folder.path
    run["state"] = "running"
    folder.save()
    configs = {c["name"]: c for c in run["configs"]}
    run.setdefault("launch", _launch_record(spec))  # a run stored before launch methods: torchrun
    if on_plan and folder.pending():
        on_plan(stages.start_banner(spec, run, run_dir))

    def pending(starter: Starter) -> bool:
        return folder.run_pending(lambda batch: _one_process(spec, folder, batch, configs, base_env, sampler, starter),
                                  keys=LAUNCH_KEYS, on_progress=on_progress,
                                  batches=lambda p: process_batches(p, configs, spec.reuse_process),
                                  after=lambda batch: _race(spec, run, run_dir, on_plan),
                                  eta=lambda left: _eta(spec, run, left))

    with folder.watching(sampler, spec.backend) as sampler:
        starter = Starter(spec, run, run_dir, base_env, on_plan)
        try:
            interrupted = pending(starter)
            if not interrupted and run.get("confirm_requested", True) and run.get("confirmation") is None:
                samples, summary = results.assemble(run_dir, run)  # the tables just built, not read back from disk
                scr, _ = verdict.screening_of(results.RunData(run_dir, run, samples, summary))
                plan = stages.plan_stage2(spec, run, scr, run.pop("confirm_rounds_override", None) or spec.confirm_rounds,
                                          launcher.utc_now())
                folder.save()
                if on_plan:
                    on_plan(plan)
                pending(starter)
        finally:
            starter.close()
    res = folder.finish()
    results.assemble(run_dir, run)
    return res


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


def _race(spec: Spec, run: dict, run_dir: Path, on_plan) -> None:
    """The pending loop's hook after each batch (runner.Folder.run_pending ``after``): race, and say so."""
    drops = race(spec, run, run_dir)
    if drops and on_plan:
        on_plan(stages.StagePlan("racing", 0, None, stages.fit([f"racing: {d['config']} {d['reason']}"
                                                                 for d in drops])))


def _eta(spec: Spec, run: dict, left: list[dict]) -> float | None:
    """The progress line's ETA: this run's measured cost (eta.py: the servers' start left out) for what is left."""
    cost = eta.measured(run)
    return None if cost is None else eta.remaining_s(spec, run, cost, left)


def dry_run(spec: Spec) -> stages.StagePlan:
    """``commdiag sweep SPEC --dry-run``: the plan and its expected time (stages.dry_run), launching nothing."""
    return stages.dry_run(spec, *launch_method(spec))


# What a pending launch keeps when it is reset: its identity and place in the plan.
LAUNCH_KEYS = ("index", "config", "trial", "stage", "round", "marker")



def _check_reuse(spec: Spec, base_env: dict) -> None:
    if spec.reuse_process and spec.backend == "nccl" and "NCCL_DEBUG" in {**base_env, **spec.base_env}:
        raise CommdiagError(f"{spec.path}: reuse_process: true needs NCCL's own log to prove each setting took "
                            "effect, and NCCL_DEBUG is set in your environment or base_env; unset it, or "
                            "set reuse_process: false")


def process_batches(launches: list[dict], configs: dict[str, dict], reuse: bool) -> list[list[dict]]:
    """The launches each torchrun process runs, in launch order: one each (the default), or with
    reuse_process every launch of one trial round, when all its configs, default included, differ only
    in PER_COMMUNICATOR variables (each then gets its own communicators inside the shared process).

    All or none: a round whose configs cannot all share one process runs every launch in its own.
    Batching only some would put a config that sets anything else first in a fresh process every time,
    while default is first only sometimes: a first-run-in-a-process effect (the first communicator and
    kernels) would then be the config's, and a twin was certified in 8.8-63% of simulated runs.  In one
    shared process the round's shuffled order decides who runs first, a fair coin as the test needs."""
    if not reuse:
        return [[l] for l in launches]
    batches: list[list[dict]] = []
    by_trial: dict[int, list[dict]] = {}
    for l in launches:
        if l["trial"] not in by_trial:
            by_trial[l["trial"]] = []
            batches.append(by_trial[l["trial"]])
        by_trial[l["trial"]].append(l)
    out: list[list[dict]] = []
    for batch in batches:
        if len({process_key(configs[l["config"]]["env"]) for l in batch}) == 1:
            out.append(batch)
        else:
            out += [[l] for l in batch]
    return out


def process_key(env: dict) -> tuple:
    """What a shared process fixes: every variable but PER_COMMUNICATOR."""
    return tuple(sorted((k, v) for k, v in env.items() if k not in PER_COMMUNICATOR))


def reuse_shared(spec: Spec) -> bool:
    """Can reuse_process share anything: do all configs, default included, differ only in PER_COMMUNICATOR?"""
    return len({process_key(c.env) for c in spec.configs}) == 1


def _one_process(spec: Spec, run_folder: runner.Folder, batch: list[dict], configs: dict[str, dict],
                 base_env: dict, sampler: machinestate.Sampler, starter: "Starter") -> float:
    """One launch's processes for ``batch`` (one launch, or several with reuse_process); record each,
    with the machine's state around it (the same for every launch of a shared process); the process's
    wall seconds (KeyboardInterrupt: interrupted, its processes ended)."""
    run, run_dir = run_folder.run, run_folder.path
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
        run_folder.mark(batch, marker)

    with sampler.watch(lambda pid: bool(current["marker"]) and launcher.carries_marker(pid, current["marker"])) as watch:
        outcome, marker, method = starter.launch(
            folder, plan, index=first["index"], config_env=process_env, extra_env=debug_env,
            deadline_s=spec.timeout_s * len(batch),
            rdzv_id=f"commdiag-{spec.name}-{run['seed']}-{first['index']}", mark=mark)
    if outcome.interrupted:
        raise KeyboardInterrupt
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
    return outcome.wall_s


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
    names = ["torchrun.log", *sorted(p.name for p in folder.glob("torchrun.node*.log")), serverpool.LOG_NAME]
    for name in names:  # a launch's log under any method (hosts: commdiag's summary, then each agent's)
        log = folder / name
        if log.exists() and log.stat().st_size:
            parts.append(f"--- {name} ---\n{_clip(log.read_text(errors='replace'), TAIL_CHARS // 2, TAIL_CHARS)}")
    return "\n".join(parts)
