#!/usr/bin/env bash
# One node, one process per GPU: bash launch/torchrun.sh [key=value ...] [--resume]
# NPROC_PER_NODE overrides the process count (e.g. 2 on a CPU-only machine: gloo backend).
set -euo pipefail
cd "$(dirname "$0")/.."
exec torchrun --standalone --nproc-per-node="${NPROC_PER_NODE:-4}" \
    -m accelerate_cuda_ddp_bf16.train "$@"
