"""LoRA fine-tuning (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"): the
model's weights stay frozen as `init_from` gave them, and each projection named in
`lora_targets` learns a low-rank update `W + (alpha / r) B A`, A `[r, in]`, B `[out, r]`.

The adapters are PEFT's (`peft.inject_adapter_in_model`, the field's library for them): its
layers, its parameter names and its file format, so that `peft.PeftModel.from_pretrained` loads
a run's adapters onto the model folder it started from. They are added on the meta device,
before any engine places or shards the model, so every strategy sees one model whose trainable
parameters are the adapters (the optimizer takes only those: training/optim.py). Their initial
values come from the run's seeded generator, as every parameter's do (engine/build.py): A
Kaiming-uniform as PEFT draws it, B zero, so training starts at the base model's exact outputs.

A run's checkpoints hold the adapters and their optimizer state only: the base is `init_from`,
whose weights' checksum a resume checks (task_config.py's `base_fingerprint`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # what PeftModel's save prefixes the model's own names with
ADAPTER_NAME = "default"  # PEFT's name of a model's one adapter
# The attention and MLP projections of the Llama family, by transformers' names.
LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def is_adapter(name: str) -> bool:
    """Whether parameter `name` is a LoRA matrix (`...lora_A.default.weight`, `lora_B`)."""
    return ".lora_A." in name or ".lora_B." in name


def base_name(name: str) -> str:
    """The model's own name of a parameter of a layer PEFT wrapped (`q_proj.base_layer.weight`
    -> `q_proj.weight`); any other name as it is."""
    return name.replace(".base_layer.", ".")


def peft_name(name: str) -> str:
    """A LoRA matrix's name in PEFT's saved adapter: the adapter's name left out, the model's
    names prefixed as PeftModel's are (`base_model.model.model.layers.0...lora_A.weight`)."""
    return PEFT_PREFIX + name.replace(f".{ADAPTER_NAME}.", ".")


def targets_of(text: str) -> list[str]:
    """The module names of a comma-separated `lora_targets` setting."""
    return [name.strip() for name in text.split(",") if name.strip()]


def lora_config(
    rank: int, alpha: float, dropout: float, targets: Iterable[str], base: str = ""
) -> Any:
    """PEFT's LoraConfig of these settings (`base`: the model folder it adapts)."""
    from peft import LoraConfig  # only where LoRA is used

    return LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(targets),
        task_type="CAUSAL_LM",
        base_model_name_or_path=base or None,
    )


def add_adapters(model: nn.Module, config: Any) -> nn.Module:
    """`model` (built on the meta device) with LoRA adapters on every module named in
    `config.lora_targets`, of rank `lora_rank`, scale `lora_alpha / lora_rank` and dropout
    `lora_dropout`; only the adapters train. Its `init_tensor` still fills every parameter:
    the wrapped layers' own weights by the model's rule (the checkpoint's, for init_from), the
    adapters as PEFT initialises them.

    Raises:
        ValueError: a target that names no module of the model.
    """
    from peft import inject_adapter_in_model  # only where LoRA is used

    targets = targets_of(config.lora_targets)
    names = {name.rpartition(".")[2] for name, _ in model.named_modules()}
    unknown = [target for target in targets if target not in names]
    if unknown or not targets:
        raise ValueError(
            f"lora_targets names {', '.join(unknown) or 'no module'}, not modules of the model "
            f"(its Llama projections: {', '.join(LLAMA_PROJECTIONS)})"
        )
    settings = lora_config(config.lora_rank, config.lora_alpha, config.lora_dropout, targets)
    own_init = model.init_tensor
    adapted = inject_adapter_in_model(settings, model, adapter_name=ADAPTER_NAME)
    for name, parameter in adapted.named_parameters():
        parameter.requires_grad_(is_adapter(name))
    adapted.init_tensor = adapter_init(own_init)
    return adapted


def adapter_init(own_init: Callable[..., None]) -> Callable[..., None]:
    """The `init_tensor` of an adapted model: a LoRA A matrix Kaiming-uniform with a = sqrt(5)
    (PEFT's default, that of nn.Linear), B zero; anything else by `own_init` under the
    model's own name."""

    def init_tensor(name: str, tensor: Tensor, generator: torch.Generator | None = None) -> None:
        if ".lora_A." in name:
            nn.init.kaiming_uniform_(tensor, a=math.sqrt(5), generator=generator)
        elif ".lora_B." in name:
            nn.init.zeros_(tensor)
        else:
            own_init(base_name(name), tensor, generator)

    return init_tensor


def adapter_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The LoRA matrices of a state dict, by the model's names."""
    return {name: tensor for name, tensor in state.items() if is_adapter(name)}


def merged_state(
    base: dict[str, Tensor], adapters: dict[str, Tensor], alpha: float, rank: int
) -> dict[str, Tensor]:
    """The model's own state dict with every adapter folded into its weight: `W + (alpha /
    rank) B A` in fp32, cast back to W's dtype. `base` by the model's own names (a wrapped
    layer's `base_layer` left out), `adapters` as `adapter_state` names them."""
    merged = dict(base)
    scale = alpha / rank
    for name, a in adapters.items():
        if ".lora_A." not in name:
            continue
        module = name.split(".lora_A.")[0]
        b = adapters[name.replace(".lora_A.", ".lora_B.")]
        weight = merged[f"{module}.weight"]
        update = scale * (b.float() @ a.float())
        merged[f"{module}.weight"] = (weight.float() + update).to(weight.dtype)
    return merged


def write_adapter(
    adapters: dict[str, Tensor],
    config: Any,
    out: Path,
    dtype: torch.dtype = torch.float32,
    beside: Callable[[Path], list[Path]] | None = None,
) -> list[Path]:
    """Write `adapters` (`adapter_state` names) as the new folder `out`, in PEFT's format:
    adapter_config.json and adapter_model.safetensors, which `PeftModel.from_pretrained` loads
    onto the model `init_from` names, and what `beside(folder)` writes into it (the tokenizer
    files, which PEFT users look for beside an adapter). Returns the files.

    Raises:
        ValueError: `out` exists and is not an empty folder.
    """
    from safetensors.torch import save_file

    from ..hub.export_folder import new_folder  # hub/ reads this package's shapes: no cycle

    settings = lora_config(
        config.lora_rank,
        config.lora_alpha,
        config.lora_dropout,
        targets_of(config.lora_targets),
        str(config.init_from),
    )
    tensors = {peft_name(name): t.to(dtype).contiguous() for name, t in adapters.items()}
    with new_folder(out) as scratch:
        settings.save_pretrained(str(scratch))
        save_file(tensors, scratch / ADAPTER_WEIGHTS, metadata={"format": "pt"})
        others = beside(scratch) if beside is not None else []
    return [out / ADAPTER_CONFIG, out / ADAPTER_WEIGHTS, *(out / path.name for path in others)]
