"""Read a Hugging Face model folder's safetensors weights into a model built on the meta
device, one tensor at a time.

`HubWeights.init_tensor` has the signature of a model's own `init_tensor` (model.py's
contract), so the engines' set-up (engine/build.py `init_weights`) fills each parameter from
the checkpoint instead of a random draw, and keeps what each process stores of it: a process
never holds more than its shards and the one full tensor being read. The checkpoint's names
are checked strictly before any is read: every parameter must be there with its shape, and
nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from .names import GPT2_TIED_HEAD, canonical_name, hub_name

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
LISTED = 6  # names a refusal lists before it counts the rest


@contextmanager
def open_weights(path: Path) -> Iterator[Any]:
    """`path`'s safetensors file opened for PyTorch tensors (safetensors' `safe_open`).

    Raises:
        ValueError: `path` is not a complete safetensors file (cut short by a download, or
            not one at all): safetensors refuses its header before any tensor is read.
    """
    try:
        handle = safe_open(path, framework="pt")
    except SafetensorError as error:
        why = " ".join(str(error).split())  # safetensors' reason, on one line
        raise ValueError(
            f"{path} is not a complete safetensors file ({why}); download it again"
        ) from None
    with handle:
        yield handle


def weight_files(folder: Path) -> dict[str, Path]:
    """Each tensor name the folder's weights hold -> its file: model.safetensors, or the
    shards model.safetensors.index.json maps (transformers' layout).

    Raises:
        ValueError: neither file is there (a PyTorch .bin folder needs converting first), the
            index names a shard that is missing, or a file is not a complete safetensors file.
    """
    folder = Path(folder)
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = {name: folder / shard for name, shard in weight_map.items()}
        missing = sorted({path.name for path in files.values() if not path.is_file()})
        if missing:
            raise ValueError(f"{index} names shards that are not there: {', '.join(missing)}")
        return files
    single = folder / WEIGHTS_FILE
    if not single.is_file():
        other = " (it has PyTorch .bin weights: save them as safetensors first)"
        bins = any(folder.glob("*.bin"))
        raise ValueError(f"{folder} holds no {WEIGHTS_FILE} or {INDEX_FILE}{other if bins else ''}")
    with open_weights(single) as handle:
        return dict.fromkeys(handle.keys(), single)


def listed(names: list[str]) -> str:
    """`names`, the first LISTED of them, and how many more."""
    more = f" and {len(names) - LISTED} more" if len(names) > LISTED else ""
    return ", ".join(names[:LISTED]) + more


class HubWeights:
    """The weights of the model folder `folder` for `model`, a model of `family` ("llama" or
    "gpt2"), checked against its parameters' names and shapes.

    Raises:
        ValueError: the folder has no weights; names the model lacks or has besides (both
            lists in one message); a tensor whose shape differs from its parameter's.
    """

    def __init__(self, folder: Path, family: str, model: nn.Module):
        self.family = family
        files = weight_files(Path(folder))
        stored = {canonical_name(family, name): name for name in files}
        stored.pop(None, None)
        self.sources: dict[str, tuple[Path, str, bool]] = {}
        missing = []
        for name, _ in model.named_parameters():
            key, transposed = hub_name(family, name)
            if key not in stored and key == "lm_head.weight" and family == "gpt2":
                key = GPT2_TIED_HEAD  # tied: the output layer starts as the embedding
            if key not in stored:
                missing.append(key)
                continue
            self.sources[name] = (files[stored[key]], stored[key], transposed)
        used = {source[1] for source in self.sources.values()}
        unexpected = sorted(set(stored.values()) - used)
        if missing or unexpected:
            parts = [f"missing {listed(missing)}"] * bool(missing)
            parts += [f"unexpected {listed(unexpected)}"] * bool(unexpected)
            raise ValueError(f"{folder}'s weights do not fit its config.json: {'; '.join(parts)}")
        self.check_shapes(folder, model)

    def check_shapes(self, folder: Path, model: nn.Module) -> None:
        """Raise ValueError naming every tensor whose shape is not its parameter's."""
        shapes = {}  # each file's header read once
        for path in {source[0] for source in self.sources.values()}:
            with open_weights(path) as handle:
                names = handle.keys()
                shapes |= {(path, key): list(handle.get_slice(key).get_shape()) for key in names}
        wrong = {}
        for name, parameter in model.named_parameters():
            path, key, transposed = self.sources[name]
            shape = shapes[path, key]
            want = list(parameter.shape)[::-1] if transposed else list(parameter.shape)
            if shape != want:  # a tensor two parameters start from is named once
                wrong[key] = f"{key} {shape} (config.json gives {want})"
        if wrong:
            disagree = listed(list(wrong.values()))
            raise ValueError(f"{folder}'s weights disagree with its config.json: {disagree}")

    def init_tensor(
        self, name: str, tensor: Tensor, generator: torch.Generator | None = None
    ) -> None:
        """Fill `tensor` (parameter `name`'s full shape, any dtype) with the checkpoint's
        tensor, cast to `tensor`'s dtype; `generator` is unused (the model's `init_tensor`
        signature)."""
        path, key, transposed = self.sources[name]
        with open_weights(path) as handle:
            stored = handle.get_tensor(key)
        tensor.copy_(stored.T if transposed else stored)
