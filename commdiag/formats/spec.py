"""The sweep spec: load a YAML file, validate every field, resolve it into configs and sizes.

Validation happens before any launch.  Every problem is a ``SpecError`` naming the
file, the field path (``configs.seed.NCCL_PROTO``) and what is allowed.  The
resolved ``Spec`` is what the launcher runs and what ``run.json`` stores beside
the spec as given, so a run folder always says exactly what was measured.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .. import readfile
from ..nccl import ncclvars
from ..measure.collectives import DTYPE_BYTES
from ..errors import SpecError, brief, terminal_safe

BACKENDS = ("nccl", "gloo")
MODES = ("graph", "eager")
# How the all-reduce is called: torch.distributed, or libnccl directly through ctypes
# (what inference servers' own "pynccl" wrappers do).  Not named "backend": that key is
# the process group's backend (nccl or gloo).
VIAS = ("torch", "nccl-direct")
# commdiag step (stepspec.py): the synthetic TP layer's step, the same step with its all-reduces
# removed (compute only) and with its compute removed (the all-reduces only).
STEP_VIAS = ("step", "step-compute", "step-comm")
REPLAY_STREAMS = ("side", "default")
# How each launch's processes start (docs/launch-methods.md): a fork of a per-rank launch server
# that imported torch once, or a fresh torchrun.  The default, per backend, is this one table.
# ``slurm``: each launch is one srun job step over the allocation's nodes (measure/slurm.py); the
# default when nnodes > 1 (docs/multinode.md).
LAUNCH_METHODS = ("forkserver", "torchrun", "slurm")
# nccl too since 2026-12-04: proof 1 (NCCL's own ENV/INIT lines), the import-time proof on CUDA torch and
# proof 2 on two NCCL ranks of one GPU (benchmarks/README.md) passed; the 2-GPU form of proof 2 is still
# to run (docs/launch-methods.md, "Which is the default").
DEFAULT_LAUNCH = {"gloo": "forkserver", "nccl": "forkserver"}
DEFAULT_CONFIG = "default"
# Size bands for verdicts (tokens, inclusive); null = unbounded.  Decode steps and
# speculative verify steps send 1..64 tokens, prefill chunks 256 and more.
DEFAULT_BANDS = {"decode": [1, 64], "prefill": [256, None]}
# Names that reach file names and file content (run folder, profile-<band>.env, profile
# comments): a plain charset, so no quoting rule of any format is ever needed for them.
NAME_RE = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
BAND_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_CONFIG_NAME = 120
# Upper bounds: far above any real sweep, low enough that a typo (trials: 100000000, a
# 20,000-point grid, nproc_per_node: 1000 on gloo) fails here instead of exhausting the
# machine.  ``allow_large: true`` lifts the caps marked (L) for a sweep that really is that big.
LIMITS = {
    "nproc_per_node": 64,       # ranks per node (GPUs per box; gloo forks one process each)
    "nnodes": 1024,
    "trials": 1000,             # (L)
    "warmup": 100_000,          # (L)
    "iters": 100_000,           # (L)
    "batch": 100_000,           # (L) all-reduces per sample window
    "window_us": 10_000_000,    # 10 s of device time per sample
    "time_per_size_ms": 600_000,  # 10 minutes of timing per size
    "timeout_s": 7 * 24 * 3600,  # a week: a deadline must exist and be finite
    "sizes": 1000,              # distinct message sizes (L)
    "size_bytes": 1 << 36,      # 64 GiB per rank: more than any GPU holds
    "hidden": 1 << 24,
    "configs": 1000,            # configs incl. every grid point (L)
    "launches": 20_000,         # configs x trials (L); run.json is rewritten after each launch
    "bands": 64,
    "description": 10_000,      # characters; it is stored in run.json and shown in the report
}
LARGE_OK = {"trials", "warmup", "iters", "batch", "sizes", "configs", "launches"}

# key -> (allowed types, default, description used in errors)
_TOP_KEYS: dict[str, tuple[tuple[type, ...], Any]] = {
    "name": ((str,), None),
    "description": ((str,), ""),
    "backend": ((str,), "nccl"),
    "nproc_per_node": ((int, type(None)), None),
    "nnodes": ((int,), 1),
    "rdzv_endpoint": ((str, type(None)), None),
    "hosts": ((list, type(None)), None),
    "node_command": ((list, type(None)), None),
    "dtype": ((str,), "bfloat16"),
    "sizes": ((dict,), None),
    "trials": ((int,), 3),
    "warmup": ((int,), 20),
    "iters": ((int,), 200),
    "batch": ((int, str), "auto"),
    "window_us": ((int, float), 500),
    # the timing budget per size, mode and call path: as many samples as fit, at least 20, at most
    # iters (worker.timed_count), warmup calls within a tenth of it (worker.warmup_count); null: exactly
    # warmup and iters everywhere (the counts before 2026-12-04).  25 ms since 2026-12-06 (250 ms before)
    "time_per_size_ms": ((int, float, type(None)), 25),
    "modes": ((list, type(None)), None),
    "vias": ((list, type(None)), None),
    "replay_stream": ((str,), "side"),
    "reuse_process": ((bool,), False),
    # screening stops launching a config that already loses clearly in every band and mode
    # (analyse/racing.py); false: every config in every trial (the plan before 2026-12-04)
    "racing": ((bool,), True),
    "launch": ((str, type(None)), None),
    "timeout_s": ((int, float), 180),
    "base_env": ((dict, type(None)), None),
    "configs": ((dict, type(None)), None),
    "grid": ((dict, type(None)), None),
    "seed": ((int, type(None)), None),
    "bands": ((dict, type(None)), None),
    "confirm": ((dict, type(None)), None),
    "allow_large": ((bool,), False),
    "model": ((dict, type(None)), None),
}


@dataclass(frozen=True)
class Size:
    """One message size: bytes per rank, and the token count it came from (if model-shaped)."""

    bytes: int
    tokens: int | None = None


@dataclass(frozen=True)
class Config:
    """A named NCCL setting: ``env`` is what the launch gets on top of the user's environment
    (base_env merged with the config's own ``overrides``)."""

    name: str
    env: dict[str, str]
    overrides: dict[str, str]
    origin: str  # "default", "configs" or "grid"


@dataclass(frozen=True)
class Spec:
    path: str
    name: str
    description: str
    backend: str
    nproc_per_node: int | None
    nnodes: int
    rdzv_endpoint: str | None
    dtype: str
    sizes: tuple[Size, ...]
    trials: int
    warmup: int
    iters: int
    batch: int | str
    window_us: float
    modes: tuple[str, ...]
    timeout_s: float
    base_env: dict[str, str]
    configs: tuple[Config, ...]
    seed: int | None
    bands: dict[str, list]
    raw: dict = field(repr=False, default_factory=dict)
    warnings: tuple[str, ...] = ()
    vias: tuple[str, ...] = ("torch",)
    replay_stream: str = "side"
    reuse_process: bool = False
    # forkserver | torchrun (LAUNCH_METHODS); a run stored before the key existed used torchrun
    launch: str = "torchrun"
    # Stage 2 of the verdict method (verdict.py): configs whose answer is confirmed either way
    # (faster or slower, two-sided) besides the screening's candidates, and the rounds (None: auto).
    confirm_configs: tuple[str, ...] = ()
    confirm_rounds: int | None = None
    # commdiag step: the layer's shape (stepspec.StepModel as a dict); None for an all-reduce sweep.
    model: dict | None = None
    # ms of timing per size, mode and call path (None: exactly ``iters``; runs stored before the key)
    time_per_size_ms: float | None = None
    racing: bool = True
    # launch: torchrun across named hosts: one torchrun agent per host, started through the user's
    # node_command ({host}/{index} filled in; measure/hosts.py); () on one box or under Slurm
    hosts: tuple[str, ...] = ()
    node_command: tuple[str, ...] = ()

    def config(self, name: str) -> Config:
        return next(c for c in self.configs if c.name == name)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("raw")
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Spec":
        d = dict(d)
        d["sizes"] = tuple(Size(**s) for s in d["sizes"])
        d["configs"] = tuple(Config(**c) for c in d["configs"])
        d["modes"] = tuple(d["modes"])
        d["vias"] = tuple(d.get("vias", ("torch",)))
        if "graph_batch" in d:  # run format 1
            d["batch"] = d.pop("graph_batch")
            d.setdefault("window_us", 500.0)
        d["warnings"] = tuple(d.get("warnings", ()))
        d["confirm_configs"] = tuple(d.get("confirm_configs", ()))
        d.setdefault("racing", False)  # a run stored before racing (format <= 6) keeps its full plan
        d["hosts"] = tuple(d.get("hosts", ()))
        d["node_command"] = tuple(d.get("node_command", ()))
        return cls(**d)


SPEC_LIMIT = 4 << 20  # a spec is a page of YAML; 4 MiB leaves room for generated grids, not for /dev/zero


def load_spec(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Spec:
    """Read ``path``, apply ``--set KEY=VALUE`` overrides, validate and resolve."""
    path = Path(path)
    try:
        text = readfile.read_text(path, SPEC_LIMIT, what="spec")
    except OSError as e:
        raise SpecError(path, "(file)", f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SpecError(path, "(file)", f"not UTF-8 text (byte {e.start} cannot be decoded); "
                                        "save the spec as UTF-8") from None
    raw = parse_yaml(text, path)
    if not isinstance(raw, dict):
        raise SpecError(path, "(top level)", "must be a mapping of keys (name, backend, sizes, ...)")
    set_keys = {}
    for item in overrides:
        apply_override(raw, item, path)
        set_keys[item.partition("=")[0].split(".")[0]] = item
    try:
        return resolve(raw, path)
    except SpecError as e:  # name the --set that brought the bad value, not only the file
        top = e.field.split(".")[0].split("[")[0]
        if top in set_keys:
            raise SpecError(f"{path} (with --set {set_keys[top]})", e.field, e.problem) from None
        raise


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error
    (plain PyYAML keeps the last silently: two ``configs.a``, ``trials`` twice)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # << merges may be overridden
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                if first is not key_node.start_mark:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {brief(key)} (first on line {first.line + 1}); "
                                    "give each key once", key_node.start_mark)
        return super().construct_mapping(node, deep)


def parse_yaml(text: str, path: Path | str = "<spec>"):
    """YAML text to Python, duplicate keys refused; any failure is one SpecError."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as e:  # one line: where, and what
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = " ".join(x for x in (e.context, e.problem) if x)
        raise SpecError(path, "(yaml)", f"not valid YAML: {where}{_clip(what)}") from None
    except yaml.YAMLError as e:
        raise SpecError(path, "(yaml)", f"not valid YAML: {_clip(' '.join(str(e).split()))}") from None
    except RecursionError:
        raise SpecError(path, "(yaml)", "nested too deeply to be a sweep spec") from None
    except ValueError as e:  # an integer of thousands of digits (Python's int-from-string limit)
        raise SpecError(path, "(yaml)", f"not a usable value: {_clip(str(e), 160)}") from None


def _fld(name) -> str:
    """A key as it appears in a field path: as given when short, else cut (never a whole bomb)."""
    text = terminal_safe(str(name) if isinstance(name, (str, int, float)) else brief(name))
    return text.replace("\n", "\\n") if len(text) <= 80 else text[:77].replace("\n", "\\n") + "..."


def _clip(text: str, limit: int = 600) -> str:
    return text if len(text) <= limit else text[:limit] + " [...]"


def apply_override(raw: dict, item: str, path: Path | str = "--set", keys=None) -> None:
    """``--set trials=5`` or ``--set base_env.NCCL_DEBUG=WARN``; the value is parsed as YAML.
    ``keys``: the top-level keys allowed (default: the sweep spec's)."""
    keys = _TOP_KEYS if keys is None else keys
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise SpecError("--set", item, "expected KEY=VALUE (e.g. --set trials=5)")
    parts = key.split(".")
    if parts[0] not in keys:
        raise SpecError("--set", key, f"unknown key (allowed: {', '.join(keys)})")
    target = raw
    for p in parts[:-1]:
        if target.get(p) is None:  # absent, or an empty ``configs:`` (YAML null)
            target[p] = {}
        target = target[p]
        if not isinstance(target, dict):
            raise SpecError("--set", key, f"{p} is not a mapping")
    try:
        target[parts[-1]] = yaml.load(value, Loader=_StrictLoader) if value != "" else ""  # noqa: S506
    except yaml.YAMLError:
        target[parts[-1]] = value
    except RecursionError:
        raise SpecError("--set", key, "value nested too deeply") from None
    except ValueError as e:
        raise SpecError("--set", key, f"not a usable value: {_clip(str(e), 160)}") from None


def _type_name(types: tuple[type, ...]) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a mapping", list: "a list",
             type(None): "null"}
    return " or ".join(names[t] for t in types)


def _env_value(path, fld: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise SpecError(path, fld, f"{brief(value)} must be a string or number (quote values like \"1\" or \"yes\")")
    return str(value)


def _env_map(path, fld: str, value: Any, warnings: list[str]) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(path, fld, "must be a mapping of VARIABLE: value")
    out = {}
    for name, v in value.items():
        sub = f"{fld}.{_fld(name)}"
        text = _env_value(path, sub, v)
        error, warning = ncclvars.check_setting(str(name), text)
        if error:
            raise SpecError(path, sub, error)
        if warning:
            warnings.append(f"{path}: {sub}: {warning}")
        _check_tuner_setting(path, sub, str(name), text)
        out[str(name)] = text
    return out


def _check_tuner_setting(path, fld: str, name: str, value: str) -> None:
    """NCCL_TUNER_PLUGIN / NCCL_TUNER_CONFIG_FILE must name files that exist here, by absolute path:
    NCCL falls back to its own choices silently when they do not, and a launch would measure defaults.
    (Multi-node: the same paths must exist on every node; only this one is checked.)  The path is quoted
    whole: check_setting already refused control characters and values over MAX_VALUE."""
    if name not in ("NCCL_TUNER_PLUGIN", "NCCL_TUNER_CONFIG_FILE") or value.lower() == "none":
        return
    what = "the tuner plugin library" if name == "NCCL_TUNER_PLUGIN" else "the tuner rules file"
    if not os.path.isabs(value):
        raise SpecError(path, fld, f"{value!r} must be an absolute path to {what} (NCCL resolves a relative "
                        "one against each rank's working directory, or searches the library path)")
    if not os.path.isfile(value):
        raise SpecError(path, fld, f"{value!r}: " + ("no such file" if not os.path.exists(value)
                                                          else "not a regular file") + f"; it must be {what}")
    if name == "NCCL_TUNER_CONFIG_FILE":
        from ..tuner import rules

        try:
            rules.load(value)
        except rules.RulesError as e:
            raise SpecError(path, fld, f"{value!r}: {e.detail} (the plugin would load no rules; "
                            "docs/tuner.md, 'Rules file')") from None


def _choices(path, key: str, values: list, allowed: tuple[str, ...], nccl_only: dict[str, str],
             backend: str) -> tuple[str, ...]:
    """A non-empty list drawn from ``allowed``, without repeats; ``nccl_only`` names the choices
    (with the reason) that need backend: nccl."""
    if not values:
        raise SpecError(path, key, f"must list at least one of {', '.join(allowed)}")
    for i, v in enumerate(values):
        if v not in allowed:
            raise SpecError(path, f"{key}[{i}]", f"{brief(v)} is not one of {', '.join(allowed)}")
        if v in nccl_only and backend != "nccl":
            raise SpecError(path, f"{key}[{i}]", nccl_only[v])
    return tuple(dict.fromkeys(values))


def _positive_int(path, fld, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(path, fld, f"{brief(value)} must be an integer >= {minimum}")
    return value


_LARGE_HINT = "set allow_large: true if the sweep really is that big"


def _bounded_int(path, fld, value, minimum=1, *, large=False, limit_key=None):
    """An integer in minimum..LIMITS[key]; the (L) caps are lifted by ``allow_large: true``."""
    _positive_int(path, fld, value, minimum)
    key = limit_key or fld
    if value > LIMITS[key] and not (large and key in LARGE_OK):
        hint = f"; {_LARGE_HINT}" if key in LARGE_OK else ""
        raise SpecError(path, fld, f"{value} is more than the limit of {LIMITS[key]}{hint}")
    return value


def _bounded_number(path, fld, value, unit):
    """A finite number > 0 and at most LIMITS[fld] (nan or inf would disable a deadline)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise SpecError(path, fld, f"{brief(value)} must be a finite number > 0 {unit}")
    if value > LIMITS[fld]:
        raise SpecError(path, fld, f"{value:g} {unit} is more than the limit of {LIMITS[fld]:g}")
    return value


def _check_endpoint(path, rdzv: str) -> None:
    """``host:port`` with a port 1..65535 in ASCII digits (``str.isdigit`` also accepts '٣')."""
    host, sep, port = rdzv.rpartition(":")
    if not sep or not host or not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= 65535:
        raise SpecError(path, "rdzv_endpoint", f"{brief(rdzv)} must be host:port with a port 1..65535")
    if re.search(r"[\s\x00-\x1f\x7f-\x9f]", host):
        raise SpecError(path, "rdzv_endpoint", f"{brief(rdzv)}: the host has whitespace or control characters")


# A host as node_command and the rendezvous see it: a name, an address, or ssh's user@host.  A host
# that starts with "-" would read as an option of ssh or pdsh.
HOST_RE = re.compile(r"[A-Za-z0-9_.@:%\[\]][A-Za-z0-9_.@:%\[\]-]{0,252}")
NODE_COMMAND_PLACEHOLDERS = ("host", "index")


def _resolve_hosts(path, hosts) -> tuple[str, ...]:
    """``hosts``: the nodes of a launch: torchrun across hosts, in node-rank order (the first is the
    rendezvous unless rdzv_endpoint says otherwise)."""
    if hosts is None:
        return ()
    if not hosts:
        raise SpecError(path, "hosts", "an empty list: name the nodes, e.g. [node1, node2], or leave hosts out")
    if len(hosts) > LIMITS["nnodes"]:
        raise SpecError(path, "hosts", f"{len(hosts)} hosts, more than the limit of {LIMITS['nnodes']}")
    seen = set()
    for i, host in enumerate(hosts):
        if not isinstance(host, str) or not HOST_RE.fullmatch(host):
            raise SpecError(path, f"hosts[{i}]", f"{brief(host)} must be a host name, an address or user@host "
                                                 "(letters, digits, . _ - @ : % [ ]; not starting with -)")
        if host in seen:
            raise SpecError(path, f"hosts[{i}]", f"{brief(host)} is named twice: one torchrun agent per host")
        seen.add(host)
    return tuple(hosts)


def _resolve_node_command(path, command, hosts) -> tuple[str, ...]:
    """``node_command``: the user's own way to run a shell command line on a host (``[ssh, "{host}"]``);
    commdiag appends that command line as one last argument.  Placeholders: {host}, {index} (the
    node rank, 0-based); ``{{``/``}}`` for a literal brace."""
    if command is None:
        if hosts:
            raise SpecError(path, "node_command", "required with hosts: the command that runs a shell command "
                                                  "line on {host}, e.g. [ssh, \"{host}\"] (commdiag appends the "
                                                  "command line as its last argument)")
        return ()
    if not hosts:
        raise SpecError(path, "node_command", "only with hosts: the nodes it starts torchrun on")
    if not command:
        raise SpecError(path, "node_command", "an empty list: give the program and its arguments, e.g. "
                                              "[ssh, \"{host}\"]")
    import string

    used = set()
    for i, arg in enumerate(command):
        if not isinstance(arg, str) or not arg or "\0" in arg:
            raise SpecError(path, f"node_command[{i}]", f"{brief(arg)} must be a non-empty string")
        try:
            fields = list(string.Formatter().parse(arg))
        except ValueError as e:
            raise SpecError(path, f"node_command[{i}]", f"{brief(arg)}: {e} (write {{{{ or }}}} for a literal "
                                                        "brace)") from None
        for _, name, spec, conversion in fields:
            if name is None:
                continue
            if name not in NODE_COMMAND_PLACEHOLDERS or spec or conversion:
                raise SpecError(path, f"node_command[{i}]", f"{brief(arg)}: unknown placeholder "
                                                            f"{{{name}{'!' + conversion if conversion else ''}"
                                                            f"{':' + spec if spec else ''}}} (allowed: {{host}}, "
                                                            "{index}; {{ or }} for a literal brace)")
            used.add(name)
    if not used:
        raise SpecError(path, "node_command", f"{brief(command)} names no host: put {{host}} (or {{index}}) where "
                                              "the host goes, e.g. [ssh, \"{host}\"], so that each agent runs on "
                                              "its own host")
    return tuple(command)


def did_you_mean(key, allowed) -> str:
    """``: did you mean `trials`?`` for a key one typo away from an allowed one, else nothing."""
    import difflib

    close = difflib.get_close_matches(str(key), list(allowed), n=1, cutoff=0.75)
    return f": did you mean `{close[0]}`?" if close else ""


def resolve(raw: dict, path: Path | str = "<spec>") -> Spec:
    warnings: list[str] = []
    for key, value in raw.items():
        if key not in _TOP_KEYS:
            raise SpecError(path, _fld(key), f"unknown key{did_you_mean(key, _TOP_KEYS)} "
                                             f"(allowed: {', '.join(_TOP_KEYS)})")
        types, _ = _TOP_KEYS[key]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise SpecError(path, key, f"{brief(value)} must be {_type_name(types)}")
    get = lambda k: raw.get(k, _TOP_KEYS[k][1])  # noqa: E731

    name = get("name")
    if not name or not str(name).strip():
        raise SpecError(path, "name", "required: a short name used in the run folder name")
    if not NAME_RE.fullmatch(name) or name in (".", ".."):
        raise SpecError(path, "name", f"{brief(name)}: 1-64 characters from A-Z a-z 0-9 _ . + - "
                                      "(it becomes part of the run folder's name)")
    backend = get("backend")
    if backend not in BACKENDS:
        raise SpecError(path, "backend", f"{brief(backend)} is not one of {', '.join(BACKENDS)}")
    dtype = get("dtype")
    if dtype not in DTYPE_BYTES:
        raise SpecError(path, "dtype", f"{brief(dtype)} is not one of {', '.join(DTYPE_BYTES)}")
    nproc = get("nproc_per_node")
    if nproc is None and backend == "gloo":
        nproc = 2
    if nproc is not None:
        _bounded_int(path, "nproc_per_node", nproc)
    hosts = _resolve_hosts(path, get("hosts"))
    node_command = _resolve_node_command(path, get("node_command"), hosts)
    if hosts and "nnodes" not in raw:
        raw_nnodes = len(hosts)
    else:
        raw_nnodes = get("nnodes")
    nnodes = _bounded_int(path, "nnodes", raw_nnodes)
    if hosts and nnodes > len(hosts):
        raise SpecError(path, "hosts", f"{len(hosts)} host(s) for nnodes: {nnodes}: name at least one host "
                                       "per node (the first nnodes are used)")
    rdzv = get("rdzv_endpoint")
    launch = get("launch")
    if hosts and launch is None:
        launch = "torchrun"
    if hosts and launch != "torchrun":
        raise SpecError(path, "hosts", f"only with launch: torchrun (got launch: {brief(launch)}): under Slurm "
                                       "the allocation names the nodes; docs/multinode.md")
    if nnodes > 1 and not rdzv and not hosts and launch == "torchrun":
        raise SpecError(path, "rdzv_endpoint", "required with launch: torchrun and nnodes > 1 unless hosts is "
                                               "set: host:port of the c10d rendezvous, with the same sweep "
                                               "started on every node; or hosts: [...] and node_command: "
                                               "[ssh, \"{host}\"] to have commdiag start one torchrun per host; "
                                               "or leave launch unset: inside Slurm each launch is one srun "
                                               "over the allocation; docs/multinode.md")
    if rdzv:
        _check_endpoint(path, rdzv)
    large = bool(get("allow_large"))
    trials = _bounded_int(path, "trials", get("trials"), large=large)
    warmup = _bounded_int(path, "warmup", get("warmup"), minimum=0, large=large)
    iters = _bounded_int(path, "iters", get("iters"), large=large)
    batch = get("batch")
    if batch != "auto":
        if isinstance(batch, str):
            raise SpecError(path, "batch", f"{brief(batch)} must be auto or an integer >= 1")
        _bounded_int(path, "batch", batch, large=large)
    window_us = _bounded_number(path, "window_us", get("window_us"), "microseconds")
    time_per_size_ms = get("time_per_size_ms")
    if time_per_size_ms is not None:
        time_per_size_ms = float(_bounded_number(path, "time_per_size_ms", time_per_size_ms,
                                                 "milliseconds (or null: exactly iters samples)"))
    timeout_s = _bounded_number(path, "timeout_s", get("timeout_s"), "seconds")

    modes = get("modes")
    if modes is None:
        modes = ["graph", "eager"] if backend == "nccl" else ["eager"]
    modes = _choices(path, "modes", modes, MODES,
                     {"graph": "graph mode needs CUDA (backend: nccl); gloo allows: eager"}, backend)

    model_raw = get("model")
    vias = get("vias")
    if model_raw is not None:
        vias = _step_vias(path, vias)
    else:
        if vias is None:
            # torch.distributed only.  nccl-direct (libnccl through ctypes) asks what torch adds, not what
            # an NCCL variable does: on 2x H200 graph-direct was within 1% of graph via torch at every
            # size and named the same winners (docs/fidelity.md), so measuring it for every config of
            # every trial doubled a sweep for nothing its verdicts use.  `vias: [torch, nccl-direct]`.
            vias = ["torch"]
        vias = _choices(path, "vias", vias, VIAS,
                        {"nccl-direct": "nccl-direct calls libnccl on GPUs (backend: nccl); gloo allows: torch"}, backend)
    if launch is None:
        launch = "slurm" if nnodes > 1 else DEFAULT_LAUNCH[backend]
    if launch not in LAUNCH_METHODS:
        raise SpecError(path, "launch", f"{brief(launch)} is not one of {', '.join(LAUNCH_METHODS)} "
                                        f"(default for backend {backend}: {DEFAULT_LAUNCH[backend]})")
    replay_stream = get("replay_stream")
    if replay_stream not in REPLAY_STREAMS:
        raise SpecError(path, "replay_stream", f"{brief(replay_stream)} is not one of {', '.join(REPLAY_STREAMS)}")

    model, sizes_raw = None, get("sizes")
    if model_raw is not None:
        model = _resolve_step(path, raw, model_raw, nproc, nnodes)
        sizes_raw = {**sizes_raw, "hidden": model["hidden"]}
    sizes = _resolve_sizes(path, sizes_raw, dtype, large)
    base_env = _env_map(path, "base_env", get("base_env"), warnings)
    if "configs" in raw and not raw["configs"] and not raw.get("grid"):
        # an empty configs: is a spec half written, not a request to time default alone (which leaves
        # nothing to compare; leave configs: out for that)
        raise SpecError(path, "configs", "empty: give at least one config besides default, e.g. "
                                         "seed: {NCCL_PROTO: LL}, or a grid: (leave configs out to time default alone)")
    configs = _resolve_configs(path, raw, base_env, warnings, large)
    if not large and len(configs) * trials > LIMITS["launches"]:
        raise SpecError(path, "trials", f"{len(configs)} configs x {trials} trials = {len(configs) * trials} "
                                        f"launches, more than {LIMITS['launches']}; {_LARGE_HINT}")
    bands = _resolve_bands(path, get("bands"))
    confirm_configs, confirm_rounds = _resolve_confirm(path, get("confirm"), configs)

    seed = get("seed")
    if seed is not None and (isinstance(seed, bool) or not 0 <= seed < 2**63):
        raise SpecError(path, "seed", f"{brief(seed)} must be an integer 0..2^63-1 or null")
    description = str(get("description") or "")
    if len(description) > LIMITS["description"]:
        raise SpecError(path, "description", f"{len(description)} characters, more than {LIMITS['description']}")
    return Spec(
        path=str(path), name=str(name), description=description, backend=backend,
        nproc_per_node=nproc, nnodes=nnodes, rdzv_endpoint=rdzv, dtype=dtype, sizes=sizes,
        trials=trials, warmup=warmup, iters=iters, batch=batch, window_us=float(window_us), modes=modes,
        timeout_s=float(timeout_s), base_env=base_env, configs=configs, seed=seed, bands=bands,
        raw=raw, warnings=tuple(warnings), vias=vias, replay_stream=replay_stream,
        reuse_process=bool(get("reuse_process")), launch=launch, racing=bool(get("racing")),
        confirm_configs=confirm_configs, confirm_rounds=confirm_rounds,
        model=model, time_per_size_ms=None if model else time_per_size_ms,
        hosts=hosts, node_command=node_command,
    )


def _step_vias(path, vias) -> tuple[str, ...]:
    """A step spec's series: the full step always, its two ablations by default."""
    if vias is None:
        return STEP_VIAS
    if not isinstance(vias, list) or not vias:
        raise SpecError(path, "vias", f"must be a non-empty list from {', '.join(STEP_VIAS)}")
    for i, v in enumerate(vias):
        if v not in STEP_VIAS:
            raise SpecError(path, f"vias[{i}]", f"{brief(v)} is not a series of commdiag step "
                                                f"(allowed: {', '.join(STEP_VIAS)})")
    if "step" not in vias:
        raise SpecError(path, "vias", "must include step (the full step every verdict is about)")
    return tuple(v for v in STEP_VIAS if v in vias)


def _resolve_step(path, raw: dict, model_raw, nproc, nnodes) -> dict:
    """``model:`` (commdiag step): the layer's shape; the sizes are its all-reduces (tokens x hidden)."""
    from .stepspec import resolve_model

    sizes = raw.get("sizes")
    if not isinstance(sizes, dict) or not sizes.get("tokens"):
        raise SpecError(path, "sizes.tokens", "required with model: the tokens per step (1-3 for decode, "
                                              "a few hundred for a prefill chunk)")
    if sizes.get("bytes"):
        raise SpecError(path, "sizes.bytes", "not with model: a step's all-reduces are tokens x model.hidden")
    tp = nproc * nnodes if nproc is not None else None
    model = resolve_model(path, model_raw, tp=tp, tokens=list(sizes["tokens"]))
    if sizes.get("hidden", model.hidden) != model.hidden:
        raise SpecError(path, "sizes.hidden", f"{brief(sizes.get('hidden'))} differs from model.hidden "
                                              f"({model.hidden}); leave it out")
    if raw.get("reuse_process"):
        raise SpecError(path, "reuse_process", "not with model: each step launch builds its own layer")
    return model.to_json()


def _resolve_sizes(path, sizes: dict | None, dtype: str, large: bool = False) -> tuple[Size, ...]:
    if not sizes:
        raise SpecError(path, "sizes", "required: give sizes.tokens with sizes.hidden, or sizes.bytes")
    unknown = set(sizes) - {"hidden", "tokens", "bytes"}
    if unknown:
        raise SpecError(path, f"sizes.{sorted(unknown)[0]}", "unknown key (allowed: hidden, tokens, bytes)")
    elem = DTYPE_BYTES[dtype]
    out: dict[int, Size] = {}
    tokens = sizes.get("tokens") or []
    if not isinstance(tokens, list):
        raise SpecError(path, "sizes.tokens", "must be a list of token counts")
    if tokens:
        hidden = sizes.get("hidden")
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise SpecError(path, "sizes.hidden", f"{brief(hidden)}: an integer >= 1 is required with sizes.tokens")
        _bounded_int(path, "sizes.hidden", hidden, limit_key="hidden")
    explicit = sizes.get("bytes") or []
    if isinstance(explicit, list) and len(tokens) + len(explicit) > LIMITS["sizes"] and not large:
        raise SpecError(path, "sizes", f"{len(tokens) + len(explicit)} sizes, more than {LIMITS['sizes']}; "
                                       + _LARGE_HINT)
    for i, t in enumerate(tokens):
        _positive_int(path, f"sizes.tokens[{i}]", t)
        b = t * sizes["hidden"] * elem
        if b > LIMITS["size_bytes"]:
            raise SpecError(path, f"sizes.tokens[{i}]", f"{t} tokens are {b} bytes per rank, more than "
                                                        f"the limit of {LIMITS['size_bytes']}")
        out[b] = Size(bytes=b, tokens=t)
    if not isinstance(explicit, list):
        raise SpecError(path, "sizes.bytes", "must be a list of byte counts")
    for i, b in enumerate(explicit):
        _bounded_int(path, f"sizes.bytes[{i}]", b, limit_key="size_bytes")
        if b % elem:
            raise SpecError(path, f"sizes.bytes[{i}]", f"{b} is not a multiple of {elem} ({dtype} element size)")
        out.setdefault(b, Size(bytes=b))
    if not out:
        raise SpecError(path, "sizes", "no sizes given: sizes.tokens (with hidden) or sizes.bytes must be non-empty")
    return tuple(out[b] for b in sorted(out))


_NAME_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _check_config_name(path, fld: str, name: str) -> None:
    """Config names reach terminals, HTML, CSV and profile comments: printable text only."""
    if not name or _NAME_CONTROL.search(name) or len(name) > MAX_CONFIG_NAME:
        raise SpecError(path, _fld(fld), f"config names must be 1-{MAX_CONFIG_NAME} characters "
                                          "without control characters (newline, CR, ESC, NUL, ...)")


def _resolve_configs(path, raw: dict, base_env: dict, warnings: list[str], large: bool = False) -> tuple[Config, ...]:
    configs = [Config(DEFAULT_CONFIG, dict(base_env), {}, "default")]
    named = raw.get("configs") or {}
    grid = raw.get("grid") or {}
    points = math.prod(len(v) for v in grid.values() if isinstance(v, list)) if grid else 0
    if 1 + len(named) + points > LIMITS["configs"] and not large:  # counted before expanding the grid
        raise SpecError(path, "grid" if points else "configs",
                        f"{1 + len(named) + points} configs (default, {len(named)} named, {points} grid points), "
                        f"more than {LIMITS['configs']}; {_LARGE_HINT}")
    for cname, env in named.items():
        cname = str(cname)
        fld = f"configs.{_fld(cname)}"
        _check_config_name(path, fld, cname)
        if cname == DEFAULT_CONFIG:
            raise SpecError(path, fld, "'default' is always added (base_env only) and cannot be redefined")
        overrides = _env_map(path, fld, env if env is not None else {}, warnings)
        configs.append(Config(cname, {**base_env, **overrides}, overrides, "configs"))
    axes = []
    for var, values in grid.items():
        fld = f"grid.{_fld(var)}"
        if not isinstance(values, list) or not values:
            raise SpecError(path, fld, "must be a non-empty list of values")
        axes.append([(str(var), _env_map(path, fld, {var: v}, warnings)[str(var)]) for v in values])
    for point in itertools.product(*axes) if axes else []:
        overrides = dict(point)
        cname = ",".join(f"{k.removeprefix('NCCL_')}={v}" for k, v in point)
        configs.append(Config(cname, {**base_env, **overrides}, overrides, "grid"))
    seen: set[str] = set()
    for c in configs:
        if c.name in seen:
            raise SpecError(path, f"configs.{c.name}", "duplicate config name (a grid point has the same label)")
        seen.add(c.name)
    return tuple(configs)


CONFIRM_KEYS = ("configs", "rounds")
MAX_CONFIRM_ROUNDS = 200


def _resolve_confirm(path, confirm: dict | None, configs) -> tuple[tuple[str, ...], int | None]:
    """``confirm: {configs: [seed], rounds: 8}``: configs stage 2 answers either way, and a fixed
    number of confirmation rounds (default: the fewest at which the paired test can certify every claim)."""
    if not confirm:
        return (), None
    for key in confirm:
        if key not in CONFIRM_KEYS:
            raise SpecError(path, f"confirm.{key}", f"unknown key (allowed: {', '.join(CONFIRM_KEYS)})")
    names = confirm.get("configs") or []
    if not isinstance(names, list):
        raise SpecError(path, "confirm.configs", "must be a list of config names")
    known = [c.name for c in configs]
    for i, n in enumerate(names):
        if not isinstance(n, str) or n not in known:
            raise SpecError(path, f"confirm.configs[{i}]", f"{brief(n)} is not a config of this spec "
                                                           f"(configs: {', '.join(known[1:]) or 'none'})")
        if n == DEFAULT_CONFIG:
            raise SpecError(path, f"confirm.configs[{i}]", "'default' is the reference every claim is tested against")
    rounds = confirm.get("rounds")
    if rounds is not None and rounds != "auto":
        if isinstance(rounds, bool) or not isinstance(rounds, int) or not 3 <= rounds <= MAX_CONFIRM_ROUNDS:
            raise SpecError(path, "confirm.rounds", f"{brief(rounds)} must be auto or an integer 3..{MAX_CONFIRM_ROUNDS}")
    else:
        rounds = None
    return tuple(dict.fromkeys(names)), rounds


def _resolve_bands(path, bands: dict | None) -> dict[str, list]:
    if bands is None:
        return {k: list(v) for k, v in DEFAULT_BANDS.items()}
    if len(bands) > LIMITS["bands"]:
        raise SpecError(path, "bands", f"{len(bands)} bands, more than {LIMITS['bands']}")
    out = {}
    for name, rng in bands.items():
        if not isinstance(name, str) or not BAND_RE.fullmatch(name):
            # a band name becomes a file name (profile-<band>.env) and a profile comment
            raise SpecError(path, f"bands.{_fld(name)}", "band names are 1-64 characters from "
                                                          "A-Z a-z 0-9 _ . - (they name profile-<band>.env)")
        fld = f"bands.{name}"
        if not isinstance(rng, list) or len(rng) != 2:
            raise SpecError(path, fld, "must be [min_tokens, max_tokens] (null for unbounded)")
        lo, hi = rng
        for v, which in ((lo, "min"), (hi, "max")):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise SpecError(path, fld, f"{which} {brief(v)} must be a token count or null")
        if lo is not None and hi is not None and lo > hi:
            raise SpecError(path, fld, f"min {lo} > max {hi}")
        out[str(name)] = [lo, hi]
    return out


@dataclass(frozen=True)
class Launch:
    """One fresh torchrun launch: a config's trial, at its place in the interleaved order."""

    index: int
    config: str
    trial: int


def launch_order(spec: Spec, seed: int) -> list[Launch]:
    """Round robin over trials, shuffled within each round with ``seed``.

    Interleaving means slow drift of the machine (clocks, temperature, other
    tenants) lands on every config alike instead of masquerading as a difference.
    """
    rng = random.Random(seed)
    order: list[Launch] = []
    for trial in range(spec.trials):
        names = [c.name for c in spec.configs]
        rng.shuffle(names)
        for n in names:
            order.append(Launch(len(order), n, trial))
    return order
