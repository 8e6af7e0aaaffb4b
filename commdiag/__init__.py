"""commdiag: NCCL/PCIe communication diagnostics.

Did the NCCL settings arrive, did NCCL apply them, do they help at my message
sizes by more than the noise, and are they installed so that they survive a
restart.  The package is a library; ``commdiag.cli`` is a thin click layer.

Its parts, one subpackage each:
    formats/      the on-disk formats: spec, run folder (results), profile
    measure/      sweeps of fresh torchrun launches: sweep, launcher, worker, nccldirect, runlock, explain
    analyse/      stored results to answers: stats, screening, certify, verdict, report, compare,
                  celltime (the one time per cell), sweeptable, steptable
    environment/  did the settings arrive: envcheck, propagation, pyprobe, detect, topology, doctor
    install/      persisting settings: hook, hookplan, hookstate, hookcheck, hooktext, systemd
    nccl/         NCCL's vocabulary: ncclvars (its variables), ncclog (its log)
    tuner/        commdiag's NCCL tuner plugin (C), its build and its rules format
    p2p/          commdiag p2p: every GPU pair measured in supervised probe processes, checked, rendered
and at the top: cli, errors, atomic (the one output writer), readfile (run folders read, never
waited on), metadata (fingerprints), linewrap (every printed line fits 100 columns).
"""

import os as _os

__version__ = "0.1.0"
# The folder that holds this package: child processes commdiag starts (torchrun workers, probes)
# put it on their path so they import this very commdiag.
PACKAGE_PARENT = _os.path.dirname(_os.path.dirname(_os.path.realpath(__file__)))


def check_env(expect=None, **kwargs):
    """Check this process's NCCL environment against ``expect`` (NAME -> VALUE); returns an ``EnvCheck``.

    Never prints, never imports torch.  For the top of a worker (e.g. an SGLang scheduler)::

        import commdiag, logging; logging.getLogger("commdiag").warning("%s", commdiag.check_env({"NCCL_PROTO": "LL"}))

    ``str(result)`` is one line; ``result.ok`` and ``result.to_json()`` for code.  Without
    ``expect`` (or ``profile=PATH``) the installed commdiag hook's settings are expected.
    """
    from .environment.envcheck import check_env as _check_env

    return _check_env(expect, **kwargs)
