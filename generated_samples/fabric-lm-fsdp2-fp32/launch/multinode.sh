#!/usr/bin/env bash
# Run the same command on every node; the first node's host is the rendezvous endpoint:
#   HEAD_NODE=node0 bash launch/multinode.sh [key=value ...] [--resume]
# NNODES, NPROC_PER_NODE, PORT and RUN_ID override the defaults below.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${HEAD_NODE:?set HEAD_NODE to the host name of the first node}"
exec torchrun \
    --nnodes="${NNODES:-1}" \
    --nproc-per-node="${NPROC_PER_NODE:-8}" \
    --rdzv-backend=c10d \
    --rdzv-endpoint="${HEAD_NODE}:${PORT:-29500}" \
    --rdzv-id="${RUN_ID:-fabric_lm_fsdp2_fp32}" \
    -m fabric_lm_fsdp2_fp32.train "$@"
