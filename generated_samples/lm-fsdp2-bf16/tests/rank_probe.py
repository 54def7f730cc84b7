"""Run under torchrun by test_distributed.py: train a few accumulated steps, then save this
rank's flattened parameters so the test can compare the ranks bitwise."""

from __future__ import annotations

import dataclasses
import sys

import torch

from lm_fsdp2_bf16.config import load_config
from lm_fsdp2_bf16.runtime import init_runtime, shutdown_runtime
from lm_fsdp2_bf16.train import Trainer


def main(config_path: str, run_dir: str, *overrides: str) -> None:
    settings = ["device=cpu", "grad_accum_steps=3", "stop_after_steps=4", *overrides]
    config = load_config(config_path, settings)
    runtime = init_runtime("cpu")
    trainer = Trainer(dataclasses.replace(config, run_dir=run_dir), runtime)
    trainer.fit()
    # The whole parameters as this rank sees them (gathered where the strategy shards them).
    state = trainer.engine.full_state_dict()
    flat = torch.cat([state[name].flatten() for name, _ in trainer.engine.model.named_parameters()])
    torch.save(flat, f"{run_dir}/params-rank{runtime.rank}.pt")
    del trainer
    shutdown_runtime(runtime)


if __name__ == "__main__":
    main(*sys.argv[1:])
