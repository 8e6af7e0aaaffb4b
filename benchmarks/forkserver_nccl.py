"""GPU proof for ``launch: forkserver`` (run by benchmarks/gpu_forkserver.sh; needs CUDA and NCCL).

    python3 benchmarks/forkserver_nccl.py env OUT_DIR        # proof 1: NCCL's ENV/INIT lines, both methods
    python3 benchmarks/forkserver_nccl.py overhead OUT_DIR N # per-launch overhead, N launches per method

Both run the real worker one rank at a time (nproc 1, GPU 0), calling the library below the sweep's
preflight (which refuses fewer than 2 ranks: a 1-rank all-reduce measures nothing, but a 1-rank
ncclCommInitRank still reads and logs every NCCL_* variable).  ``env``: the seed config's six NCCL_*
variables (PROTO, ALGO, P2P_LEVEL, MAX_NCHANNELS, BUFFSIZE, NTHREADS) under a fresh torchrun launch
(launcher.launch_worker) and a forked child of a launch server (serverpool.ServerPool), NCCL_DEBUG=INFO
with SUBSYS=ENV,INIT into the launch folder; then compare_nccl_logs compares the two.  A launch
server ran one default launch before the seed one, so a value cached by the server would show.
``overhead``: launches alternated between the methods, each wall minus its measuring (measure_s).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from commdiag.measure import launcher, serverpool  # noqa: E402

SEED = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}


# FS_PROOF_BACKEND=gloo: a dry run of this script's machinery on CPU (no NCCL log: proof 1 then fails)
BACKEND = os.environ.get("FS_PROOF_BACKEND", "nccl")


def plan(folder: Path, config_env: dict) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    return {"backend": BACKEND, "dtype": "bfloat16" if BACKEND == "nccl" else "float32", "sizes": [8192],
            "modes": ["eager"], "warmup": 5, "iters": 20, "batch": "auto", "window_us": 500,
            "vias": ["torch", "nccl-direct"] if BACKEND == "nccl" else ["torch"],
            "replay_stream": "side", "watch_env": sorted(config_env), "out_dir": str(folder.resolve()),
            "config": "x", "launch": 0, "nccl_debug_file": str(folder.resolve() / "nccl.%h.%p.log")}


def debug_env(folder: Path) -> dict:
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ENV,INIT",
            "NCCL_DEBUG_FILE": str(folder.resolve() / "nccl.%h.%p.log")}


def run_torchrun(folder: Path, config_env: dict, base: dict) -> launcher.LaunchOutcome:
    p = plan(folder, config_env)
    outcome, _ = launcher.launch_worker(folder, p, base_env=base, config_env=config_env,
                                        extra_env=debug_env(folder), nproc=1, nnodes=1, rdzv_endpoint=None,
                                        rdzv_id="fs-proof", deadline_s=300)
    return outcome


def run_fork(pool: serverpool.ServerPool, folder: Path, config_env: dict, index: int) -> launcher.LaunchOutcome:
    p = plan(folder, config_env)
    (folder / "plan.json").write_text(json.dumps(p))
    return pool.launch(index, config_env, debug_env(folder), folder / "plan.json", 300)


def _check(outcome, folder: Path) -> dict:
    if outcome.exit_code != 0:
        logs = [f.read_text(errors="replace")[-3000:] for f in folder.glob("*.log")]
        raise SystemExit(f"launch in {folder} failed: {outcome}\n" + "\n".join(logs))
    return json.loads((folder / "result.json").read_text())["ranks"][0]


def env_proof(out: Path) -> int:
    from compare_nccl_logs import compare

    base = dict(os.environ)
    run_torchrun(out / "torchrun-default", {}, base)
    _check(run_torchrun(out / "torchrun", SEED, base), out / "torchrun")
    pool = serverpool.ServerPool(1, base)
    try:
        _check(run_fork(pool, out / "forkserver-default", {}, 0), out / "forkserver-default")
        _check(run_fork(pool, out / "forkserver", SEED, 1), out / "forkserver")
    finally:
        pool.close()
    return compare(out / "torchrun", out / "forkserver", SEED, out / "compare.json")


def overhead(out: Path, n: int) -> int:
    base = dict(os.environ)
    rows = {"torchrun": [], "forkserver": []}
    pool = serverpool.ServerPool(1, base)
    t_pool = time.monotonic()
    try:
        for i in range(n):
            for method in (("torchrun", "forkserver") if i % 2 == 0 else ("forkserver", "torchrun")):
                folder = out / f"{method}-{i}"
                outcome = (run_torchrun(folder, {}, base) if method == "torchrun"
                           else run_fork(pool, folder, {}, i))
                r = _check(outcome, folder)
                rows[method].append({"wall_s": outcome.wall_s, "measure_s": r["measure_s"],
                                     "overhead_s": outcome.wall_s - r["measure_s"], "first": i == 0})
    finally:
        pool.close()
    lines = [f"per-launch overhead (wall - measure_s), 1 rank on GPU 0, {n} launches per method, alternated"]
    for method, rs in rows.items():
        later = [r["overhead_s"] for r in rs if not r["first"]] or [rs[0]["overhead_s"]]
        lines.append(f"  {method:10s} first launch {rs[0]['overhead_s']:.2f} s"
                     + (" (includes starting the launch server)" if method == "forkserver" else "")
                     + f"; later: median {statistics.median(later):.2f} s, range {min(later):.2f}-{max(later):.2f}"
                     f" s, n={len(later)}")
    text = "\n".join(lines)
    print(text)
    (out / "overhead.txt").write_text(text + "\n")
    (out / "overhead.json").write_text(json.dumps(rows, indent=1))
    return 0


def main() -> int:
    what, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if what == "env":
        return env_proof(out)
    if what == "overhead":
        return overhead(out, int(sys.argv[3]) if len(sys.argv) > 3 else 5)
    raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
