#!/usr/bin/env bash
# The preflight check (src/cuda_zero2_bf16/preflight/), started as the run is:
#   bash launch/preflight.sh [key=value ...] [--resume] [--no-step] [--timeout S]
# One node as launch/torchrun.sh starts it (NPROC_PER_NODE overrides the process count); with
# HEAD_NODE set, on every node as launch/multinode.sh (NNODES, PORT and RUN_ID too).
# `sbatch launch/slurm.sbatch` runs it on the whole job before training.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${HEAD_NODE:-}" ]; then
    exec torchrun --standalone --nproc-per-node="${NPROC_PER_NODE:-8}" \
        -m cuda_zero2_bf16.preflight "$@"
fi
exec torchrun \
    --nnodes="${NNODES:-1}" \
    --nproc-per-node="${NPROC_PER_NODE:-8}" \
    --rdzv-backend=c10d \
    --rdzv-endpoint="${HEAD_NODE}:${PORT:-29500}" \
    --rdzv-id="${RUN_ID:-cuda_zero2_bf16}-preflight" \
    -m cuda_zero2_bf16.preflight "$@"
