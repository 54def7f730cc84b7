#!/usr/bin/env bash
# `accelerate launch` with launch/accelerate_config.yaml: bash launch/accelerate.sh [key=value ...]
# Extra launcher flags go first through ACCELERATE_ARGS, e.g. ACCELERATE_ARGS="--machine_rank 1".
# launch/torchrun.sh starts the same processes; the project reads torchrun's variables either way.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC2086  # ACCELERATE_ARGS is a list of flags
exec accelerate launch --config_file launch/accelerate_config.yaml ${ACCELERATE_ARGS:-} \
    -m accelerate_cuda_ddp_bf16.train "$@"
