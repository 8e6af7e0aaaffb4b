#!/usr/bin/env bash
# The PCIe half on a GPU machine, one call (device tool), carrying .whl (plotly) and .gpu-ref:
#   bash benchmarks/gpu_pcie_half.sh [suite]     # about 3 minutes; `suite` adds the whole test suite (-n 12)
# Records: NVML machine state idle/under load and its cost, the ACS/IOMMU audit beside NVML, which
# libnccl torch and a bare dlopen load (check-env --libs), doctor, the gpu-marked tests; everything in
# $OUT/pcie-half.tgz plus $OUT/summary.txt.  Read-only on the machine.  NVLink multicast stays off.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; G=/tmp/half; rm -rf $G; mkdir -p $G
S=$OUT/summary.txt
step() { echo "== $1 ($(date +%T))" | tee -a $S; }
{ nvidia-smi -L; python3 -c 'import torch, sys; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count(), "python", sys.version.split()[0])'; } 2>&1 | tee -a $S
step "machine state: idle, under load, after (gpu_machine_state.sh)"
OUT=$G bash benchmarks/gpu_machine_state.sh > $G/machine-state.txt 2>&1; echo "rc=$?" | tee -a $S; tail -5 $G/machine-state.txt | tee -a $S
step "machine state cost per launch (machine_state_cost.py)"
timeout 180 python3 benchmarks/machine_state_cost.py --out $G/machine-state-cost > $G/machine-state-cost.txt 2>&1; echo "rc=$?" | tee -a $S; tail -8 $G/machine-state-cost.txt | tee -a $S
step "ACS/IOMMU audit beside NVML (pcie_audit.py)"
timeout 120 python3 benchmarks/pcie_audit.py $G/pcie > $G/pcie-audit.txt 2>&1; echo "rc=$?" | tee -a $S; tail -12 $G/pcie/check.txt 2>/dev/null | tee -a $S
step "which libnccl (check-env --libs)"
timeout 120 python3 -m commdiag.cli check-env --libs > $G/check-env-libs.txt 2>&1; echo "rc=$?" | tee -a $S; cat $G/check-env-libs.txt | tee -a $S
timeout 120 python3 -m commdiag.cli check-env --libs --json > $G/check-env-libs.json 2>&1
step "doctor"
timeout 180 python3 -m commdiag.cli doctor > $G/doctor.txt 2>&1; echo "rc=$?" | tee -a $S; cat $G/doctor.txt | tee -a $S
timeout 180 python3 -m commdiag.cli doctor --json > $G/doctor.json 2>&1
step "gpu-marked tests"
timeout 400 python3 -m pytest -q -p no:cacheprovider -n 4 -m gpu tests/test_gpu.py > $G/pytest-gpu.txt 2>&1; echo "rc=$?" | tee -a $S; tail -15 $G/pytest-gpu.txt | tee -a $S
if [ "${1:-}" = suite ]; then
  step "the whole suite (-n 12)"
  timeout 480 python3 -m pytest -q -p no:cacheprovider -n 12 > $G/pytest-suite.txt 2>&1; echo "rc=$?" | tee -a $S; tail -25 $G/pytest-suite.txt | tee -a $S
fi
tar czf $OUT/pcie-half.tgz -C /tmp half; ls -la $OUT
