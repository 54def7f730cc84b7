"""A finished run as the commands that use a trained model read it back: the config it trained
with and its weights, in the model as model.py builds it now."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from ..config import Config, load_config
from ..model import build_model


def run_config(run_dir: Path) -> Config:
    """The config a run trained with (config.json in its folder), over today's defaults for
    keys it does not have.

    Raises:
        ValueError: `run_dir` holds no config.json.
    """
    config_file = run_dir / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{config_file} not found; train first, or name the run with --run-dir")
    saved = json.loads(config_file.read_text(encoding="utf-8"))
    fields = {field.name for field in dataclasses.fields(Config)}
    return dataclasses.replace(load_config(), **{k: v for k, v in saved.items() if k in fields})


def run_weights(run_dir: Path, weights: str) -> Path:
    """The path of a run's weights file `weights` (a name in `run_dir`, or a path).

    Raises:
        ValueError: there is no such file (the message says which the run has, or how to get
            one from its checkpoints).
    """
    weights_file = run_dir / weights
    if weights_file.is_file():
        return weights_file
    others = sorted(path.name for path in run_dir.glob("*.safetensors"))
    hint = f"--weights {others[0]}" if others else "train first"
    if not others and (run_dir / "checkpoints" / "last").is_file():
        hint = (
            "the run has checkpoints, and exports its weights when it ends (not when a "
            "stop signal ends it): --resume it to its end, or to the next step with "
            "stop_after_steps"
        )
    raise ValueError(f"{weights_file} not found; {hint}")


def load_trained(run_dir: Path, weights: str, device: torch.device) -> tuple[nn.Module, Config]:
    """The model a run trained, with its `weights` file, and the run's config.

    Raises:
        ValueError: `run_dir` holds no config.json or no such weights file, or the weights do
            not fit the model as built now.
    """
    config = run_config(run_dir)
    weights_file = run_weights(run_dir, weights)
    model = build_model(config)
    try:
        model.load_state_dict(load_file(weights_file))
    except RuntimeError as error:  # shapes that differ: NUM_CLASSES or model.py changed since
        first = str(error).splitlines()[-1].strip()
        raise ValueError(f"{weights_file} does not fit model.py as it is now ({first})") from None
    return model.to(device), config
