#!/usr/bin/env bash
# On a CUDA host without a package index: install the carried wheels and this repo, then
# run the GPU tests and the SparseMLA benchmark, writing results under $OUT.
#   tools/gpu_run.sh [bench|tests|all]     (default all; benchmark first)
# Wheels: every .whl-*/ folder in the repo root (tilelang, apache-tvm-ffi,
# torch-c-dlpack-ext, z3-solver, megatron-core) goes into /tmp/site; a folder installed on
# an earlier call to the same machine is kept there.
# Env: WHEELS (folders to install, default every .whl-*), BENCH_ARGS (extra benchmark flags), BENCH_TIMEOUT, TEST_TIMEOUT, PYTEST_ARGS.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
stage=${1:-all}

for dir in ${WHEELS:-.whl-*}; do
    [ -d "$dir" ] || continue
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
        "$dir"/*.whl || exit 1
done
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
python3 -c 'import torch; print("cuda devices:", torch.cuda.device_count(), torch.__version__)'
nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv,noheader

status=0
if [ "$stage" = bench ] || [ "$stage" = all ]; then
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-260}" python3 benchmarks/sparse_mla.py \
        --json "$OUT/sparse_mla.json" --plot "$OUT/sparse_mla.png" --md "$OUT/sparse_mla.md" \
        ${BENCH_ARGS:-} || status=$?
fi
if [ "$stage" = tests ] || [ "$stage" = all ]; then
    # shellcheck disable=SC2086
    GPU_TEST_RECORD="$OUT/gpu_tolerances.json" timeout "${TEST_TIMEOUT:-280}" \
        python3 -m pytest tests/gpu -q -rfEs --durations=12 -o console_output_style=count -p no:cacheprovider \
        ${PYTEST_ARGS:-} || status=$?
fi
exit "$status"
