"""Which variables a forked launch child may take after the fork, and the server's proof of it.

A launch server (forkserver.py) imports torch before it forks; whatever the import read from the
environment keeps the server's value in every child (``import torch.distributed`` reads
TORCH_DISTRIBUTED_DEBUG: a child that sets it afterwards still runs with the server's level).  So
a child may receive after the fork only a variable that nothing read before the fork, and every
other variable of a launch must already be in its server's start environment (serverpool.py keys
its servers by exactly that).

A variable may be changed after the fork when it is a *candidate* and the server proved that it
was not read before the fork.  Only candidates are ever changed after a fork: everything else (the
loader's, Python's, OpenMP's, torch's own switches, a user's LD_PRELOAD) is in the server's start
environment, whether or not anything is known to read it.  Two kinds of candidates:

* ``PYTHON_READ_NAMES``: read only by Python code in the child (the rendezvous variables torchrun
  gives a worker, read by ``init_process_group``'s env:// handler and the worker; commdiag's
  per-call test switch).  Their proof is ``EnvironSpy``: it wraps ``os.environ``'s reads from the
  server's first line to the fork, live, in every server;
* ``C_READ_PREFIXES`` (``NCCL_``, ``TORCH_NCCL_``): read by C/C++ code (NCCL at its first use,
  ProcessGroupNCCL when the group is made).  Their proof is the spy (CUDA torch 2.11 reads
  NCCL_NVLS_ENABLE through os.environ at import) plus a C-level list measured per torch build
  under a getenv/secure_getenv interposer (``C_LEVEL_READS``; tests/test_import_env.py measures the
  CPU build here, benchmarks/gpu_import_env.sh the CUDA build).  A server whose torch build has no
  list proves nothing at the C level and lets a child change none of them: each distinct set of
  NCCL_* values then gets servers of its own (exact; one ``import torch`` per distinct environment).

The C-level list cannot go stale silently for the builds it names: the test runs the server's
whole start under the interposer and fails when a candidate read at the C level is missing from it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

# Each with why it is read only after the fork (docs/launch-methods.md has the table).
C_READ_PREFIXES = (
    "NCCL_",        # NCCL's own (ncclGetEnv / NCCL_PARAM): read at NCCL's first use, in the child
    "TORCH_NCCL_",  # ProcessGroupNCCL's: read when the process group is constructed, in the child
)
PYTHON_READ_NAMES = frozenset({
    # what torchrun's agent gives each worker: read by init_process_group(env://) and the worker
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
    "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "COMMDIAG_TEST_FAULT",  # commdiag's test switch, read by the worker at each call
})

# torch build (torch.__version__) -> the candidates its libraries read at the C level during a launch
# server's start (getenv/secure_getenv under the interposer of tests/test_import_env.py).  Empty: none.
C_LEVEL_READS: dict[str, frozenset[str]] = {
    # tests/test_import_env.py, 2026-12-04, the development venv (116 names read in all, no candidate)
    "2.13.0+cpu": frozenset(),
    # 1x H200, torch 2.11.0+cu130 (../shared/design/import-env/c-getenv-import-cuda.txt: 138 names, no
    # candidate; benchmarks/gpu_import_env.sh measures it again and fails if that changed)
    "2.11.0+cu130": frozenset(),
}


def is_candidate(name: str) -> bool:
    return name in PYTHON_READ_NAMES or name.startswith(C_READ_PREFIXES)


class EnvironSpy:
    """Records every name read through ``os.environ`` (and ``os.environb``): ``[]``, ``get``,
    ``in``, ``os.getenv`` all go through ``__getitem__`` or ``__contains__``; a walk over the whole
    mapping (``copy()``, ``dict(os.environ)``, ``items()``) is recorded as ``enumerated``, where it
    happened.  A set insert per read: cheap enough for every server start."""

    _WRAPPED = ("__getitem__", "__contains__", "__iter__")

    def __init__(self):
        self.read: set[str] = set()
        self.enumerated: list[str] = []
        self._saved: dict[str, object] = {}

    def install(self) -> "EnvironSpy":
        cls = type(os.environ)
        self._saved = {name: cls.__dict__.get(name) for name in self._WRAPPED}
        getitem, iterate = cls.__getitem__, cls.__iter__
        contains = cls.__contains__
        spy = self

        def _name(key) -> str:
            return key.decode("utf-8", "surrogateescape") if isinstance(key, bytes) else str(key)

        def spy_getitem(env, key):
            spy.read.add(_name(key))
            return getitem(env, key)

        def spy_contains(env, key):
            spy.read.add(_name(key))
            return contains(env, key)

        def spy_iter(env):
            if len(spy.enumerated) < 20:
                spy.enumerated.append(_caller())
            return iterate(env)

        cls.__getitem__, cls.__contains__, cls.__iter__ = spy_getitem, spy_contains, spy_iter
        return self

    def uninstall(self) -> None:
        cls = type(os.environ)
        for name, fn in self._saved.items():
            if fn is None:
                try:
                    delattr(cls, name)
                except AttributeError:
                    pass
            else:
                setattr(cls, name, fn)
        self._saved = {}


def _caller() -> str:
    """file:line of the first frame outside os.py, _collections_abc.py and this file."""
    skip = {os.__file__, __file__, getattr(sys.modules.get("_collections_abc"), "__file__", ""),
            "<frozen os>", "<frozen _collections_abc>"}
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename in skip:
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"


@dataclass
class Proof:
    """What one launch server proved about the candidates: ``safe(name)`` is True when a child
    of it may take ``name`` after the fork."""

    torch: str
    measured: bool  # the torch build has a C-level list (C_LEVEL_READS)
    c_reads: list[str] = field(default_factory=list)       # candidates read at the C level (the list)
    python_reads: list[str] = field(default_factory=list)  # candidates read through os.environ
    enumerated: list[str] = field(default_factory=list)    # where os.environ was walked whole
    names_read: int = 0  # every name the spy saw read (candidates or not): the spy was in place

    @classmethod
    def of_server(cls, spy: EnvironSpy, torch_version: str) -> "Proof":
        listed = C_LEVEL_READS.get(torch_version)
        return cls(torch=torch_version, measured=listed is not None, c_reads=sorted(listed or ()),
                   python_reads=sorted(n for n in spy.read if is_candidate(n)), enumerated=list(spy.enumerated),
                   names_read=len(spy.read))

    def safe(self, name: str) -> bool:
        if not is_candidate(name) or name in self.python_reads:
            return False
        if name in PYTHON_READ_NAMES:  # no C code reads it: the spy is the whole proof
            return True
        return self.measured and name not in self.c_reads

    def differing_unsafe(self, start_env: dict[str, str], env: dict[str, str], ignore=()) -> list[str]:
        """The names whose value in ``env`` differs from ``start_env`` (set, changed or unset) and
        that a child of this server may not take after the fork."""
        names = set(start_env) | set(env)
        return sorted(n for n in names if start_env.get(n) != env.get(n) and not n.startswith(tuple(ignore))
                      and not self.safe(n))

    def to_json(self) -> dict:
        return {"torch": self.torch, "measured": self.measured, "c_reads": self.c_reads,
                "python_reads": self.python_reads, "enumerated": self.enumerated,
                "names_read": self.names_read}

    @classmethod
    def from_json(cls, data: dict) -> "Proof":
        return cls(torch=str(data.get("torch", "?")), measured=bool(data.get("measured")),
                   c_reads=list(data.get("c_reads", [])), python_reads=list(data.get("python_reads", [])),
                   enumerated=list(data.get("enumerated", [])),
                   names_read=int(data.get("names_read", 0)))
