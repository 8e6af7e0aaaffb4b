"""What commdiag knows about NCCL's environment variables: names and allowed values.

Used to validate sweep specs, profiles and ``--set`` values before any work
starts.  An unknown ``NCCL_*`` name is only a warning (a typo guard: NCCL adds
variables faster than this table), anything not starting with ``NCCL_`` passes
through untouched.  Values follow NCCL's documented environment variables
(docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html).
"""

from __future__ import annotations

import difflib
import re

from ..errors import brief

PROTOCOLS = ("LL", "LL128", "Simple")
ALGORITHMS = ("Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT")
P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
NTHREADS = ("64", "128", "256", "512")
# Collective names accepted in the per-function form "allreduce:LL,Simple;broadcast:Ring".
FUNCTIONS = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce", "sendrecv", "send", "recv")

_INT = re.compile(r"^-?\d+$")
_BOOL_ALLOWED = "0 or 1"


def _choice_list(value: str, allowed: tuple[str, ...], what: str) -> str | None:
    """Validate NCCL's list syntax: ``A,B``, ``^A,B`` (exclude) and ``func:A,B;func2:C``."""
    lowered = {a.lower(): a for a in allowed}
    for part in value.split(";"):
        part = part.strip()
        if not part:
            return f"empty element in {value!r}"
        if ":" in part:
            func, _, part = part.partition(":")
            if func.strip().lower() not in FUNCTIONS:
                return f"unknown collective {func!r} in {value!r} (allowed: {', '.join(FUNCTIONS)})"
        body = part[1:] if part.startswith("^") else part
        for item in body.split(","):
            if item.strip().lower() not in lowered:
                return f"unknown {what} {item.strip()!r} (allowed: {', '.join(allowed)}, a ^ prefix to exclude, or func:list)"
    return None


def _int_range(lo: int, hi: int | None = None):
    def check(value: str) -> str | None:
        if not _INT.match(value):
            return f"{value!r} is not an integer"
        v = int(value)
        if v < lo or (hi is not None and v > hi):
            return f"{v} is outside {lo}..{hi if hi is not None else 'inf'}"
        return None

    return check


def _one_of(allowed: tuple[str, ...], case_insensitive: bool = False):
    def check(value: str) -> str | None:
        ok = value.lower() in {a.lower() for a in allowed} if case_insensitive else value in allowed
        return None if ok else f"{value!r} is not one of {', '.join(allowed)}"

    return check


def _bool(value: str) -> str | None:
    return None if value in ("0", "1") else f"{value!r} is not {_BOOL_ALLOWED}"


def _p2p_level(value: str) -> str | None:
    # NCCL also accepts a plain integer path type for backward compatibility.
    if value.upper() in P2P_LEVELS or _INT.match(value):
        return None
    return f"{value!r} is not one of {', '.join(P2P_LEVELS)}"


def _any(value: str) -> str | None:
    return None


CHECKS = {
    "NCCL_PROTO": lambda v: _choice_list(v, PROTOCOLS, "protocol"),
    "NCCL_ALGO": lambda v: _choice_list(v, ALGORITHMS, "algorithm"),
    "NCCL_MAX_NCHANNELS": _int_range(1, 64),
    "NCCL_MIN_NCHANNELS": _int_range(1, 64),
    "NCCL_MAX_CTAS": _int_range(1, 64),
    "NCCL_MIN_CTAS": _int_range(1, 64),
    "NCCL_BUFFSIZE": _int_range(1),
    "NCCL_NTHREADS": _one_of(NTHREADS),
    "NCCL_LL128_NTHREADS": _int_range(1),
    "NCCL_P2P_LEVEL": _p2p_level,
    "NCCL_SHM_DISABLE": _bool,
    "NCCL_P2P_DISABLE": _bool,
    "NCCL_NET_GDR_LEVEL": _p2p_level,
    "NCCL_P2P_NET_CHUNKSIZE": _int_range(1),
    "NCCL_P2P_PCI_CHUNKSIZE": _int_range(1),
    "NCCL_P2P_NVL_CHUNKSIZE": _int_range(1),
    "NCCL_P2P_USE_CUDA_MEMCPY": _bool,
    "NCCL_P2P_READ_ENABLE": _bool,
    "NCCL_SHM_USE_CUDA_MEMCPY": _bool,
    "NCCL_NVLS_ENABLE": _bool,
    "NCCL_NVLSTREE_MAX_CHUNKSIZE": _int_range(1),
    "NCCL_CUMEM_ENABLE": _bool,
    "NCCL_IB_DISABLE": _bool,
    "NCCL_NET_GDR_READ": _bool,
    "NCCL_CROSS_NIC": _int_range(0, 2),
    "NCCL_LAUNCH_MODE": _one_of(("PARALLEL", "GROUP"), case_insensitive=True),
    "NCCL_GRAPH_MIXING_SUPPORT": _bool,
    "NCCL_CHECKS_DISABLE": _bool,
    "NCCL_CHECK_POINTERS": _bool,
    "NCCL_COLLNET_ENABLE": _bool,
    "NCCL_PXN_DISABLE": _bool,
    "NCCL_RUNTIME_CONNECT": _bool,
    "NCCL_WORK_FIFO_BYTES": _int_range(1),
    "NCCL_DEBUG": _one_of(("VERSION", "WARN", "INFO", "TRACE", "ABORT"), case_insensitive=True),
    # Free-form values NCCL accepts; known so they are not flagged as typos.
    "NCCL_DEBUG_SUBSYS": _any,
    "NCCL_DEBUG_FILE": _any,
    "NCCL_SOCKET_IFNAME": _any,
    "NCCL_IB_HCA": _any,
    "NCCL_TOPO_FILE": _any,
    "NCCL_TOPO_DUMP_FILE": _any,
    "NCCL_GRAPH_FILE": _any,
    "NCCL_GRAPH_DUMP_FILE": _any,
    "NCCL_CONF_FILE": _any,
    "NCCL_NET": _any,
    "NCCL_NET_PLUGIN": _any,
    # a tuner plugin library and the rules file commdiag's plugin reads (NCCL itself does not read the
    # second); a sweep spec must give both as absolute paths to existing files (formats/spec.py)
    "NCCL_TUNER_PLUGIN": _any,
    "NCCL_TUNER_CONFIG_FILE": _any,
    "NCCL_ALGO_THRESHOLD": _any,
    "NCCL_IGNORE_CPU_AFFINITY": _bool,
    "NCCL_SET_THREAD_NAME": _bool,
    "NCCL_ASYNC_ERROR_HANDLING": _any,
    "NCCL_BLOCKING_WAIT": _any,
    "NCCL_COMM_BLOCKING": _bool,
    "NCCL_NCHANNELS_PER_NET_PEER": _int_range(1),
}

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Longest value accepted: far above any real setting, far below the kernel's 128 KiB per
# environment string (a longer one fails every exec with E2BIG).
MAX_VALUE = 4096
# C0 controls, DEL, C1 controls and the Unicode line separators (str.splitlines breaks on them)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def check_setting(name: str, value: str) -> tuple[str | None, str | None]:
    """Return ``(error, warning)`` for one ``NAME=VALUE`` setting; both None when fine."""
    if not _NAME.match(name):
        return f"{brief(name)} is not a valid environment variable name (letters, digits, _)", None
    if _CONTROL.search(value):
        # NUL, newline, a lone CR, ... : one of sh, systemd, NCCL's conf reader or a terminal
        # would read it differently from the others, so no target can carry it safely
        return "value contains a control character (NUL, newline, CR, ...)", None
    if len(value) > MAX_VALUE:
        return f"value is {len(value)} characters, more than {MAX_VALUE}", None
    check = CHECKS.get(name)
    if check is not None:
        return check(value), None
    if name.startswith("NCCL_"):
        close = difflib.get_close_matches(name, CHECKS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return None, f"{name} is not an NCCL variable commdiag knows{hint}; passing it through"
    return None, None
