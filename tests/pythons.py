"""Which interpreters the hook and probe tests build their venvs from.

Some tests need a venv that loads its *own* site-packages/sitecustomize.py.  A venv of Debian's or
Ubuntu's /usr/bin/python3.X never does: /usr/lib/python3.X/sitecustomize.py comes first on
sys.path (the shadowing case, tested on its own).  So those tests must not assume that the
project's Python (sys.executable) is such an interpreter: ``plain_python()`` finds one whose
standard library has no sitecustomize, starting with the project's, and the test is skipped
(naming why) only on a machine that has none.
"""

from __future__ import annotations

import functools
import glob
import os
import subprocess
import sys

import pytest

_CANDIDATES = [sys.executable, getattr(sys, "_base_executable", sys.executable),
               *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3")), reverse=True),
               *sorted(glob.glob("/usr/local/bin/python3.1[0-9]"), reverse=True),
               *sorted(glob.glob("/opt/*/bin/python3"))]

# -I -S: only the standard library is on sys.path, exactly what comes before a venv's site-packages
_STDLIB_SITECUSTOMIZE = ("import importlib.util, sys\n"
                         "s = importlib.util.find_spec('sitecustomize')\n"
                         "print(s.origin if s else '')\n"
                         "sys.exit(0 if sys.version_info >= (3, 8) else 1)\n")


@functools.lru_cache(maxsize=None)
def _shadows(python: str) -> bool | None:
    """True: the stdlib ships a sitecustomize; False: venvs load their own; None: not usable."""
    try:
        cp = subprocess.run([python, "-I", "-S", "-c", _STDLIB_SITECUSTOMIZE], capture_output=True, text=True,
                            timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return None if cp.returncode else bool(cp.stdout.strip())


@functools.lru_cache(maxsize=None)
def _plain() -> str | None:
    for python in dict.fromkeys(p for p in _CANDIDATES if p and os.path.exists(p)):
        if _shadows(python) is False:
            return python
    return None


def plain_python() -> str:
    """An interpreter whose venvs load their own sitecustomize (the project's when it qualifies)."""
    python = _plain()
    if python is None:
        pytest.skip("every Python here ships a sitecustomize in its standard library (Debian/Ubuntu), so "
                    "none of their venvs loads its own; the shadowing tests cover this machine")
    return python


def project_shadows() -> bool:
    """Is the project's Python one whose venvs never load their own sitecustomize?"""
    return bool(_shadows(sys.executable))
