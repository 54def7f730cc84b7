"""What every DeepSpeed ZeRO engine shares: the checked `ds_config.json`, and the verbs of a
step that the DeepSpeed engine runs (backward, gradient reduction, clipping, the optimizer
step, checkpoints).

ZeRO partitions across ranks the optimizer state (stage 1), the gradients (stage 2) and the
parameters (stage 3) (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models"; deepspeed.ai/docs/config-json). `strategy.py`'s `Engine` subclasses
`ZeroEngine` and says how the model reaches DeepSpeed.

A checkpoint is DeepSpeed's own: each rank's partition of the optimizer state in a file of its
own, which only as many ranks can load. Each one records what DeepSpeed's converter to its
universal format needs (`universal_checkpoint_info`), and a load on another number of processes
converts it first (`deepspeed.checkpoint.ds_to_universal`) and loads the universal form, which
any number of ranks can (deepspeed.ai/tutorials/universal-checkpointing).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import deepspeed
import torch
from deepspeed.checkpoint.constants import (
    UNIVERSAL_CHECKPOINT_INFO,
    UNIVERSAL_CHECKPOINT_VERSION_KEY,
    UNIVERSAL_CHECKPOINT_VERSION_VALUE,
)
from torch import Tensor, nn

from ..config import Config
from ..runtime import Runtime, any_process, barrier
from .build import frozen_parameters

# Each rank's optimizer partition in a checkpoint folder: as many files as ranks saved it.
PARTITION_FILES = "zero_pp_rank_*_mp_rank_00_optim_states.pt"
UNIVERSAL_INFO = {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE}

DS_CONFIG_PATH = Path(__file__).parents[1] / "ds_config.json"  # beside the user's files
# DeepSpeedConfig ignores keys it does not know, so a misspelt setting would change nothing
# without a word: only these are accepted (deepspeed.ai/docs/config-json). Precision is
# `COMPUTE_DTYPE`'s autocast, not a DeepSpeed precision section.
ALLOWED_KEYS = {
    "zero_optimization",
    "zero_force_ds_cpu_optimizer",
    "zero_allow_untested_optimizer",
    "steps_per_print",
    "wall_clock_breakdown",
}
ALLOWED_ZERO_KEYS = {
    "stage",
    "offload_optimizer",
    "offload_param",
    "overlap_comm",
    "contiguous_gradients",
    "reduce_bucket_size",
    "allgather_bucket_size",
    "reduce_scatter",
    "allgather_partitions",
    "round_robin_gradients",
    "sub_group_size",
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
}
# Owned by configs/train.toml, so the run's config is the one place they are set.
FROM_TRAIN_CONFIG = {
    "train_micro_batch_size_per_gpu": "micro_batch_size",
    "gradient_accumulation_steps": "grad_accum_steps",
    "gradient_clipping": "max_grad_norm",
}


def load_ds_config(path: Path, config: Config) -> dict[str, Any]:
    """`path` (JSON) checked against the keys above, with the batch size per process,
    accumulation steps and clipping norm taken from `config`.

    Raises:
        ValueError: the file is missing or not JSON, has a key outside the lists above, or
            sets one of the keys that configs/train.toml owns.
    """
    try:
        ds_config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read the DeepSpeed config {path}: {error}") from None
    zero_keys = set(ds_config.get("zero_optimization", {}))
    unknown = sorted(set(ds_config) - ALLOWED_KEYS - set(FROM_TRAIN_CONFIG))
    unknown += sorted(f"zero_optimization.{key}" for key in zero_keys - ALLOWED_ZERO_KEYS)
    if unknown:
        raise ValueError(
            f"{path} has keys this project does not check: {', '.join(unknown)} (DeepSpeed "
            "would ignore a misspelt one silently); fix them or add them to ALLOWED_KEYS"
        )
    owned = sorted(set(ds_config) & set(FROM_TRAIN_CONFIG))
    if owned:
        names = ", ".join(FROM_TRAIN_CONFIG[key] for key in owned)
        raise ValueError(f"{path} sets {', '.join(owned)}; set {names} in configs/train.toml")
    filled = {key: getattr(config, field) for key, field in FROM_TRAIN_CONFIG.items()}
    return ds_config | filled


def read_ds_config(config: Config, runtime: Runtime) -> dict[str, Any]:
    """`load_ds_config(DS_CONFIG_PATH, config)`, after the checks every ZeRO engine needs
    before `deepspeed.initialize`; sets torchrun's LOCAL_RANK where it is missing.

    Raises:
        ValueError: `compile=true` (not wired to DeepSpeed here) or a bad `ds_config.json`.
    """
    if config.compile:
        raise ValueError("compile=true is not supported with DeepSpeed here; set compile=false")
    # DeepSpeed insists on torchrun's LOCAL_RANK even when the process group exists already
    # (a lone `python -m` run or a test creates a one-process group without torchrun).
    os.environ.setdefault("LOCAL_RANK", str(runtime.local_rank))
    return load_ds_config(DS_CONFIG_PATH, config)


class ZeroEngine:
    """The verbs every ZeRO engine has alike.

    Attributes: `runtime`, `model` (the bare module; under stage 3 its parameters are
    partitioned in place) and `optimizer` (whose parameter groups the learning-rate schedule
    sets; the ZeRO optimizer reads them), set by the subclass; `module`, the DeepSpeed engine
    that forward runs through, set by `start_deepspeed`.
    """

    runtime: Runtime
    model: nn.Module
    optimizer: torch.optim.Optimizer

    def start_deepspeed(self, ds_config: dict[str, Any], compute_dtype: torch.dtype) -> None:
        """Wrap `model` and `optimizer` in the DeepSpeed engine (`module`); autocast to
        `compute_dtype` around it (`torch.float32`: no autocast)."""
        self.module, *_ = deepspeed.initialize(
            model=self.model, optimizer=self.optimizer, config=ds_config
        )
        self._autocast = (
            torch.autocast(self.runtime.device.type, dtype=compute_dtype)
            if compute_dtype is not torch.float32
            else contextlib.nullcontext()
        )

    def zero_grad(self) -> None:
        """Drop the last step's gradients (`set_to_none`: freed, not filled with zeros); note
        how many steps DeepSpeed has skipped so far."""
        self.optimizer.zero_grad(set_to_none=True)
        self.skipped_before = self.module.skipped_steps

    def loss_scale(self) -> float | None:
        """None: no loss scaling in this precision."""
        return None

    def step_skipped(self) -> bool:
        """True when the last `clip_and_step` skipped its update: DeepSpeed checks every
        step's gradients for inf/NaN (`check_grad_overflow`), without loss scaling too, and
        drops the update when it finds one."""
        return self.module.skipped_steps > self.skipped_before

    def inference(self) -> contextlib.AbstractContextManager:
        """Context for validation's forward passes: `torch.inference_mode()`."""
        return torch.inference_mode()

    def micro_step(self, last: bool) -> contextlib.AbstractContextManager:
        """Context for one micro-batch's forward + backward; `last` marks the end of an
        accumulation step, where the engine reduces gradients and then steps."""
        self.module.set_gradient_accumulation_boundary(last)
        return contextlib.nullcontext()

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context for forward + loss only (never backward)."""
        return self._autocast

    def backward(self, loss: Tensor) -> None:
        """The engine's backward of a 0-dim loss already divided for gradient accumulation
        (`scale_wrt_gas=False`: the engine must not divide it again)."""
        self.module.backward(loss, scale_wrt_gas=False)

    def clip_and_step(self, max_norm: float) -> Tensor:
        """The engine clips to ds_config's `gradient_clipping` (`max_norm`, filled in from
        train.toml) and steps; returns the pre-clip global gradient norm (0-dim float32)."""
        assert self.module.gradient_clipping() == max_norm, "ds_config and train.toml disagree"
        self.module.step()
        grad_norm = self.module.get_global_grad_norm()
        return torch.as_tensor(float("nan") if grad_norm is None else grad_norm).float()

    def save(self, folder: Path) -> None:
        """DeepSpeed's `save_checkpoint` into `folder`: every rank writes its partitions (a
        collective), with the `universal_checkpoint_info` a conversion needs."""
        self.module.save_checkpoint(
            str(folder.parent),
            tag=folder.name,
            save_latest=False,
            client_state={UNIVERSAL_CHECKPOINT_INFO: UNIVERSAL_INFO},
            exclude_frozen_parameters=True,  # a LoRA run's base: built again at a resume
        )

    def load(self, folder: Path) -> None:
        """Load what `save` wrote (a collective); the schedule's state is the checkpoint's own.

        Gradients still in DeepSpeed's buffers (a sanity backward before the resume) are
        dropped first: the torch optimizer's `zero_grad` does not reach them, and the next
        step would add them to its own.

        Raises:
            ValueError: DeepSpeed found no checkpoint in `folder`.
        """
        self.module.optimizer.zero_grad(set_to_none=True)
        if len(list(folder.glob(PARTITION_FILES))) not in (0, self.runtime.world_size):
            self._load_universal(folder)
            return
        path, _ = self.module.load_checkpoint(
            str(folder.parent),
            tag=folder.name,
            load_optimizer_states=True,
            load_lr_scheduler_states=False,
            load_module_strict=not frozen_parameters(self.model),
        )
        if path is None:
            raise ValueError(f"DeepSpeed found no checkpoint in {folder}; move it away")

    def _load_universal(self, folder: Path) -> None:
        """Load `folder`, written by another number of ranks: the main process converts it to
        DeepSpeed's universal format beside it (`.<name>.universal.partial`, a temporary that
        the next start removes if a kill interrupts this), every rank loads its part of that,
        and the conversion is deleted.

        Raises:
            ValueError: the conversion failed (its last line says why).
        """
        universal = folder.parent / f".{folder.name}.universal.partial"
        failure = ""
        if self.runtime.is_main:
            shutil.rmtree(universal, ignore_errors=True)
            command = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal"]
            command += ["--input_folder", str(folder), "--output_folder", str(universal)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                failure = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        if any_process(bool(failure), self.runtime):
            reason = failure or "see the main process"
            raise ValueError(
                f"DeepSpeed could not convert {folder} to its universal format ({reason}); "
                "resume it on the process count that wrote it"
            )
        # DeepSpeed reads the choice from its config alone, fixed when the engine was built;
        # only this load is of the universal format.
        self.module._config.load_universal_checkpoint = True
        try:
            self.module.load_checkpoint(
                str(universal.parent),
                tag=universal.name,
                load_optimizer_states=True,
                load_lr_scheduler_states=False,
                load_module_strict=not frozen_parameters(self.model),
            )
        finally:
            self.module._config.load_universal_checkpoint = False
        barrier(self.runtime)
        if self.runtime.is_main:
            shutil.rmtree(universal)

    def full_state_dict(self) -> dict[str, Tensor]:
        """The bare model's whole state dict on the CPU of every rank, in fp32 (a collective
        under stage 3, which all-gathers the partitioned parameters)."""
        with deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=None):
            return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
