"""An ab run folder's run.json: format ``commdiag-ab``, its version, and the one reader and writer.

The reader refuses what is not an ab run of a version this commdiag reads, and checks the parts
the verdicts, the text and report.html index into (docs/formats.md, "commdiag ab").  runner.py
writes the file through ``save`` after every launch; report.py and the CLI read it through ``load``.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..atomic import write_json
from ..errors import CommdiagError, brief

RUN_FORMAT = "commdiag-ab"
RUN_FORMAT_VERSION = 2  # 2: machine_state, launches[].machine (docs/formats.md)
PENDING, OK, FAILED = "pending", "ok", "failed"


def save(run_dir: Path, run: dict) -> None:
    write_json(Path(run_dir) / "run.json", run)


def load(run_dir: str | Path) -> dict:
    from ..formats.results import read_run_file

    path, run = read_run_file(run_dir, RUN_FORMAT, "ab run folder")
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
