"""What a launch server reads from the environment before it forks, measured (docs/launch-methods.md).

Runs one real launch server's whole start (``python -P -m commdiag.measure.forkserver``: its imports
of torch, torch.distributed and the worker) under a getenv/secure_getenv interposer (C, compiled
here with cc, loaded by LD_PRELOAD) and the server's own os.environ spy (afterfork.EnvironSpy, whose
finding the server reports in its ``ready`` message), then checks the proof:

* no candidate the server lets a child change after the fork (afterfork.Proof.safe) was read, at
  the C level or the Python level;
* every candidate read at the C level is in afterfork.C_LEVEL_READS for this torch build (the
  committed list is not stale), and the build has such a list.

    python3 benchmarks/import_env.py OUT_DIR      # exit 0: the proof holds; 1: it does not (says why)

OUT_DIR gets ``import-env.json`` (torch build, every name read at the C level and through
os.environ, the candidates among them, the verdict) and the interposer's raw log.
tests/test_import_env.py runs it on the CPU build; benchmarks/gpu_import_env.sh on the CUDA build.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from commdiag import procs  # noqa: E402
from commdiag.childpython import module_argv  # noqa: E402
from commdiag.measure import afterfork  # noqa: E402

# The interposer: every getenv/secure_getenv call through the dynamic linker, with the caller's pid
# (a forked child inherits LD_PRELOAD and the log), one line each, to the file named by GE_LOG.
INTERPOSER_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static char *(*real)(const char *) = 0;
static char *(*real_s)(const char *) = 0;
static FILE *logf = 0;
static void logit(const char *tag, const char *n) {
  if (!logf) {
    if (!real) real = dlsym(RTLD_NEXT, "getenv");
    const char *p = real ? real("GE_LOG") : 0;
    if (p) logf = fopen(p, "a");
  }
  if (logf && n) { fprintf(logf, "%d %s %s\n", (int)getpid(), tag, n); fflush(logf); }
}
char *getenv(const char *n) { if (!real) real = dlsym(RTLD_NEXT, "getenv"); logit("getenv", n); return real(n); }
char *secure_getenv(const char *n) {
  if (!real_s) real_s = dlsym(RTLD_NEXT, "secure_getenv"); logit("secure_getenv", n); return real_s(n);
}
"""


def build_interposer(folder: Path) -> Path:
    src, lib = folder / "ge.c", folder / "ge.so"
    src.write_text(INTERPOSER_C)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc) on PATH: the getenv interposer cannot be built")
    done = procs.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(src), "-ldl"], env=None, cwd=folder,
                     deadline_s=120)
    if done.exit_code != 0:
        raise RuntimeError(f"{cc} could not build the interposer: {done.stderr[-2000:].decode(errors='replace')}")
    return lib


def server_start(folder: Path, env: dict[str, str] | None = None, timeout_s: float = 300,
                 launches: list[dict[str, str]] = ()) -> dict:
    """One launch server's start under the interposer: its ``ready`` message and the names it read.
    Then, for each of ``launches`` (the variables to change from its start environment), a launch
    command (plan: none, so a child the server forks exits 1 at once) and the replies; then EOF, as
    commdiag ends a server.  The result's ``start_env`` is the server's start environment."""
    folder.mkdir(parents=True, exist_ok=True)
    lib = build_interposer(folder)
    log = folder / "getenv.log"
    log.write_text("")
    env = dict(os.environ if env is None else env)
    env.pop("LD_PRELOAD", None)
    env.update({procs.MARKER: procs.new_marker()}, LD_PRELOAD=str(lib), GE_LOG=str(log),
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p))
    # no parent-death wrapper: its own interpreter would run under the interposer with the server's pid
    server = procs.start(module_argv("commdiag.measure.forkserver"), env=env, cwd=folder, marker=env[procs.MARKER],
                         stdin=procs.PIPE, stdout=procs.PIPE, stderr=folder / "server.stderr", parent_death=None)
    proc = server.proc
    replies = []
    try:
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        line = proc.stdout.readline() if ready else b""
        for n, change in enumerate(launches):
            cmd = {"launch": n, "env": {**env, **change}, "plan": str(folder / "no-plan.json"),
                   "log": str(folder / f"launch{n}.log")}
            proc.stdin.write((json.dumps(cmd) + "\n").encode())
            proc.stdin.flush()
            got = [json.loads(proc.stdout.readline())]
            if "started" in got[0]:
                got.append(json.loads(proc.stdout.readline()))  # its exit
            replies.append(got)
        proc.stdin.close()
        server.wait(60)
    finally:
        server.stop((), sweep=True)  # nothing of it outlives the measurement
        server.close()
    try:
        msg = json.loads(line)
    except ValueError:
        raise RuntimeError(f"the server did not start: {(folder / 'server.stderr').read_text()[-2000:]}")
    c_names = set()
    for entry in log.read_text().splitlines():
        pid, _, name = entry.split(" ", 2)
        if int(pid) == proc.pid:
            c_names.add(name)
    c_names.discard("GE_LOG")  # the interposer's own
    return {"ready": msg, "c_reads": sorted(c_names), "pid": proc.pid, "replies": replies, "start_env": env}


def judge(start: dict) -> dict:
    """The proof's verdict on one server start (``server_start``'s result)."""
    proof = afterfork.Proof.from_json(start["ready"]["proof"])
    c_reads = start["c_reads"]
    c_candidates = sorted(n for n in c_reads if afterfork.is_candidate(n))
    listed = afterfork.C_LEVEL_READS.get(proof.torch)
    problems = []
    safe_read = sorted(n for n in set(c_reads) | set(proof.python_reads) if proof.safe(n))
    if safe_read:
        problems.append(f"the server lets a child change {', '.join(safe_read)}, read before the fork")
    if listed is None:
        problems.append(f"torch {proof.torch} has no C-level list (afterfork.C_LEVEL_READS): add "
                        f"{json.dumps(proof.torch)}: frozenset({c_candidates!r})")
    elif set(c_candidates) - listed:
        problems.append(f"afterfork.C_LEVEL_READS[{proof.torch!r}] misses {sorted(set(c_candidates) - listed)}, "
                        "read at the C level before the fork")
    return {"format": "commdiag-import-env", "version": 1, "torch": proof.torch, "python": sys.version.split()[0],
            "c_reads": c_reads, "c_read_count": len(c_reads), "c_candidates": c_candidates,
            "python_read_count": proof.names_read, "python_candidates": proof.python_reads,
            "enumerated": proof.enumerated, "listed": sorted(listed) if listed is not None else None,
            "problems": problems, "holds": not problems}


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "import-env-out")
    t0 = time.monotonic()
    result = judge(server_start(out))
    result["wall_s"] = round(time.monotonic() - t0, 1)
    (out / "import-env.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"torch {result['torch']}: {result['c_read_count']} names read at the C level "
          f"({len(result['c_candidates'])} candidates: {result['c_candidates']}), "
          f"{result['python_read_count']} through os.environ ({len(result['python_candidates'])} candidates: "
          f"{result['python_candidates']}); os.environ walked whole at {result['enumerated'] or 'nowhere'}")
    for p in result["problems"]:
        print("PROOF FAILS:", p)
    print("IMPORT-ENV PROOF:", "PASS" if result["holds"] else "FAIL", f"({out / 'import-env.json'})")
    return 0 if result["holds"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
