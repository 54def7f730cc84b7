"""Write a trained model as a Hugging Face model folder: what
`transformers.AutoModelForCausalLM.from_pretrained(folder)` and `AutoTokenizer.from_pretrained`
load with no custom code, and vLLM serves.

The folder holds config.json (`architecture.hub_config`), the weights under transformers' names
in safetensors files of at most `max_shard_bytes` each (more than one: with
model.safetensors.index.json, transformers' sharded layout), generation_config.json, and the
tokenizer: its tokenizer.json and a tokenizer_config.json naming the special tokens (the
original's, where the model came from a folder that had one), and the chat template the model's
chat examples were rendered with, in chat_template.jinja (where transformers >= 4.43 reads
it); generation_config.json's `eos_token_id` lists every id that ends a reply (the end of text
and the template's end of turn), so that `generate` and vLLM stop there.
It is written in a scratch folder beside the destination and renamed into place, so an export
that fails leaves nothing.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .architecture import CONFIG_FILE, Architecture, hub_config
from .names import file_name, hub_name
from .weights import INDEX_FILE, WEIGHTS_FILE

TOKENIZER_CONFIG = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
# A shard's tensors are in memory while it is written (safetensors writes a file whole), so the
# shard size bounds an export's memory: 2 GiB, within transformers' 5GB of version 4.
DEFAULT_SHARD_BYTES = 2 * 2**30


def export_dtype(name: str) -> torch.dtype:
    """The torch floating-point dtype named `name` ("float32", or a 16-bit one to halve the
    folder).

    Raises:
        ValueError: `name` names no floating-point dtype of torch.
    """
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype {name!r} is no floating-point dtype of torch, e.g. float32")
    return dtype


def shard_plan(sizes: dict[str, int], max_shard_bytes: int) -> list[list[str]]:
    """Tensor names in order, cut into consecutive groups of at most `max_shard_bytes` each
    (a tensor larger than that gets a file of its own)."""
    shards: list[list[str]] = [[]]
    filled = 0
    for name, size in sizes.items():
        if shards[-1] and filled + size > max_shard_bytes:
            shards.append([])
            filled = 0
        shards[-1].append(name)
        filled += size
    return shards


def tokenizer_config(architecture: Architecture, eot: str | None) -> dict[str, Any]:
    """A tokenizer_config.json for a tokenizer.json that came with none: the fast tokenizer
    class, its end-of-text token `eot` as the end and padding token."""
    special = {"eos_token": eot, "pad_token": eot} if eot else {}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": architecture.max_positions,
        "clean_up_tokenization_spaces": False,
        **special,
    }


def export_folder(
    weights: Path,
    architecture: Architecture,
    out: Path,
    tokenizer: Path | None = None,
    eot: str | None = None,
    original_tokenizer_config: Path | None = None,
    dtype: str = "float32",
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    chat_template: str | None = None,
    stop_ids: tuple[int, ...] = (),
) -> list[Path]:
    """Write the model folder `out` from `weights` (a safetensors file of the project's
    parameter names, as a run writes them) of a model of `architecture`, with `tokenizer` (a
    tokenizer.json; its end-of-text token `eot`), where given the tokenizer_config.json it
    came with, and its `chat_template` (`write_tokenizer`); generation_config.json ends a reply
    at `stop_ids` (default: the architecture's `eos_token_id`). Tensors are cast to `dtype` (a
    torch dtype's name: `export_dtype`) and read one at a time; a shard's tensors are in memory
    while it is written. Returns the files written.

    Raises:
        ValueError: `out` exists and is not empty, `dtype` is unknown, or `weights` is missing
            or holds names the architecture does not have.
    """
    out = Path(out)
    refuse_used(out)
    cast = export_dtype(dtype)
    if not Path(weights).is_file():
        raise ValueError(f"{weights} not found; train first, or name the weights with --weights")
    family = architecture.family
    with safe_open(weights, framework="pt") as handle:
        names = list(handle.keys())
        shapes = {name: handle.get_slice(name).get_shape() for name in names}
    sizes = {name: math.prod(shape) * cast.itemsize for name, shape in shapes.items()}
    try:
        keys = {name: hub_name(family, name) for name in names}
    except KeyError as error:
        raise ValueError(
            f"{weights} holds {error.args[0]!r}, which a {family} model does not"
        ) from None
    with new_folder(out) as scratch:
        shards = shard_plan(sizes, max_shard_bytes)
        weight_map = {}
        for number, group in enumerate(shards, start=1):
            shard = (
                WEIGHTS_FILE
                if len(shards) == 1
                else (f"model-{number:05d}-of-{len(shards):05d}.safetensors")
            )
            tensors = {}
            with safe_open(weights, framework="pt") as handle:
                for name in group:
                    key, transposed = keys[name]
                    tensor = handle.get_tensor(name).to(cast)
                    tensors[file_name(family, key)] = (
                        tensor.T if transposed else tensor
                    ).contiguous()
            save_file(tensors, scratch / shard, metadata={"format": "pt"})
            weight_map |= dict.fromkeys(tensors, shard)
        if len(shards) > 1:
            index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
            write_json(scratch / INDEX_FILE, index)
        write_json(scratch / CONFIG_FILE, hub_config(architecture) | {"torch_dtype": dtype})
        generation = architecture.special_token_ids
        if len(stop_ids) > 1:
            generation |= {"eos_token_id": list(stop_ids)}
        write_json(scratch / "generation_config.json", generation)
        if tokenizer is not None:
            write_tokenizer(
                scratch, architecture, tokenizer, eot, original_tokenizer_config, chat_template
            )
    return sorted(out.iterdir())


def write_tokenizer(
    folder: Path,
    architecture: Architecture,
    tokenizer: Path,
    eot: str | None = None,
    original_tokenizer_config: Path | None = None,
    chat_template: str | None = None,
) -> list[Path]:
    """Write the tokenizer files of a model folder into `folder`: `tokenizer` as tokenizer.json,
    the `original_tokenizer_config` (else one naming the end-of-text token `eot`) and the
    `chat_template` source as chat_template.jinja, where transformers >= 4.43 reads a
    template (taken out of tokenizer_config.json, which would otherwise hold a second one).
    Returns the files written."""
    shutil.copyfile(tokenizer, folder / "tokenizer.json")
    settings = tokenizer_config(architecture, eot)
    if original_tokenizer_config is not None and original_tokenizer_config.is_file():
        settings = json.loads(original_tokenizer_config.read_text(encoding="utf-8"))
    written = [folder / "tokenizer.json", folder / TOKENIZER_CONFIG]
    if chat_template is not None:
        settings.pop("chat_template", None)
        (folder / TEMPLATE_FILE).write_text(chat_template, encoding="utf-8")
        written.append(folder / TEMPLATE_FILE)
    write_json(folder / TOKENIZER_CONFIG, settings)
    return written


def refuse_used(out: Path) -> None:
    """Raises ValueError: `out` exists and is not an empty folder."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not empty; name a new folder")


@contextlib.contextmanager
def new_folder(out: Path) -> Iterator[Path]:
    """A private scratch folder beside `out` to write into; once the block ends it becomes
    `out` (published: `publish`), whole or not at all (removed on any error).

    Raises:
        ValueError: `out` exists and is not an empty folder.
    """
    refuse_used(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield scratch
        publish(scratch)
        if out.exists():
            out.rmdir()
        scratch.rename(out)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def publish(folder: Path) -> None:
    """Give `folder` and its files the permissions of a folder and files made with this
    process's umask (the scratch folder is private, 0700, as tempfile makes it): a server that
    runs as another user reads an export as it reads any other folder."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.iterdir():
        path.chmod(0o666 & ~umask)


def write_json(path: Path, value: dict[str, Any]) -> None:
    """`value` as indented JSON in `path`."""
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
