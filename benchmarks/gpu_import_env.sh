#!/usr/bin/env bash
# The proof that a forked launch is exact (docs/launch-methods.md, "What a child may change after the
# fork"), on the CUDA build of torch: one real launch server's whole start (import torch,
# torch.distributed, the worker) under a getenv/secure_getenv interposer and the server's own
# os.environ spy (benchmarks/import_env.py).  It fails when a variable the server lets a child
# change after the fork was read before it, or when afterfork.C_LEVEL_READS has no (or a stale)
# entry for this torch build; then it prints the entry to commit.  About 30 s on 1x H200.
#   bash benchmarks/gpu_import_env.sh
# Leaves $OUT/import-env/import-env.json (every name read at the C level and through os.environ,
# the candidates among them, the verdict), the interposer's raw log and the server's stderr.
set -u
. "$(dirname "$0")/gpu_env.sh"  # multicast off (NCCL_NVLS_ENABLE=0: CUDA torch reads it at import), this checkout first
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/import-env"
python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)' | tee "$OUT/import-env/versions.txt"
command -v cc || command -v gcc || { echo "no C compiler: apt-get install -y gcc"; exit 2; }
python3 benchmarks/import_env.py "$OUT/import-env"; rc=$?
python3 - "$OUT/import-env/import-env.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("C-level candidates:", d["c_candidates"], "| Python-level candidates:", d["python_candidates"])
print("os.environ walked whole at:", d["enumerated"][:5])
print("C_LEVEL_READS entry for commdiag/measure/afterfork.py:", json.dumps(d["torch"]) + ": frozenset(" + repr(d["c_candidates"]) + "),")
PY
exit $rc
