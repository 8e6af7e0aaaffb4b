"""``explain``: what NCCL actually chose, per config and size, and which settings changed nothing.

One untimed launch per config with ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING``:
the worker runs a few all-reduces per size and NCCL logs, per call, the
algorithm, protocol and channel range it picked.  Per-call logging distorts
timings, which is why it never runs inside a timed launch.  The result is stored
in run.json under ``explain`` and joined with the timings by the report.

run.json ``explain`` (inside run format 2)::

    {"nccl_version": "2.28.9", "configs": {NAME: {"status": "ok"|..., "error": str|None,
      "sizes": {"14336": {"algo": "Ring", "proto": "LL", "channels": 1, "calls": 3}}}},
     "notes": [{"config": NAME, "variable": "NCCL_PROTO", "text": "..."}]}

Every config also gets ``"overrides"`` (its own settings) and ``"transports"``: the transport NCCL
connected each GPU pair with, from the same log's INIT lines (nccl/transports.py ``summary_json``;
docs/formats.md, "Transports").  The text output shows each config's GPU x GPU matrix and what it
moved against ``default``.

A config whose env sets NCCL_TUNER_PLUGIN also gets ``"tuner"`` (additive, from the same log's INIT
lines; docs/tuner.md 'Proof')::

    {"requested": PATH, "ok": bool, "ranks": [{"pid", "device", "summary", "problems": [str]}],
     "sizes": {"1835008": {"rule": 2, "applied": true} | {"rule": null} | {"rule": "differs", "ranks": {...}}}}
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Callable

from .. import atomic, procs
from . import launcher, runner
from .launcher import Progress
from ..nccl import ncclog, transports, tunerlog
from ..formats import results
from ..errors import CommdiagError
from ..formats.spec import Spec

_CHOICE_VARS = {"NCCL_PROTO": "proto", "NCCL_ALGO": "algo"}


def choices_by_size(log_text: str, sizes: list[int]) -> dict[str, dict]:
    """The most common AllReduce choice per size over one rank's log (all calls agree in practice)."""
    per_pid = ncclog.parse_tuning(log_text)
    out: dict[str, dict] = {}
    if not per_pid:
        return out
    calls = min(per_pid.items())[1]  # one rank is enough: every rank makes the same choice
    for size in sizes:
        mine = [c for c in calls if c.collective.lower() == "allreduce" and c.bytes == size]
        if not mine:
            continue
        (algo, proto, channels), n = Counter((c.algo, c.proto, c.channels) for c in mine).most_common(1)[0]
        out[str(size)] = {"algo": algo, "proto": proto, "channels": channels, "calls": len(mine)}
    return out


def tuner_by_size(log_text: str, sizes: list[int], requested: str | None) -> dict | None:
    """With a tuner plugin asked for: per rank whether it loaded (or NCCL's reason not), and per size
    which rule fired on every rank (``"rule": L``, or None: no rule).  None when none was asked for."""
    if not requested or requested.lower() == "none":
        return None
    found = tunerlog.parse(log_text)
    ranks = []
    for pid, t in sorted(found.items()):
        t.requested = t.requested or requested
        ranks.append({"pid": pid, "device": t.device, "summary": t.summary(), "problems": t.problems()})
    if not ranks:
        ranks.append({"pid": None, "device": None, "summary": "FAILED: no tuner line",
                      "problems": [f"NCCL_TUNER_PLUGIN={requested} but NCCL printed no tuner line"]})
    per_size: dict[str, dict] = {}
    for size in sizes:
        fired = {t.pid: t.rule_by_size().get(size) for t in found.values()}
        lines = {(e.line, e.applied) if e else None for e in fired.values()}
        per_size[str(size)] = ({"rule": None} if lines == {None} else
                               {"rule": next(iter(lines))[0], "applied": next(iter(lines))[1]} if len(lines) == 1 else
                               {"rule": "differs", "ranks": {str(p): (e.line if e else None) for p, e in fired.items()}})
    return {"requested": requested, "ok": all(not r["problems"] for r in ranks), "ranks": ranks, "sizes": per_size}


def _human(size: int) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if size >= div:
            return f"{size / div:.3g} {unit}"
    return f"{size} B"


def notes(configs: list[dict], explained: dict[str, dict]) -> list[dict]:
    """Flag NCCL_PROTO/NCCL_ALGO settings that only restate what NCCL chose by default.

    E.g. "NCCL_PROTO=LL: NCCL already chose LL at every size up to 0.917 MB here,
    so it can only matter above that".
    """
    default = explained.get("default", {}).get("sizes", {})
    out = []
    for c in configs:
        mine = explained.get(c["name"], {}).get("sizes", {})
        for var, field in _CHOICE_VARS.items():
            value = c["overrides"].get(var)
            if value is None or not default:
                continue
            same = sorted(int(s) for s, ch in default.items() if ch[field].lower() == value.lower())
            changed = sorted(int(s) for s in mine if s in default and mine[s][field] != default[s][field])
            if not same:
                text = f"{var}={value}: NCCL chose otherwise at every size by default, so it changes every size"
            elif len(same) == len(default):
                text = f"{var}={value}: NCCL already chose {value} at every size here, so it changes nothing"
            else:
                text = (f"{var}={value}: NCCL already chose {value} at {len(same)} of {len(default)} sizes "
                        f"({_human(same[0])} to {_human(same[-1])}) here, so it can only matter at the others")
            if mine:
                text += f"; with it, NCCL's {field} differed from default at {len(changed)} size(s)"
            out.append({"config": c["name"], "variable": var, "text": text})
    return out


def require_nccl(run_dir, backend: str) -> None:
    """explain reads NCCL's own log: a run of another backend (gloo) never loaded NCCL."""
    if backend != "nccl":
        raise CommdiagError(f"{run_dir}: this run used backend {backend!r}, which never loads NCCL, so NCCL "
                            "settings have no effect in it and there is no choice of NCCL's to explain; "
                            "explain needs a run with backend nccl (a GPU machine)")


def stored(run_dir, run: dict) -> dict:
    """What an earlier explain stored in run.json (``explain --no-run``); one error saying what to run instead."""
    require_nccl(run_dir, (run.get("spec") or {}).get("backend", "nccl"))
    data = run.get("explain")
    if not data:
        raise CommdiagError(f"{run_dir}: run.json has no explain section; run  commdiag explain {run_dir}  "
                            "(on the GPU machine: it launches one untimed run per config)")
    return data


# As root, never passed from a run.json into what explain starts: what the loader and the interpreter
# read at start (a library of the user's, run as root, before any commdiag code).
ROOT_REFUSED_PREFIXES = ("LD_", "PYTHON")


def refuse_start_variables(run_dir, run: dict) -> None:
    """As root, one error for a config of run.json that sets a loader or interpreter variable."""
    import os

    if os.geteuid() != 0:
        return
    for c in run["configs"]:
        bad = sorted(k for k in c["env"] if k.startswith(ROOT_REFUSED_PREFIXES))
        if bad:
            raise CommdiagError(f"{Path(run_dir) / 'run.json'}: config {c['name']!r} sets {', '.join(bad)}; as root, "
                                "explain never starts a launch with a loader or interpreter variable taken from "
                                "a run folder (allowed: NCCL and other settings); run explain as the user who "
                                "made the run")


# What an explain launch keeps when Ctrl-C sends it back to pending (runner.py).
LAUNCH_KEYS = ("index", "config", "marker")


def run_explain(run_dir: str | Path, env: dict[str, str] | None = None,
                on_progress: Callable[[Progress], None] | None = None) -> dict:
    """Run one untimed TUNING launch per config of ``run_dir`` and store the result in run.json.

    A run folder's life as sweep's (runner.py): under the folder's lock (never beside a ``confirm`` or a
    ``--resume`` of the same run), orphans of a killed commdiag ended first, each launch's marker in
    run.json (``explain_launches``) before it starts; Ctrl-C sends the launch in flight back to pending
    and raises KeyboardInterrupt, and the next explain runs only the pending ones."""
    import os

    run_dir = Path(run_dir)
    base_env = dict(os.environ if env is None else env)
    # as root, launches are written only into a run folder no other user can change (as sweep's are)
    with runner.opened(run_dir, load=results.load_run_json, save=results.save_run,
                       inside=("launches", "explain")) as folder:
        run = folder.run
        spec = Spec.from_json(run["spec"])
        require_nccl(run_dir, spec.backend)
        refuse_start_variables(run_dir, run)
        configs = run["configs"]
        launches = run.get("explain_launches")
        if not (isinstance(launches, list) and len(launches) == len(configs)
                and any(l.get("status") == runner.PENDING for l in launches)):
            launches = run["explain_launches"] = [{"index": n, "config": c["name"], "status": runner.PENDING}
                                                  for n, c in enumerate(configs)]
        folder.save()

        def one(batch: list[dict]) -> float:
            launch = batch[0]
            entry, wall = _one_launch(folder, spec, base_env, launch, configs[launch["index"]])
            launch.update(status=entry["status"], wall_s=round(wall, 3), entry=entry)
            return wall

        if folder.run_pending(one, keys=LAUNCH_KEYS, launches=launches, on_progress=on_progress):
            raise KeyboardInterrupt  # saved: the launch in flight is pending, the next explain runs it
        explained = {l["config"]: l.pop("entry") for l in launches}  # kept once, in run.json's explain
        version = next((l["nccl_version"] for l in launches if l.get("nccl_version")), None)
        run["explain"] = {"nccl_version": version, "created_utc": dt.datetime.now(dt.timezone.utc).isoformat(),
                          "configs": explained, "notes": notes(configs, explained)}
        folder.save()
        return run["explain"]


def _one_launch(folder: runner.Folder, spec: Spec, base_env: dict, launch: dict, config: dict) -> tuple[dict, float]:
    """One config's TUNING launch into ``explain/NNNN/``: what NCCL chose, and the launch's wall seconds."""
    n, run = launch["index"], folder.run
    sizes = [s.bytes for s in spec.sizes]
    out = folder.path / "explain" / f"{n:04d}"
    atomic.remove_tree(out)  # the one writer: a link planted there is removed, never followed
    atomic.make_dirs(out)
    debug = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING",
             "NCCL_DEBUG_FILE": str(out.resolve() / "nccl.%h.%p.log")}
    plan = {"backend": "nccl", "dtype": spec.dtype, "sizes": sizes, "modes": ["eager"], "warmup": 0, "iters": 0,
            "batch": 1, "vias": ["torch"], "explain": True, "watch_env": sorted(config["env"]),
            "out_dir": str(out.resolve()), "config": config["name"], "nccl_debug_file": None}
    marker = procs.new_marker()
    folder.mark([launch], marker)  # in run.json before anything starts: a later command reaps what it leaves
    outcome, _ = launcher.launch_worker(
        out, plan, base_env=base_env, config_env=config["env"], extra_env=debug,
        nproc=run["nproc_per_node"], nnodes=spec.nnodes, rdzv_endpoint=spec.rdzv_endpoint,
        rdzv_id=f"commdiag-explain-{spec.name}-{run['seed']}-{n}", deadline_s=spec.timeout_s, marker=marker)
    if outcome.interrupted:
        raise KeyboardInterrupt
    text = "\n".join(p.read_text(errors="replace") for p in sorted(out.glob("nccl.*.log")))
    entry = {"status": "ok", "error": None, "sizes": choices_by_size(text, sizes)}
    launch["nccl_version"] = next((p.version for p in ncclog.parse(text).values() if p.version), None)
    if outcome.timed_out or outcome.exit_code != 0:
        entry["status"] = "timeout" if outcome.timed_out else "failed"
        entry["error"] = (out / "torchrun.log").read_text(errors="replace")[-2000:]
    elif not entry["sizes"]:
        entry["status"] = "no-tuning-lines"
        entry["error"] = "NCCL printed no TUNING lines (NCCL older than 2.24 may print none): choices unknown"
    entry["overrides"] = dict(config.get("overrides") or {})
    entry["transports"] = transports.summary_json(transports.parse(text).values())
    tuner = tuner_by_size(text, sizes, {**base_env, **config["env"]}.get("NCCL_TUNER_PLUGIN"))
    if tuner is not None:
        entry["tuner"] = tuner
    return entry, outcome.wall_s


def render(explain: dict, sizes: list[dict]) -> str:
    """Text table: per size, each config's algo/proto/channels."""
    configs = explain["configs"]
    lines = [f"NCCL {explain.get('nccl_version') or '?'}: what NCCL chose per all-reduce (algo/proto/channels)"]
    lines += _tuner_failures(configs)
    names = list(configs)
    w = 30 if any("tuner" in c for c in configs.values()) else 24
    lines.append(f"{'size(B)':>12} {'tokens':>6}  " + "  ".join(f"{n[:w]:<{w}}" for n in names))
    for s in sizes:
        cells = []
        for n in names:
            ch = configs[n]["sizes"].get(str(s["bytes"]))
            cells.append((f"{ch['algo']}/{ch['proto']}/{ch['channels'] if ch['channels'] is not None else '?'}"
                          if ch else configs[n]["status"]) + _rule_cell(configs[n].get("tuner"), s["bytes"]))
        tok = "" if s.get("tokens") is None else str(s["tokens"])
        lines.append(f"{s['bytes']:>12} {tok:>6}  " + "  ".join(f"{c[:w]:<{w}}" for c in cells))
    for n in names:
        t = configs[n].get("tuner")
        if t and t["ok"]:
            lines.append(f"tuner [{n}], {len(t['ranks'])} rank(s): {t['ranks'][0]['summary']}")
    for note in explain.get("notes", []):
        lines.append(f"note [{note['config']}]: {note['text']}")
    matrices = transports.render_configs(configs)
    if matrices:
        lines += ["", *matrices]
    return "\n".join(lines)


def _rule_cell(tuner: dict | None, size: int) -> str:
    """" rule 2" / " no rule" beside NCCL's choice, for a config whose tuner plugin loaded."""
    if not tuner or not tuner["ok"]:
        return ""
    hit = tuner["sizes"].get(str(size))
    if not hit or hit["rule"] is None:
        return " no rule"
    if hit["rule"] == "differs":
        return " rule differs by rank"
    return f" rule {hit['rule']}" + ("" if hit.get("applied", True) else " refused")


def _tuner_failures(configs: dict) -> list[str]:
    """Prominent lines, before the table, for configs whose tuner plugin did not load on every rank."""
    out = []
    for name, c in configs.items():
        t = c.get("tuner")
        if t and not t["ok"]:
            problems = [p for r in t["ranks"] for p in r["problems"]]
            out.append(f"TUNER PLUGIN NOT PROVEN [{name}]: {problems[0]}"
                       + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
            out.append(f"  so [{name}] below is NCCL's own choice, not the rules'")
    return out
