#!/usr/bin/env bash
# The preflight check (src/accelerate_cuda_ddp_bf16/preflight/), started as the run is:
#   bash launch/preflight.sh [key=value ...] [--resume] [--no-step] [--timeout S]
# `accelerate launch` with launch/accelerate_config.yaml, as launch/accelerate.sh starts the
# run; extra launcher flags go first through ACCELERATE_ARGS (e.g. "--num_processes 2").
# `sbatch launch/slurm.sbatch` runs it on the whole job before training.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC2086  # ACCELERATE_ARGS is a list of flags
exec accelerate launch --config_file launch/accelerate_config.yaml ${ACCELERATE_ARGS:-} \
    -m accelerate_cuda_ddp_bf16.preflight "$@"
