"""Parallelism: DeepSpeed ZeRO stage {{ zero_stage }}{{ " with CPU offload" if zero_offload else "" }}, launched by torchrun.

Every strategy's `parallel.py` exports these same names, so `train.py` never names DeepSpeed.
ZeRO partitions across ranks the optimizer state (stage 1), then the gradients (stage 2), then
the parameters (stage 3) (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models"; deepspeed.ai/docs/config-json). The DeepSpeed engine runs backward,
gradient reduction, clipping and the optimizer step; this loop tells it where each accumulation
step ends (`gradient_sync`) and steps the learning-rate schedule itself, like every strategy.
The engine's settings are `ds_config.json` beside this file, with the batch sizes, accumulation
and clipping filled in from `configs/train.toml`.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deepspeed
import torch
{%- if zero_offload %}
from deepspeed.ops.adam import DeepSpeedCPUAdam
{%- endif %}
from torch import Tensor, nn

from .config import Config
from .distributed import (
    Runtime,
    all_reduce_sum,
    barrier,
    eval_sampler,
    gather_objects,
    init_runtime,
    set_sampler_epoch,
    shutdown_runtime,
    train_sampler,
)
from .precision import PrecisionPolicy

__all__ = [
    "STRATEGY",
    "Runtime",
    "all_reduce_sum",
    "barrier",
    "eval_sampler",
    "full_model_state",
    "gather_objects",
    "gradient_sync",
    "init_runtime",
    "load_sharded",
    "save_sharded",
    "set_sampler_epoch",
    "shutdown_runtime",
    "train_sampler",
    "wrap_model",
]

STRATEGY = "{{ strategy }}"
DS_CONFIG_PATH = Path(__file__).with_name("ds_config.json")
# DeepSpeedConfig ignores keys it does not know, so a misspelt setting would change nothing
# without a word: only these are accepted (deepspeed.ai/docs/config-json). Precision is
# `precision.py`'s autocast, not DeepSpeed's bf16/fp16/torch_autocast sections.
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


def wrap_model(
    model: nn.Module,
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
    runtime: Runtime,
    precision: PrecisionPolicy,
    config: Config,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The DeepSpeed engine around `model` and the optimizer it partitions.

    The returned optimizer is the one the learning-rate schedule steps (its parameter groups
    are the ones the engine's ZeRO optimizer reads).
{%- if zero_offload %} AdamW becomes DeepSpeed's vectorised CPU Adam,
    with the same groups and hyperparameters: the optimizer step runs on the CPU.
{%- endif %}

    Raises:
        ValueError: `compile=true` (not wired to DeepSpeed here) or a bad `ds_config.json`.
    """
    if config.compile:
        raise ValueError("compile=true is not supported with DeepSpeed here; set compile=false")
    optimizer = make_optimizer(model)
{%- if zero_offload %}
    if isinstance(optimizer, torch.optim.AdamW):
        groups = [dict(group) for group in optimizer.param_groups]
        optimizer = DeepSpeedCPUAdam(groups, adamw_mode=True)
{%- endif %}
    ds_config = load_ds_config(DS_CONFIG_PATH, config)
    # DeepSpeed insists on torchrun's LOCAL_RANK even when the process group exists already
    # (a lone `python -m` run or a test creates a one-process group without torchrun).
    os.environ.setdefault("LOCAL_RANK", str(runtime.local_rank))
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    return engine, optimizer


def gradient_sync(model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
    """Context for one micro-step's forward + backward; `enabled` marks the last micro-step of
    an accumulation step, where the engine reduces gradients and then steps."""
    model.set_gradient_accumulation_boundary(enabled)
    return contextlib.nullcontext()


def full_model_state(model: nn.Module) -> dict[str, Tensor]:
    """The whole state dict of the bare `model` on every rank (a collective under stage 3,
    which all-gathers the partitioned parameters), on the CPU, in fp32."""
    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
        return {name: value.detach().cpu().clone() for name, value in model.state_dict().items()}


def save_sharded(
    folder: Path, trained: nn.Module, model: nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """DeepSpeed's `save_checkpoint` into `folder`: every rank writes its partitions of the
    optimizer state{{ " and parameters" if zero_stage == 3 else "" }} (a collective)."""
    trained.save_checkpoint(str(folder.parent), tag=folder.name, save_latest=False)


def load_sharded(
    folder: Path, trained: nn.Module, model: nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Load what `save_sharded` wrote; the schedule's state comes from `trainer.pt`.

    Raises:
        ValueError: DeepSpeed found no checkpoint in `folder`.
    """
    path, _ = trained.load_checkpoint(
        str(folder.parent), tag=folder.name, load_optimizer_states=True,
        load_lr_scheduler_states=False, load_module_strict=True,
    )  # fmt: skip
    if path is None:
        raise ValueError(f"DeepSpeed found no checkpoint in {folder}; move it away to start over")
{%- if zero_offload %}
    replay_cpu_adam_bias_correction(optimizer)


def replay_cpu_adam_bias_correction(optimizer: DeepSpeedCPUAdam) -> None:
    """Rebuild the C++ CPU Adam's running beta1**t and beta2**t after a resume.

    The C++ optimizer keeps them as float products, one multiplication per step, but a fresh
    one computes them with pow() at its first step after a resume. The two differ in the last
    bits, so without this the resumed run drifts from the straight one (DeepSpeed
    csrc/includes/cpu_adam.h, `IncrementStep`). Replaying steps 1..t on empty tensors rebuilds
    the same products and updates nothing.
    """
    steps = [int(state["step"]) for state in optimizer.state.values() if "step" in state]
    if not steps:
        return
    empty = torch.empty(0)
    group = optimizer.param_groups[0]
    beta1, beta2 = group["betas"]
    for step in range(1, max(steps) + 1):
        optimizer.ds_opt_adam.adam_update(
            optimizer.opt_id, step, group["lr"], beta1, beta2, group["eps"],
            group["weight_decay"], group["bias_correction"], empty, empty, empty, empty,
        )  # fmt: skip
{%- endif %}
