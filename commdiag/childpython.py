"""How commdiag starts another Python interpreter without importing code from the wrong place.

A Python started with ``-c`` puts the current folder (``''``) first on ``sys.path``; one started
with ``-m`` or with a script puts that folder, or the script's, there.  A ``json.py``, ``os.py``
or ``runpy.py`` in the folder commdiag was started from would then be imported instead of the
standard library's: under ``sudo``, a local user's code run as root.  Every interpreter commdiag
starts is started through this module:

* ``PATH_GUARD`` opens every ``-c`` script that runs in an interpreter commdiag does not control
  (a ``--python`` target, Python 3.8+, whose flags may not include ``-P``).  It uses builtins only
  and the ``sys`` module every interpreter has loaded before it runs a line (no file is read):
  it drops ``''`` and every relative entry from ``sys.path`` and leaves only the interpreter's
  standard library there, so the script's own imports come from nowhere else.  The script
  puts ``_commdiag_path`` (the path without the folder) back where it needs to search it.
* ``module_argv``: ``python -P -m MODULE`` (3.11+), or on 3.10 a ``-c`` runner that drops the
  folder from ``sys.path`` before ``runpy`` imports anything.
* ``isolated_argv``: ``python -I -c`` for commdiag's own scripts that need nothing from the
  environment's ``PYTHON*`` variables or the user site.
* ``child_env``: as root, the ``PYTHON*`` variables inherited from the caller's environment
  (``sudo -E``: the user's ``PYTHONPATH``, ``PYTHONHOME``, ``PYTHONSTARTUP``) are not passed on.

A child that runs a script *file* commdiag wrote gets a private temporary folder as its working
directory, so the folder a ``multiprocessing`` spawn child puts first is that one.
"""

from __future__ import annotations

import os
import sys

# Runs first in another interpreter (Python 3.8+ syntax; no import that reads a file).
PATH_GUARD = (
    "import sys\n"
    "_commdiag_path = [p for p in sys.path if p]\n"
    "_commdiag_std = getattr(sys.modules.get('encodings'), '__path__', [''])[0].rpartition('/')[0]\n"
    "sys.path[:] = [p for p in _commdiag_path if _commdiag_std and "
    "(p == _commdiag_std or p.startswith(_commdiag_std + '/'))]\n"
)

# Python 3.10 has no -P: drop the folder runpy's -m would search first, then run the module as -m does.
_RUN_MODULE = (
    "import sys\n"
    "sys.path[:] = [p for p in sys.path if p[:1] == '/']\n"
    "_name = sys.argv.pop(1)\n"
    "import runpy\n"
    "runpy._run_module_as_main(_name)\n"
)


def guarded(source: str) -> str:
    """``source`` (a ``-c`` script for another interpreter) behind ``PATH_GUARD``."""
    return PATH_GUARD + source


def module_argv(module: str, args=(), *, python: str | None = None, safe_path_flag: bool | None = None) -> list:
    """``python -m module args`` that never imports from the current folder.

    ``safe_path_flag``: use ``-P`` (default: when this interpreter is 3.11+, which has it)."""
    python = python or sys.executable
    if safe_path_flag is None:
        safe_path_flag = sys.version_info >= (3, 11)
    if safe_path_flag:
        return [python, "-P", "-m", module, *args]
    return [python, "-c", _RUN_MODULE, module, *args]


def isolated_argv(code: str, args=(), *, python: str | None = None) -> list:
    """``python -I -c code args``: no folder, no ``PYTHON*`` variables, no user site."""
    return [python or sys.executable, "-I", "-c", code, *args]


def child_env(env: dict | None = None, **extra: str) -> dict:
    """The environment for a child interpreter: ``env`` (default: this process's) plus ``extra``.

    As root, ``PYTHON*`` variables inherited from this process's environment are dropped: they
    choose which code an interpreter loads (``PYTHONPATH``, ``PYTHONHOME``, ``PYTHONSTARTUP``),
    and under ``sudo -E`` they are the invoking user's.  An ``env`` given explicitly is kept as it
    is: the caller chose it."""
    if env is None:
        env = dict(os.environ)
        if os.geteuid() == 0:
            env = {k: v for k, v in env.items() if not k.startswith("PYTHON")}
    return {**env, **extra}
