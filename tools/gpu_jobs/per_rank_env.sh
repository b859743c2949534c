#!/usr/bin/env bash
# torchrun gives every rank one environment; this gives rank N its own variables on top.
#   PER_RANK_ENV_1="MEGATRON_BACKPORTS=0" torchrun --nproc_per_node 2 --no-python \
#       bash tools/gpu_jobs/per_rank_env.sh python3 -P tools/gpu_jobs/dsa_ranks.py --out DIR
# PER_RANK_ENV_<RANK> holds space-separated NAME=value assignments (no spaces in a value);
# they are exported, then the command replaces this shell (its exit status is the rank's).
set -euo pipefail
var="PER_RANK_ENV_${RANK:?torchrun sets RANK for each rank}"
for assignment in ${!var:-}; do
    case "$assignment" in
        [A-Za-z_]*=*) export "${assignment?}" ;;
        *) echo "per_rank_env.sh: $var: not NAME=value: $assignment" >&2; exit 2 ;;
    esac
done
exec "$@"
