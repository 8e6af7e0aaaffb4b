"""Reading one launch's numbers: a JSON field of a result file, or a regex on the command's stdout.

Presets know the usual benchmarks' result files, which change between versions, so they are read
defensively: a JSON object or JSON lines (the LAST complete object counts: sglang appends one line
per run to the same file), each field under its known aliases, a value only when it is a finite
number > 0 (a ratio of logs needs that).  What a preset reads, from each tool's source:

* ``sglang.bench_serving --output-file F``: JSON lines, one object per run: the arguments, duration,
  and every BenchmarkMetrics field (output_throughput, request_throughput, median_ttft_ms, ...).
* ``sglang.bench_one_batch --result-filename F`` (default result.jsonl): JSON lines, one per batch
  size x input x output length: prefill_latency, prefill_throughput, median_decode_latency,
  median_decode_throughput, total_latency, overall_throughput.
* ``sglang.bench_offline_throughput --result-filename F``: JSON lines: request/input/output/total
  throughput, total_latency, last_gen_throughput.
* ``vllm bench serve --save-result --result-filename F`` (vllm/benchmarks/serve.py, ``main_async``'s
  ``result_json``): one JSON object (``json.dump``, no newline; ``--append-result`` puts a newline
  between runs): the run's identity, ``--metadata`` keys, duration, completed, failed, token counts,
  request/output/total_token throughput, request_goodput (null without ``--goodput``), the peak
  output rate, then mean/median/std and one ``pN_`` per ``--metric-percentiles`` (default 99) of
  each ``--percentile-metrics`` (default ttft, tpot, itl: the e2el fields only when asked for).

Which file and commit each fixture follows: tests/fixtures/ab/README.md.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from dataclasses import dataclass

MAX_RESULT_BYTES = 64 << 20  # a result file bigger than this is not read whole: its tail is
TAIL_BYTES = 8 << 20  # what is read of a larger file (the last lines are what counts)


@dataclass(frozen=True)
class Field:
    better: str  # higher | lower
    aliases: tuple[str, ...] = ()
    hint: str = ""  # what the benchmark needs to write the field, said when it is missing


def _lat(*aliases, hint: str = ""):
    return Field("lower", aliases, hint)


def _thr(*aliases, hint: str = ""):
    return Field("higher", aliases, hint)


_VLLM_E2EL = "vllm bench serve writes it with --percentile-metrics ttft,tpot,itl,e2el"


PRESETS: dict[str, dict] = {
    "sglang.bench_serving": {"file": "{launch_dir}/result.jsonl", "fields": {
        "output_throughput": _thr("output_token_throughput"),
        "request_throughput": _thr(),
        "input_throughput": _thr(),
        "total_throughput": _thr("total_token_throughput"),
        "median_ttft_ms": _lat(), "mean_ttft_ms": _lat(), "p99_ttft_ms": _lat(),
        "median_itl_ms": _lat(), "mean_itl_ms": _lat(), "p99_itl_ms": _lat(),
        "median_tpot_ms": _lat(), "mean_tpot_ms": _lat(), "p99_tpot_ms": _lat(),
        "median_e2e_latency_ms": _lat("median_e2el_ms"), "mean_e2e_latency_ms": _lat("mean_e2el_ms"),
        "p99_e2e_latency_ms": _lat("p99_e2el_ms"),
    }},
    "sglang.bench_one_batch": {"file": "{launch_dir}/result.jsonl", "fields": {
        "median_decode_throughput": _thr(), "median_decode_latency": _lat(),
        "prefill_latency": _lat(), "prefill_throughput": _thr(),
        "total_latency": _lat(), "overall_throughput": _thr(),
    }},
    "sglang.bench_offline_throughput": {"file": "{launch_dir}/result.jsonl", "fields": {
        "output_throughput": _thr(), "total_throughput": _thr(), "request_throughput": _thr(),
        "input_throughput": _thr(), "total_latency": _lat(), "last_gen_throughput": _thr(),
    }},
    "vllm.bench_serve": {"file": "{launch_dir}/result.json", "fields": {
        "output_throughput": _thr(), "total_token_throughput": _thr("total_throughput"),
        "request_throughput": _thr(),
        "request_goodput": _thr(hint="vllm bench serve writes a number there only with --goodput"),
        "max_output_tokens_per_s": _thr(),
        "median_ttft_ms": _lat(), "mean_ttft_ms": _lat(), "p99_ttft_ms": _lat(),
        "median_tpot_ms": _lat(), "mean_tpot_ms": _lat(), "p99_tpot_ms": _lat(),
        "median_itl_ms": _lat(), "mean_itl_ms": _lat(), "p99_itl_ms": _lat(),
        "median_e2el_ms": _lat("median_e2e_latency_ms", hint=_VLLM_E2EL),
        "mean_e2el_ms": _lat("mean_e2e_latency_ms", hint=_VLLM_E2EL),
        "p99_e2el_ms": _lat("p99_e2e_latency_ms", hint=_VLLM_E2EL),
    }},
}


def preset_field(preset: str, field: str) -> Field | None:
    return PRESETS.get(preset, {}).get("fields", {}).get(field)


def substitute(template: str, values: dict[str, str]) -> str:
    """``{launch_dir}``, ``{port}``, ``{python}`` replaced; any other brace is kept as written."""
    for k, v in values.items():
        template = template.replace("{" + k + "}", v)
    return template


def _read_tail(path: str) -> str:
    # O_NONBLOCK and regular files only: a FIFO named as the metric's file never hangs the run
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_RESULT_BYTES:
            f.seek(size - TAIL_BYTES)
        return f.read(MAX_RESULT_BYTES).decode("utf-8", "replace")


def last_object(text: str) -> dict | None:
    """The whole text as one JSON object, else its last line that is a JSON object (JSON lines)."""
    try:
        obj = json.loads(text)
        if isinstance(obj, dict):
            return obj
    except (ValueError, RecursionError):
        pass
    for line in reversed(text.splitlines()):
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            continue  # a line cut by a crash: the one before it is the last complete run
        if isinstance(obj, dict):
            return obj
    return None


def _lookup(obj: dict, field: str):
    if field in obj:
        return obj[field]
    cur = obj
    for part in field.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def number(value) -> float | None:
    """A finite number > 0 (a bool, a string, 0, a negative or NaN is not a usable value)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                return None
        else:
            return None
    value = float(value)
    return value if math.isfinite(value) and value > 0 else None


def from_file(path: str, field: str, aliases: tuple[str, ...] = (), not_before: float | None = None,
              hint: str = "") -> tuple[float | None, str | None]:
    """(value, None) or (None, why) for ``field`` of the last JSON object in ``path``; ``hint``: what
    the benchmark needs to write the field (a preset's), said when it is missing."""
    try:
        if not_before is not None and os.stat(path).st_mtime < not_before - 1.0:
            return None, f"{path}: not written by this launch (older than its start)"
        text = _read_tail(path)
    except FileNotFoundError:
        return None, f"{path}: not written"
    except OSError as e:
        return None, f"{path}: cannot read: {e.strerror}"
    obj = last_object(text)
    if obj is None:
        return None, f"{path}: no JSON object in it"
    for name in (field, *aliases):
        raw = _lookup(obj, name)
        if raw is not None:
            value = number(raw)
            if value is None:
                return None, f"{path}: {name} is {str(raw)[:40]!r}, not a number > 0"
            return value, None
    more = f"; {hint}" if hint else ""
    if field in obj:  # null: the benchmark wrote the key without a value (vLLM's goodput without --goodput)
        return None, f"{path}: {field} is null in its last object{more}"
    keys = ", ".join(sorted(str(k) for k in obj)[:12])
    return None, f"{path}: no field {field} in its last object (fields: {keys}){more}"


def from_stdout(text: str, pattern: str) -> tuple[float | None, str | None]:
    """The last match of ``pattern`` (its group ``value``, else its first group) in ``text``."""
    rx = re.compile(pattern)
    matches = list(rx.finditer(text))
    if not matches:
        return None, f"stdout: no line matches {pattern!r}"
    m = matches[-1]
    raw = m.group("value") if "value" in rx.groupindex else (m.group(1) if rx.groups else m.group(0))
    value = number(raw)
    if value is None:
        return None, f"stdout: {raw[:40]!r} matched, not a number > 0"
    return value, None
