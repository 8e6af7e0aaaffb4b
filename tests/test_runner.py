"""The run-folder engine's pending loop (measure/runner.py) around a Ctrl-C."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_pending_loop_imports_the_tables_library_before_the_first_launch(tmp_path):
    """A Ctrl-C inside numpy's first import leaves it half-initialised, and the run's end (which needs
    pandas) then fails instead of saving an interrupted run: runner.run_pending imports pandas before any
    launch, where a Ctrl-C is an ordinary abort.  Checked in a fresh interpreter (this one has pandas)."""
    code = (
        "import sys\n"
        "from commdiag.measure import runner\n"
        "assert 'pandas' not in sys.modules, 'imported too early to tell'\n"
        "seen = []\n"
        "f = runner.Folder.__new__(runner.Folder)\n"
        "f.run = {'launches': [{'index': 0, 'status': 'pending'}]}\n"
        "f.save = lambda: None\n"
        "def one(batch):\n"
        "    seen.append('pandas' in sys.modules)\n"
        "    batch[0]['status'] = 'ok'\n"
        "    return 1.0\n"
        "f.run_pending(one, keys=('index',))\n"
        "print(seen)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[True]", p.stdout
