#!/usr/bin/env bash
# `commdiag explain RUN` on the run-folder engine (measure/runner.py), on a real GPU with real NCCL:
#   OUT=/tmp/out bash benchmarks/gpu_explain_run_folder.sh      # about 1-2 minutes, one GPU
# The run folder is what a sweep writes before its first launch (sweep.new_run), one rank per launch,
# so it fits a 1-GPU box (explain needs no second rank to start NCCL; with one rank NCCL may print no
# TUNING lines, which explain then says: "no-tuning-lines").  What it records:
#   1. explain with the folder's lock held by another process: refused at once, naming the holder;
#   2. explain, Ctrl-C (SIGINT) once its first launch is up: exit 130, that launch pending again in
#      run.json's explain_launches, no process left carrying its marker;
#   3. explain again: runs what is pending and completes (exit 0), run.json gets its explain section.
set -u
. "$(dirname "$0")/gpu_env.sh"  # multicast off, carried wheels, this checkout first
OUT=${OUT:-/tmp/out}; T=/tmp/explain-rf; rm -rf $T; mkdir -p "$OUT" $T
finish() { tar czf "$OUT/explain-run-folder.tgz" -C /tmp explain-rf; cp $T/summary.txt "$OUT/explain-run-folder-summary.txt" 2>/dev/null; }
trap finish EXIT
cat > $T/spec.yaml <<'YAML'
name: explain-rf
backend: nccl
nproc_per_node: 1
dtype: float32
sizes: {bytes: [14336, 1835008]}
trials: 1
timeout_s: 120
configs:
  ll: {NCCL_PROTO: LL}
YAML
python3 - "$T" <<'PY'
import sys
from pathlib import Path
from commdiag.formats import results
from commdiag.formats.spec import load_spec
from commdiag.measure import sweep
t = Path(sys.argv[1])
spec = load_spec(t / "spec.yaml")
(t / "run").mkdir()
results.save_run(t / "run", sweep.new_run(spec, t / "run", 1))
PY
state() {  # the explain launches' statuses and markers, and the processes still carrying a marker
  python3 - "$T/run" <<'PY'
import json, sys
from commdiag.measure import launcher
run = json.load(open(sys.argv[1] + "/run.json"))
for l in run.get("explain_launches") or []:
    print(" ", l["config"], l["status"], l.get("marker"), "alive:", launcher.marked_pids(l["marker"]) if l.get("marker") else [])
print("  explain section:", "yes" if run.get("explain") else "no")
PY
}
{
  echo "== 1. lock held by another process"
  python3 -c "import sys, time; from commdiag.measure import runlock
with runlock.hold('$T/run'):
    print('held', flush=True); time.sleep(30)" > $T/holder.txt &
  holder=$!; sleep 3
  python3 -m commdiag.cli explain $T/run; echo "rc=$?"
  kill $holder; wait $holder 2>/dev/null

  echo "== 2. Ctrl-C once the first launch is up"
  python3 -m commdiag.cli explain $T/run > $T/explain-interrupted.txt 2>&1 &
  pid=$!
  for _ in $(seq 300); do
    grep -q '"marker"' $T/run/run.json 2>/dev/null && break; sleep 0.1
  done
  sleep 4; kill -INT $pid; wait $pid; echo "rc=$?"
  tail -3 $T/explain-interrupted.txt
  state

  echo "== 3. explain again"
  /usr/bin/time -f "explain wall %e s" python3 -m commdiag.cli explain $T/run; echo "rc=$?"
  state
} 2>&1 | tee $T/summary.txt
