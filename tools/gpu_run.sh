#!/usr/bin/env bash
# On a CUDA host without a package index: install the carried wheels and this repo, then
# run the SparseMLA benchmark, the DSA training runs and the GPU tests, writing under $OUT.
#   tools/gpu_run.sh [bench|train|tests|all]     (default all: bench, train, tests)
#   tools/gpu_run.sh upstream    upstream's own tests (issue 37 item 2), one GPU
#   tools/gpu_run.sh distopt     #5077 on a real DistributedOptimizer (issue 37 item 1), one GPU
#   tools/gpu_run.sh ranks2      two GPUs over NCCL (issue 38): ranks agree; #5077 at DP=2
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
# upstream: `backports upstream-tests ID --launcher torchrun --json` for #6114 and #5077
# (each: a stock run, MEGATRON_BACKPORTS=0, and one with the backport), from a shallow
# bundle of the recorded commits carried in .upstream/ (made here, where a clone is:
#   echo /.upstream/ >> .git/info/exclude
#   python3 tools/upstream_bundle.py create --repo ../Megatron-LM --out .upstream/megatron-lm.bundle
# about 16 MB; carry .upstream), unpacked on the host by tools/upstream_bundle.py unpack.
# Writes $OUT/upstream_tests_<id>.json, $OUT/upstream_tests.md (test id, stock, backport,
# the first error line of each test that proves nothing) and $OUT/upstream_tests.log.
# distopt: tests/gpu/test_distopt_5077_gpu.py (its runs' JSON under $OUT/distopt/).
# ranks2 (2 GPUs): `backports apply`, tools/gpu_jobs/ranks_check.py (the DSA job's two
# ranks agree; rank 1 without backports fails every rank within 60 s), `backports revert`,
# tools/gpu_jobs/distopt_dp2.py (#5077 saved at DP=2, loaded at DP=1 and DP=2); writes
# $OUT/ranks_nccl.json and $OUT/distopt_dp2.json.
# Env: WHEELS (folders to install, default every .whl-*), BENCH_ARGS, TRAIN_ARGS (extra
# flags), TRAIN_SHAPES, BENCH_TIMEOUT, TRAIN_TIMEOUT (each run), TEST_TIMEOUT, PYTEST_ARGS,
# UPSTREAM_BUNDLE, UPSTREAM_IDS, UPSTREAM_TIMEOUT (each pytest run), DISTOPT_TIMEOUT.
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
case "$stage" in upstream|distopt|ranks2)
    # What megatron's checkpointing and upstream's harness import beyond torch and
    # megatron-core (carry a wheel of any that is missing); git reads the upstream bundle.
    command -v git >/dev/null || echo "$stage: no git program on this host"
    for module in psutil yaml pytest; do
        python3 -c "import $module" 2>/dev/null || echo "$stage: python3 lacks $module"
    done
esac
if [ "$stage" = upstream ]; then
    repo=/tmp/megatron-lm.git
    [ -d "$repo" ] || python3 tools/upstream_bundle.py unpack \
        --bundle "${UPSTREAM_BUNDLE:-.upstream/megatron-lm.bundle}" --dest "$repo" || status=$?
    rm -rf /tmp/upstream_logs
    for id in ${UPSTREAM_IDS:-megatron-lm-6114 megatron-lm-5077}; do
        # exit 1 is "not proven here": the table says why; 2 and more, the command failed
        python3 -m backports.megatron upstream-tests "$id" --repo "$repo" --launcher torchrun \
            --timeout "${UPSTREAM_TIMEOUT:-110}" --json --log-dir /tmp/upstream_logs \
            >"$OUT/upstream_tests_$id.json" 2>>"$OUT/upstream_tests.log"
        rc=$?; [ "$rc" -le 1 ] || status=$rc
    done
    for log in /tmp/upstream_logs/*.log; do
        [ -f "$log" ] && { echo "== $log (last 80 lines)"; tail -n 80 "$log"; } >>"$OUT/upstream_tests.log"
    done
    python3 tools/upstream_tests_table.py "$OUT"/upstream_tests_*.json \
        --md "$OUT/upstream_tests.md" || status=$?
    cat "$OUT/upstream_tests.md"
fi
if [ "$stage" = distopt ]; then
    GPU_DISTOPT_RECORD="$OUT/distopt" timeout "${DISTOPT_TIMEOUT:-400}" \
        python3 -m pytest tests/gpu/test_distopt_5077_gpu.py -q -rfEs -p no:cacheprovider \
        ${PYTEST_ARGS:-} || status=$?
fi
if [ "$stage" = ranks2 ]; then
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    python3 -m backports.megatron apply || status=$?
    timeout 400 python3 tools/gpu_jobs/ranks_check.py --json "$OUT/ranks_nccl.json" || status=$?
    python3 -m backports.megatron revert || status=$?
    timeout 500 python3 tools/gpu_jobs/distopt_dp2.py --json "$OUT/distopt_dp2.json" || status=$?
fi
exit "$status"
