"""A run folder's life, written once: sweep, step, confirm, ab and explain only plug in their launch.

Every command that measures into a run folder lives the same life:

1. ``opened(run_dir, ...)``: a new folder (refused when it already holds a run, checked again under
   the lock: two commands may race for one ``--out``) or an existing one, held under its lock
   (runlock.hold: one commdiag per folder) for the whole ``with`` block; an existing one has what a
   killed commdiag left running ended first, by the launch markers run.json records
   (runlock.reap_orphans), and a warning says so.
2. ``Folder.watching(sampler, backend)``: the machine's state around every launch (machinestate.py);
   run.json's ``machine_state`` says once what is read, or why nothing is.
3. ``Folder.run_pending(one, ...)``: every pending launch in order.  ``one(batch)`` is the kind's only
   part: it records the launch's marker in run.json before any process starts (``Folder.mark``),
   starts and waits for its processes, and records the outcome into the launch dicts; it returns the
   batch's wall seconds, or raises KeyboardInterrupt once its processes are ended.  After each batch
   run.json is saved atomically and a Progress (with the ETA from this run's own launches) is
   reported.  On Ctrl-C the batch in flight goes back to pending (what it started, found by marker,
   is killed) and the run is resumable.
4. ``Folder.finish()``: state ``complete`` or ``interrupted``, run.json saved, a RunResult.

What differs by kind is passed in: how run.json is loaded and saved (``commdiag-run`` or
``commdiag-ab``), the keys a pending launch keeps, and the launches list (``explain`` keeps its own
under ``explain_launches``).  Writes: ``RUN_DIR/run.json`` (through the kind's ``save``) and the
lock (runlock.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from .. import __version__, atomic, procs
from ..errors import CommdiagError
from ..formats.results import DROPPED, OK, PENDING  # the launch statuses every kind shares (ab/runfile.py: the same)
from . import launcher, machinestate, runlock
from .launcher import Progress


@dataclass(frozen=True)
class RunResult:
    """What a command that measured into a run folder returns: the folder, complete or interrupted, the
    launches per status, and (when complete) what the kind published from it (sweep: verdicts,
    report.html and profiles, analyse/report.Published; ab: its analysis and report.html)."""

    run_dir: Path
    state: str  # complete | interrupted
    counts: dict[str, int]
    warnings: tuple[str, ...] = field(default=())
    published: Any = None

    @property
    def all_ok(self) -> bool:
        return self.state == "complete" and set(self.counts) <= {OK, DROPPED}


def head(fmt: str, version: int, spec) -> dict:
    """The keys every kind's run.json starts with: its format and version, who wrote it and when, its
    state, and the spec as given and resolved (``spec``: a formats/spec.Spec or an ab/spec.AbSpec)."""
    return {"format": fmt, "version": version, "commdiag_version": __version__, "created_utc": launcher.utc_now(),
            "finished_utc": None, "state": "running",
            "spec_file": spec.path, "spec_given": spec.raw, "spec": spec.to_json()}


def refuse_existing(run_dir: Path) -> None:
    if (run_dir / "run.json").exists():
        raise CommdiagError(f"{run_dir}: already holds a run; use --resume {run_dir} or another --out")


def reap(run: dict, run_dir: Path) -> None:
    """Before a resume reruns a launch: end what a killed commdiag left running (by launch marker)."""
    ended = runlock.reap_orphans(run)
    if ended:
        run.setdefault("warnings", []).append(
            f"ended {len(ended)} process(es) left running by an earlier commdiag in {run_dir} (pids "
            f"{', '.join(map(str, ended))})")


@contextlib.contextmanager
def opened(run_dir: str | Path, *, load: Callable[[Path], dict], save: Callable[[Path, dict], None],
           new: Callable[[], dict] | None = None, inside: tuple[str, ...] = ("launches",)) -> Iterator["Folder"]:
    """The run folder held under its lock for the ``with`` block.  ``new``: make the run's dict for a
    new folder (refused when the folder holds a run); else ``load`` it (again under the lock: what the
    last holder left) and end the orphans of its launches.  Nothing is saved here: a kind may still
    refuse the run (its checks raise) and leave run.json as it was.  ``inside``: the folders below it
    the kind writes, which as root no other user may be able to change (runlock.check_folder)."""
    run_dir = Path(run_dir)
    if new is not None:
        refuse_existing(run_dir)
    runlock.check_folder(run_dir, inside)  # before anything is made: no folder left behind a user's link
    if new is not None:
        atomic.make_dirs(run_dir)  # the one writer: never through a link
    with runlock.hold(run_dir):
        if new is not None:
            refuse_existing(run_dir)  # checked again under the lock: two commands may race for one --out
            run = new()
        else:
            run = load(run_dir)
            reap(run, run_dir)
        yield Folder(run_dir, run, save)


class Folder:
    """One run folder held under its lock: its run.json dict, saved through the kind's writer."""

    def __init__(self, path: Path, run: dict, save: Callable[[Path, dict], None]):
        self.path, self.run, self._save = path, run, save
        self.interrupted = False

    def save(self) -> None:
        self._save(self.path, self.run)

    def mark(self, batch: list[dict], marker: str) -> None:
        """Record ``marker`` (the COMMDIAG_LAUNCH_ID its processes will carry) in every launch of
        ``batch`` and save, before anything starts: a resume after kill -9 finds what it left running."""
        for launch in batch:
            launch["marker"] = marker
        self.save()

    @contextlib.contextmanager
    def watching(self, sampler: machinestate.Sampler | None, backend: str) -> Iterator[machinestate.Sampler]:
        """The machine's state sampler for the launches (``sampler``, or the run's own for ``backend``,
        closed afterwards); run.json's ``machine_state`` before and after (it says so when NVML stopped
        answering mid-run)."""
        own = sampler is None
        sampler = sampler or machinestate.open_sampler(backend)
        try:
            self.run["machine_state"] = sampler.describe()  # once per run: what is read, or why nothing is
            yield sampler
            self.run["machine_state"] = sampler.describe()
        finally:
            if own:
                try:
                    sampler.close()  # waits for a reading thread still inside NVML (at most a few seconds)
                except KeyboardInterrupt:  # a second Ctrl-C meanwhile: the run is still saved, resumable
                    self.interrupted = True

    def pending(self, launches: list[dict] | None = None) -> list[dict]:
        return [l for l in (self.run["launches"] if launches is None else launches) if l["status"] == PENDING]

    def run_pending(self, one: Callable[[list[dict]], float], *, keys: tuple[str, ...],
                    batches: Callable[[list[dict]], list[list[dict]]] = lambda p: [[l] for l in p],
                    on_progress: Callable[[Progress], None] | None = None,
                    launches: list[dict] | None = None,
                    after: Callable[[list[dict]], None] | None = None,
                    eta: Callable[[list[dict]], float | None] | None = None,
                    stop: Callable[[list[dict]], str | None] | None = None) -> bool:
        """Run every pending launch of ``launches`` (default run.json's) in order, ``batches`` of them per
        ``one`` call; True when interrupted (the batch in flight is pending again, keeping only ``keys``).
        ``after(batch)``: the kind's look after each batch; it may settle pending launches (sweep's racing
        drops them), which are then skipped.  ``eta(left)``: the seconds the pending launches ``left`` take
        (default: their count x this call's wall per launch, the servers' one-time start left out:
        ``per_launch``).  ``stop(pending)``: after each batch, a reason to stop here (run.json
        ``stopped``, state ``stopped``: ab's first round that failed the same way for every arm), or None
        to go on."""
        procs.take_back_sigint()  # resumable after Ctrl-C, however the command was started
        import pandas  # noqa: F401  (see below)

        # The tables library before the first launch, not lazily inside the loop: the hooks and the end
        # (racing's screening, results.assemble) import pandas and numpy, and a Ctrl-C landing inside
        # that first import leaves numpy half-initialised in sys.modules.  The loop takes the Ctrl-C and
        # finishes the run, and the run's end then failed with "module 'numpy' has no attribute 'matrix'"
        # instead of saving an interrupted, resumable run (CI, tests/test_sweep.py's interrupt test).
        pending = self.pending(launches)
        walls: list[float] = []
        done = 0
        for batch in batches(pending):
            batch = [l for l in batch if l["status"] == PENDING]  # ``after`` may have settled them
            if not batch:
                continue
            try:
                wall = one(batch)
            except KeyboardInterrupt:  # the kind ended its processes; its launches have no result
                for launch in batch:
                    if launch.get("marker"):  # whatever it had started ends with it (Ctrl-C mid-start)
                        procs.kill_marked(launch["marker"])
                    for key in list(launch):
                        if key not in keys:
                            launch.pop(key)
                    launch["status"] = PENDING
                self.save()
                self.interrupted = True
                return True
            try:
                walls.append(wall / len(batch))
                if after:
                    after(batch)
                self.save()
                rest = [l for l in pending if l["status"] == PENDING]
                for i, launch in enumerate(batch):
                    done += 1
                    if on_progress:
                        left = len(rest) + len(batch) - 1 - i
                        est = eta(rest) if eta else left * per_launch(walls, batch)
                        on_progress(Progress(done, done + left, launch, est))
                why = stop(pending) if stop else None
                if why:
                    self.run["stopped"] = why
                    self.save()
                    return False
            except KeyboardInterrupt:  # between launches (saving, printing): the finished batch stands
                self.save()
                self.interrupted = True
                return True
        return False

    def finish(self) -> RunResult:
        """The run's end: complete, or interrupted (resumable); saved; what the kind returns."""
        run = self.run
        run["state"] = "interrupted" if self.interrupted else "stopped" if run.get("stopped") else "complete"
        run["finished_utc"] = None if self.interrupted else launcher.utc_now()
        self.save()
        return RunResult(self.path, run["state"], counts(run["launches"]), tuple(run.get("warnings", ())))


def counts(launches: list[dict]) -> dict[str, int]:
    """Launches per status."""
    out: dict[str, int] = {}
    for l in launches:
        out[l["status"]] = out.get(l["status"], 0) + 1
    return out


def per_launch(walls: list[float], batch: list[dict]) -> float:
    """Seconds a launch still to come will take, for the ETA.  The first launch of a call carries the
    launch servers' one-time start (seconds; a CPU launch after it is under one): it is left out once a
    second launch is in, and before that only its own measuring counts (``measure_s``)."""
    if len(walls) > 1:
        return sum(walls[1:]) / (len(walls) - 1)
    measured = [l.get("measure_s") for l in batch if l.get("launched_by") == "forkserver" and l.get("measure_s")]
    return sum(measured) / len(measured) if measured else walls[0]
