"""The library entry of ``commdiag p2p``: ``measure()`` every visible GPU and pair, ``load()`` a
saved result, ``write_html()`` its page.  Nothing here prints; the CLI renders."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import socket
import time
from dataclasses import asdict
from pathlib import Path

from ..errors import CommdiagError
from . import supervise
from .assemble import assemble
from .result import P2PResult, Settings, load  # noqa: F401  (load: part of this API)


def measure(settings: Settings | None = None, on_job=None, env: dict | None = None,
            start_timeout_s: float = supervise.START_TIMEOUT_S) -> P2PResult:
    """Measure every visible GPU's host link and every pair, each job under its own deadline.

    Raises CommdiagError (exit 2) when no CUDA GPU is visible.  ``on_job(JobOutcome)`` is called
    as each job ends (progress lines)."""
    settings = settings or Settings()
    fake = "p2p-fake" in ((env if env is not None else os.environ).get("COMMDIAG_TEST_FAULT") or "")
    if not fake and not _driver_loads():  # seconds sooner than a probe that imports torch to find out
        raise CommdiagError(_no_gpu("no NVIDIA driver (libcuda.so.1 cannot be loaded)"))
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    t0 = time.monotonic()
    sup = supervise.supervise(asdict(settings), settings.pair_timeout_s, start_timeout_s, env=env, on_job=on_job)
    hello = sup.hello or {}
    if not hello.get("count"):
        raise CommdiagError(_no_gpu(hello.get("reason") or "torch sees no CUDA device"))
    environment = {"host": socket.gethostname(), "started": started, "probes": sup.probes,
                   "processes_killed": sup.killed, "processes_stuck": sup.stuck}
    res = assemble(hello, sup.outcomes, settings, environment, round(time.monotonic() - t0, 2))
    if sup.stuck:  # a hung copy can hold a process in the driver where no signal reaches it
        note = (f"probe process(es) {', '.join(map(str, sup.stuck))} did not end after SIGKILL: stuck in the "
                "driver on a hung copy; they end when the driver lets go (a GPU reset or a reboot may be needed)")
        res = dataclasses.replace(res, notes=res.notes + (note,))
    return res


def _driver_loads() -> bool:
    """Whether the CUDA driver library loads (dlopen only: no CUDA call, nothing that can hang)."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def _no_gpu(reason: str) -> str:
    """The one error without GPUs, in lines that fit 100 columns after "commdiag: error: "."""
    import textwrap

    why = textwrap.wrap(f"why: {reason}", 96, subsequent_indent="    ")
    return "\n".join(["commdiag p2p: no CUDA GPU to measure.", *("  " + w for w in why),
                      "  p2p measures copies between GPUs and to the host: run it on the GPU machine with the",
                      "  Python whose torch has CUDA (python3 -c 'import torch; print(torch.cuda.device_count())')."])


def check_html(path: str | Path) -> None:
    """Before measuring: the --html target is writable and plotly is there (a minute of measuring
    must not end in an import error)."""
    from ..atomic import check_target

    check_target(path)
    try:
        import plotly  # noqa: F401
    except ImportError:
        raise CommdiagError(f"{path}: --html needs plotly (pip install plotly); or save --json here and "
                            "render it where plotly is: commdiag p2p --from FILE --html PAGE") from None


def write_html(res: P2PResult, path: str | Path) -> Path:
    from ..atomic import write_text
    from .page import build_html

    write_text(path, build_html(res))
    return Path(path)
