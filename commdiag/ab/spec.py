"""The ab spec: the user's benchmark command, its metrics, the arms (environments), rounds, a server.

Validated like a sweep spec, before any launch: every problem is one ``SpecError`` naming the file,
the field and what is allowed; ``--set`` works the same way.  ``default`` (nothing added) is always
an arm.  A plan that cannot certify anything (too few rounds for the exact paired test to reach its
threshold) is refused here, with the rounds it needs, before a launch is spent.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import readfile
from ..analyse import paired, stats
from ..errors import SpecError, brief
from ..formats import spec as sweepspec
from ..formats.spec import Config, DEFAULT_CONFIG, NAME_RE
from . import presets

_KEYS: dict[str, tuple[tuple[type, ...], Any]] = {
    "name": ((str,), None),
    "description": ((str,), ""),
    "command": ((list,), None),
    "metrics": ((list,), None),
    "configs": ((dict, type(None)), None),
    "base_env": ((dict, type(None)), None),
    "rounds": ((int, str), "auto"),
    "min_effect": ((int, float), stats.MIN_EFFECT),
    "timeout_s": ((int, float), 900),
    "seed": ((int, type(None)), None),
    "server": ((dict, type(None)), None),
    "allow_large": ((bool,), False),
}
SERVER_KEYS = ("command", "ready_url", "ready_log", "ready_timeout_s", "warmup_runs", "stop_timeout_s",
               "require_nccl_proof")
METRIC_KEYS = ("name", "file", "field", "regex", "better", "preset")
BETTER = ("higher", "lower")
MAX_ROUNDS = 200  # without allow_large
MAX_METRICS = 32
MAX_ARGS = 4096
PLACEHOLDERS = ("launch_dir", "port", "python")
AUTO_EXTRA_ROUNDS = 2  # rounds: auto = the fewest that can certify, plus these (some power)


@dataclass(frozen=True)
class Metric:
    name: str
    better: str
    file: str | None = None
    field: str | None = None
    regex: str | None = None
    preset: str | None = None
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class Server:
    command: tuple[str, ...]
    ready_url: str | None = None
    ready_log: str | None = None
    ready_timeout_s: float = 600.0
    warmup_runs: int = 0
    stop_timeout_s: float = 30.0
    require_nccl_proof: bool = False


@dataclass(frozen=True)
class AbSpec:
    path: str
    name: str
    description: str
    command: tuple[str, ...]
    metrics: tuple[Metric, ...]
    configs: tuple[Config, ...]
    rounds: int
    min_effect: float
    timeout_s: float
    seed: int | None
    server: Server | None
    raw: dict = field(repr=False, default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def trials(self) -> int:  # formats.spec.launch_order's name for rounds
        return self.rounds

    @property
    def claims(self) -> int:
        """Metrics x arms other than default: the family Holm's 1% is spread over."""
        return len(self.metrics) * (len(self.configs) - 1)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("raw")
        return d

    @classmethod
    def from_json(cls, d: dict) -> "AbSpec":
        d = dict(d)
        d["command"] = tuple(d["command"])
        d["metrics"] = tuple(Metric(**{**m, "aliases": tuple(m.get("aliases", ()))}) for m in d["metrics"])
        d["configs"] = tuple(Config(**c) for c in d["configs"])
        d["server"] = Server(**{**d["server"], "command": tuple(d["server"]["command"])}) if d.get("server") else None
        d["warnings"] = tuple(d.get("warnings", ()))
        return cls(**d)


def rounds_needed(claims: int) -> int:
    """The fewest rounds at which the exact paired test can reach its Holm floor (ALPHA / claims)."""
    return paired.rounds_to_reach(stats.ALPHA / max(claims, 1), stats.TWO_SIDED)


def load(path: str | Path, overrides=()) -> AbSpec:
    path = Path(path)
    try:
        text = readfile.read_text(path, sweepspec.SPEC_LIMIT, what="spec")
    except OSError as e:
        raise SpecError(path, "(file)", f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SpecError(path, "(file)", f"not UTF-8 text (byte {e.start} cannot be decoded)") from None
    raw = sweepspec.parse_yaml(text, path)
    if not isinstance(raw, dict):
        raise SpecError(path, "(top level)", "must be a mapping of keys (name, command, metrics, ...)")
    set_keys = {}
    for item in overrides:
        sweepspec.apply_override(raw, item, path, keys=_KEYS)
        set_keys[item.partition("=")[0].split(".")[0]] = item
    try:
        return resolve(raw, path)
    except SpecError as e:
        top = e.field.split(".")[0].split("[")[0]
        if top in set_keys:
            raise SpecError(f"{path} (with --set {set_keys[top]})", e.field, e.problem) from None
        raise


def _check_program(path, fld: str, argv: tuple[str, ...]) -> None:
    """The program a command starts must exist before a run folder is made for it: a typo'd or missing
    benchmark otherwise fails every launch of every round.  Found the way the launch finds it (this
    PATH; ``{python}`` is commdiag's interpreter); a relative path is left to the launch's folder."""
    prog = argv[0]
    if "{" in prog:
        return
    if os.sep in prog:
        if os.path.isabs(prog) and not (os.path.isfile(prog) and os.access(prog, os.X_OK)):
            raise SpecError(path, f"{fld}[0]", f"{brief(prog)}: no such executable file")
    elif shutil.which(prog) is None:
        raise SpecError(path, f"{fld}[0]", f"{brief(prog)}: no such program on PATH (install it, or give "
                                           "its full path; {python} is commdiag's own interpreter)")


def _argv(path, fld: str, value) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        example = "python, -m, sglang.launch_server" if fld.startswith("server") else "python, -m, sglang.bench_serving"
        raise SpecError(path, fld, f"must be a non-empty list of arguments, e.g. [{example}, ...]")
    if len(value) > MAX_ARGS:
        raise SpecError(path, fld, f"{len(value)} arguments, more than {MAX_ARGS}")
    out = []
    for i, a in enumerate(value):
        if isinstance(a, bool) or not isinstance(a, (str, int, float)):
            raise SpecError(path, f"{fld}[{i}]", f"{brief(a)} must be a string (quote numbers like \"200\")")
        a = str(a)
        if "\x00" in a:
            raise SpecError(path, f"{fld}[{i}]", "contains a NUL byte")
        out.append(a)
    return tuple(out)


def _positive(path, fld, value, unit, limit) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise SpecError(path, fld, f"{brief(value)} must be a finite number > 0 {unit}")
    if value > limit:
        raise SpecError(path, fld, f"{value:g} {unit} is more than the limit of {limit:g}")
    return float(value)


def _metric(path, i: int, m) -> Metric:
    fld = f"metrics[{i}]"
    if not isinstance(m, dict):
        raise SpecError(path, fld, "must be a mapping: {name, file + field | regex, better} or {preset, field}")
    for k in m:
        if k not in METRIC_KEYS:
            raise SpecError(path, f"{fld}.{sweepspec._fld(k)}", f"unknown key (allowed: {', '.join(METRIC_KEYS)})")
    for k in ("name", "file", "field", "regex", "better", "preset"):
        if k in m and not isinstance(m[k], str):
            raise SpecError(path, f"{fld}.{k}", f"{brief(m[k])} must be a string")
    preset, fname, regex = m.get("preset"), m.get("field"), m.get("regex")
    aliases: tuple[str, ...] = ()
    better = m.get("better")
    file = m.get("file")
    if preset is not None:
        if preset not in presets.PRESETS:
            raise SpecError(path, f"{fld}.preset", f"{brief(preset)} is not one of {', '.join(presets.PRESETS)}")
        known = presets.PRESETS[preset]["fields"]
        if fname not in known:
            raise SpecError(path, f"{fld}.field", f"{brief(fname)} is not a field of {preset} "
                                                  f"(allowed: {', '.join(known)})")
        aliases = known[fname].aliases
        better = better or known[fname].better
        file = file or presets.PRESETS[preset]["file"]
    if regex is not None and (file is not None or fname is not None):
        raise SpecError(path, fld, "give either regex (read from stdout) or file with field, not both")
    if regex is None and (file is None or not fname):
        raise SpecError(path, fld, "needs file and field (a JSON result file), regex (on stdout), or preset and field")
    if regex is not None:
        try:
            rx = re.compile(regex)
        except re.error as e:
            raise SpecError(path, f"{fld}.regex", f"not a valid regular expression: {e}") from None
        if rx.groups == 0:
            raise SpecError(path, f"{fld}.regex", "needs a group around the number, e.g. (?P<value>[0-9.]+)")
    if better not in BETTER:
        raise SpecError(path, f"{fld}.better", f"{brief(better)} is not one of {', '.join(BETTER)}")
    name = m.get("name") or fname
    if not name or not NAME_RE.fullmatch(name):
        raise SpecError(path, f"{fld}.name", f"{brief(name)}: 1-64 characters from A-Z a-z 0-9 _ . + -")
    return Metric(name=name, better=better, file=file, field=fname, regex=regex, preset=preset, aliases=aliases)


def _server(path, s: dict) -> Server:
    for k in s:
        if k not in SERVER_KEYS:
            raise SpecError(path, f"server.{sweepspec._fld(k)}", f"unknown key (allowed: {', '.join(SERVER_KEYS)})")
    cmd = _argv(path, "server.command", s.get("command"))
    url, log = s.get("ready_url"), s.get("ready_log")
    if url is None and log is None:
        raise SpecError(path, "server", "needs ready_url (an HTTP URL that answers 200 when ready) or ready_log "
                                        "(a regex on the server's output)")
    if url is not None and (not isinstance(url, str) or not re.match(r"https?://", url)):
        raise SpecError(path, "server.ready_url", f"{brief(url)} must be an http:// or https:// URL")
    if log is not None:
        if not isinstance(log, str):
            raise SpecError(path, "server.ready_log", f"{brief(log)} must be a regular expression")
        try:
            re.compile(log)
        except re.error as e:
            raise SpecError(path, "server.ready_log", f"not a valid regular expression: {e}") from None
    warm = s.get("warmup_runs", 0)
    if isinstance(warm, bool) or not isinstance(warm, int) or not 0 <= warm <= 100:
        raise SpecError(path, "server.warmup_runs", f"{brief(warm)} must be an integer 0..100")
    proof = s.get("require_nccl_proof", False)
    if not isinstance(proof, bool):
        raise SpecError(path, "server.require_nccl_proof", f"{brief(proof)} must be true or false")
    return Server(command=cmd, ready_url=url, ready_log=log,
                  ready_timeout_s=_positive(path, "server.ready_timeout_s", s.get("ready_timeout_s", 600), "seconds",
                                            24 * 3600),
                  warmup_runs=warm,
                  stop_timeout_s=_positive(path, "server.stop_timeout_s", s.get("stop_timeout_s", 30), "seconds", 3600),
                  require_nccl_proof=proof)


def resolve(raw: dict, path: Path | str = "<spec>") -> AbSpec:
    warnings: list[str] = []
    for key, value in raw.items():
        if key not in _KEYS:
            raise SpecError(path, sweepspec._fld(key), f"unknown key{sweepspec.did_you_mean(key, _KEYS)} "
                                                       f"(allowed: {', '.join(_KEYS)})")
        types, _ = _KEYS[key]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise SpecError(path, key, f"{brief(value)} must be {sweepspec._type_name(types)}")
    get = lambda k: raw.get(k, _KEYS[k][1])  # noqa: E731
    name = get("name")
    if not name or not NAME_RE.fullmatch(name) or name in (".", ".."):
        raise SpecError(path, "name", f"{brief(name)}: required, 1-64 characters from A-Z a-z 0-9 _ . + - "
                                      "(it becomes part of the run folder's name)")
    command = _argv(path, "command", get("command"))
    metrics_raw = get("metrics")
    if not metrics_raw:
        raise SpecError(path, "metrics", "required: at least one {name, file + field | regex, better}")
    if len(metrics_raw) > MAX_METRICS:
        raise SpecError(path, "metrics", f"{len(metrics_raw)} metrics, more than {MAX_METRICS}")
    metrics = tuple(_metric(path, i, m) for i, m in enumerate(metrics_raw))
    seen = set()
    for i, m in enumerate(metrics):
        if m.name in seen:
            raise SpecError(path, f"metrics[{i}].name", f"{m.name} is given twice; give each metric its own name")
        seen.add(m.name)
    base_env = sweepspec._env_map(path, "base_env", get("base_env"), warnings)
    large = bool(get("allow_large"))
    configs = sweepspec._resolve_configs(path, {"configs": get("configs")}, base_env, warnings, large)
    if len(configs) < 2:
        raise SpecError(path, "configs", "required: at least one arm besides default, e.g. seed: {NCCL_PROTO: LL}")
    min_effect = get("min_effect")
    if isinstance(min_effect, bool) or not isinstance(min_effect, (int, float)) or not 0 < min_effect < 0.5:
        raise SpecError(path, "min_effect", f"{brief(min_effect)} must be a fraction between 0 and 0.5 (0.03 = 3%)")
    spec_claims = len(metrics) * (len(configs) - 1)
    need = rounds_needed(spec_claims)
    rounds = get("rounds")
    if rounds == "auto":
        rounds = need + AUTO_EXTRA_ROUNDS
    elif isinstance(rounds, str) or isinstance(rounds, bool):
        raise SpecError(path, "rounds", f"{brief(rounds)} must be auto or an integer")
    else:
        limit = 10 ** 5 if large else MAX_ROUNDS
        if not 1 <= rounds <= limit:
            raise SpecError(path, "rounds", f"{rounds} must be auto or 1..{limit}" + ("" if large else
                                                                               " (allow_large: true lifts it)"))
        if rounds < need:
            raise SpecError(path, "rounds", f"{rounds} rounds cannot certify anything: {spec_claims} claim(s) "
                                            f"(metrics x arms) share 1% family-wise, and the exact paired test "
                                            f"needs at least {need} rounds to reach p <= {stats.ALPHA / spec_claims:.2g}; "
                                            f"use rounds: {need} or more (or auto)")
    timeout = _positive(path, "timeout_s", get("timeout_s"), "seconds", sweepspec.LIMITS["timeout_s"])
    seed = get("seed")
    if seed is not None and (isinstance(seed, bool) or not 0 <= seed < 2 ** 63):
        raise SpecError(path, "seed", f"{brief(seed)} must be an integer 0..2^63-1 or null")
    server = _server(path, get("server")) if get("server") else None
    if server and server.require_nccl_proof:
        for c in configs:
            if "NCCL_DEBUG" in c.env or "NCCL_DEBUG_SUBSYS" in c.env:
                raise SpecError(path, f"configs.{c.name}", "sets NCCL_DEBUG/NCCL_DEBUG_SUBSYS, which "
                                "require_nccl_proof sets itself (INFO, INIT,ENV); leave them out")
    description = str(get("description") or "")[:10_000]
    _check_program(path, "command", command)
    if server is not None:
        _check_program(path, "server.command", server.command)
    return AbSpec(path=str(path), name=name, description=description, command=command, metrics=metrics,
                  configs=configs, rounds=int(rounds), min_effect=float(min_effect), timeout_s=timeout,
                  seed=seed, server=server, raw=raw, warnings=tuple(warnings))


def quick(command: list[str], configs: dict[str, str], metrics: list[str], rounds: str | None,
          min_effect: float | None) -> AbSpec:
    """The one-line form: ``--config NAME=PROFILE.env`` (a profile or KEY=VALUE lines),
    ``--metric NAME:higher|lower:REGEX`` (stdout) or ``--metric PRESET:FIELD``, ``-- CMD ARGS``."""
    from ..formats import profile

    raw: dict = {"name": "ab", "command": list(command), "configs": {}, "metrics": []}
    for item in configs:
        cname, sep, file = item.partition("=")
        if not sep or not cname or not file:
            raise SpecError("--config", item, "expected NAME=PROFILE_FILE (e.g. seed=reports/<run>/profile.env)")
        settings = dict(profile.load(file).settings)
        if os.geteuid() == 0:  # as root, a profile's names and files pass install-hook's rule (install/allowlist.py)
            from ..install import allowlist

            allowlist.check(settings, system_wide=False, origin=f"ab --config {cname}={file}")
        raw["configs"][cname] = settings
    for item in metrics:
        parts = item.split(":", 2)
        if len(parts) == 2 and parts[0] in presets.PRESETS:
            raw["metrics"].append({"preset": parts[0], "field": parts[1]})
        elif len(parts) == 3:
            raw["metrics"].append({"name": parts[0], "better": parts[1], "regex": parts[2]})
        else:
            raise SpecError("--metric", item, f"expected NAME:higher|lower:REGEX or PRESET:FIELD "
                                              f"(presets: {', '.join(presets.PRESETS)})")
    if rounds is not None:
        raw["rounds"] = int(rounds) if str(rounds).isdigit() else rounds
    if min_effect is not None:
        raw["min_effect"] = min_effect
    return resolve(raw, "command line")
