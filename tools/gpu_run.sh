#!/usr/bin/env bash
# On a CUDA host without a package index: install the carried wheels and this repo, then
# run the SparseMLA benchmark, the DSA training runs and the GPU tests, writing under $OUT.
#   tools/gpu_run.sh [bench|train|tests|all]     (default all: bench, train, tests)
# Two steps, one machine (it goes back 30 s after a call, so make the calls back to back):
#   1. carry .whl-a:  python3 -m pip install -q --no-index --no-deps --no-compile \
#                        --target /tmp/site .whl-a/*.whl
#   2. carry .whl-b:  WHEELS=.whl-b tools/gpu_run.sh train   (then bench, then tests: each
#                     stage fits one 10-minute call; .whl-b installs again in seconds)
# Wheels: every .whl-*/ folder in the repo root (tilelang, apache-tvm-ffi,
# torch-c-dlpack-ext, z3-solver, megatron-core; ../shared/gpu/wheelhouse.sh fetches them)
# goes into /tmp/site; a folder installed on an earlier call to the same machine is kept.
# train: `backports apply` writes the start-up hook, then torchrun (python3 -m
# torch.distributed.run) starts benchmarks/dsa_training.py with the backport, and again
# with MEGATRON_BACKPORTS=0 (stock 0.19.2); `backports revert` removes the hook and
# benchmarks/dsa_training_report.py compares the two.
# Env: WHEELS (folders to install, default every .whl-*), BENCH_ARGS, TRAIN_ARGS (extra
# flags), TRAIN_SHAPES, BENCH_TIMEOUT, TRAIN_TIMEOUT (each run), TEST_TIMEOUT, PYTEST_ARGS.
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
if [ "$stage" = train ] || [ "$stage" = all ]; then
    shapes=${TRAIN_SHAPES:-1x4096,1x32768,2x16384}
    python3 -m backports.megatron apply || status=$?
    for mode in backport stock; do
        # stock: the same job with the hook told to do nothing (megatron-core 0.19.2 as is)
        # shellcheck disable=SC2086
        env $([ $mode = stock ] && echo MEGATRON_BACKPORTS=0) timeout "${TRAIN_TIMEOUT:-240}" \
            python3 -m torch.distributed.run --nproc_per_node 1 benchmarks/dsa_training.py \
            --shapes "$shapes" --json "$OUT/dsa_training_$mode.json" ${TRAIN_ARGS:-} \
            || status=$?
    done
    python3 -m backports.megatron revert || status=$?
    python3 benchmarks/dsa_training_report.py --backport "$OUT/dsa_training_backport.json" \
        --stock "$OUT/dsa_training_stock.json" --json "$OUT/dsa_training.json" \
        --md "$OUT/dsa_training.md" --plot "$OUT/dsa_training.png" || status=$?
fi
if [ "$stage" = tests ] || [ "$stage" = all ]; then
    # shellcheck disable=SC2086
    GPU_TEST_RECORD="$OUT/gpu_tolerances.json" timeout "${TEST_TIMEOUT:-280}" \
        python3 -m pytest tests/gpu -q -rfEs --durations=12 -o console_output_style=count -p no:cacheprovider \
        ${PYTEST_ARGS:-} || status=$?
fi
exit "$status"
