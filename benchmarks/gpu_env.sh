# The environment every GPU script starts with (sourced, never run): NVLink multicast off everywhere
# (never sweep NVLS on shared machines), the carried wheels (.whl/: plotly is not installed on the GPU
# machines) on the path, and this checkout's commdiag first.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if [ -d .whl ]; then  # plotly is not installed there: carried wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
