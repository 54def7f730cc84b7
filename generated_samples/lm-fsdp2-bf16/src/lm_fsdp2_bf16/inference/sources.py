"""A trained language model as the commands that use it read it back (generate, chat, evaluate,
export): from a run folder (its best weights, another weights file, or a checkpoint of any
strategy) or from a Hugging Face model folder (what export writes, or any folder `init_from`
takes), with the tokenizer, chat template and end-of-turn ids that go with it."""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from ..checkpoint import WEIGHTS_FILE
from ..config import Config, load_config
from ..corpus import MANIFEST, RUN_MANIFEST, TOKENIZER_FILE, Codec, manifest_at, read_manifest
from ..corpus.chat import TEMPLATE_FILE, ChatTemplate, read_tokenizer_config, template_beside
from ..engine import Engine, build_on_meta, materialize
from ..hub import Architecture, HubWeights, read_architecture
from ..model import decoder_for, model_architecture
from ..runtime import init_runtime, shutdown_runtime
from ..training import build_optimizer
from .trained import load_trained, run_config

GENERATION_CONFIG = "generation_config.json"
PROBE_REPLY = "\x00"  # a reply no template rewrites: what follows it in a turn ends the turn


@dataclass
class LanguageModel:
    """A model ready to decode: the module (eval mode, on its device), its tokenizer, the
    positions it reads (`context`), its chat template (None: it has none) and the ids that end
    a reply (end of text, and the template's end of turn)."""

    model: nn.Module
    codec: Codec
    context: int
    template: ChatTemplate | None
    stop_ids: tuple[int, ...]
    source: str  # where it was read from, for messages


def add_source_arguments(parser: argparse.ArgumentParser, chat: bool = True) -> None:
    """The options that name a model: `--run-dir` (default: configs/train.toml's) with
    `--weights` or `--checkpoint`, or `--model FOLDER`, and (`chat`) `--chat-template FILE`."""
    parser.add_argument("--run-dir", help="the trained run (default: configs/train.toml's)")
    parser.add_argument("--weights", default=WEIGHTS_FILE, help="a weights file of the run")
    parser.add_argument("--checkpoint", help="a checkpoint folder of the run instead")
    parser.add_argument("--model", help="a Hugging Face model folder (an export) instead of a run")
    if chat:
        parser.add_argument("--chat-template", help="a .jinja chat template, not the model's")


def device_named(name: str) -> torch.device:
    """The device `--device NAME` names: "auto" (a CUDA GPU where torch sees one, else the
    CPU), "cpu", "cuda", "cuda:N" or "mps".

    Raises:
        ValueError: a name torch does not know, or a device this machine does not have.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r} is no device; use auto, cpu, cuda or mps") from None
    present = {
        "cpu": True,
        "cuda": torch.cuda.is_available(),
        "mps": torch.backends.mps.is_available(),
    }
    if not present.get(device.type, False):
        raise ValueError(f"--device {name}: this machine has no such device; use --device cpu")
    return device


def load_language_model(args: argparse.Namespace, device: torch.device) -> LanguageModel:
    """The model `add_source_arguments`' options name, on `device`.

    Raises:
        ValueError: both a run and --model named, a missing run, weights file, checkpoint or
            folder, weights that do not fit, or a chat template that does not load.
    """
    if args.model and (args.run_dir or args.checkpoint):
        raise ValueError(
            "name a run (--run-dir, --checkpoint) or a model folder (--model), not both"
        )
    if args.model:
        folder = Path(args.model)
        model, architecture = folder_model(folder, device)
        codec = folder_codec(folder, architecture)
        template = folder_template(folder)
        context, source = architecture.max_positions, str(folder)
        stops = architecture.eos_token_id
        extra = stops if isinstance(stops, list) else [stops] * (stops is not None)
    else:
        run_dir = Path(args.run_dir or load_config("configs/train.toml").run_dir)
        config = run_config(run_dir)
        with tempfile.TemporaryDirectory() as scratch:
            weights = args.weights
            if args.checkpoint:
                weights = checkpoint_weights(config, Path(args.checkpoint), Path(scratch) / "w")
            model, config = load_trained(run_dir, str(weights), device)
        codec, template = run_codec(run_dir, config), run_template(run_dir, config)
        context, source, extra = model_architecture(config).max_positions, str(run_dir), []
    if getattr(args, "chat_template", None):
        template = ChatTemplate.load(Path(args.chat_template))
    turn_ends = end_of_turn_ids(template, codec) if template else []
    stops = tuple(dict.fromkeys([codec.eot_id, *turn_ends, *extra]))
    return LanguageModel(model.eval(), codec, context, template, stops, source)


def folder_model(folder: Path, device: torch.device) -> tuple[nn.Module, Architecture]:
    """The model a Hugging Face folder holds, as this project builds its family (Llama's or
    GPT-2's layout), its weights read tensor by tensor (`HubWeights`), and its architecture.

    Raises:
        ValueError: see `read_architecture` and `HubWeights`; a LoRA adapter folder.
    """
    if not folder.is_dir():
        raise ValueError(f"--model {folder}: no such folder; name a model folder export wrote")
    if not (folder / "config.json").is_file() and not (folder / "adapter_config.json").is_file():
        raise ValueError(
            f"--model {folder} holds no config.json: name a Hugging Face model folder, such as "
            "one export wrote"
        )
    if (folder / "adapter_config.json").is_file():
        raise ValueError(
            f"{folder} holds LoRA adapters, not a model; export the run with --merge, or name "
            "the run with --run-dir"
        )
    architecture = read_architecture(folder)
    with torch.device("meta"):
        model = decoder_for(architecture)
    model.init_tensor = HubWeights(folder, architecture.family, model).init_tensor
    return materialize(model, device, seed=0), architecture


def folder_codec(folder: Path, architecture: Architecture) -> Codec:
    """The tokenizer of a model folder: its tokenizer.json with the config's end-of-text id (the
    first where it lists several), else byte tokens (what export writes for a byte model)."""
    tokenizer = folder / TOKENIZER_FILE
    if not tokenizer.is_file():
        return Codec(None)
    eos = architecture.eos_token_id
    eos = eos[0] if isinstance(eos, list) and eos else eos
    if eos is None:
        eos_token = read_tokenizer_config(folder).get("eos_token")
        return Codec(tokenizer, eot=eos_token if isinstance(eos_token, str) else None)
    return Codec(tokenizer, eot_id=eos)


def folder_template(folder: Path) -> ChatTemplate | None:
    """A model folder's chat template (chat_template.jinja, or tokenizer_config.json's), if any."""
    found = template_beside(folder / TOKENIZER_FILE)
    return ChatTemplate.load(found) if found else None


def run_codec(run_dir: Path, config: Config) -> Codec:
    """The tokenizer a run trained with: the copy its folder keeps (RUN_MANIFEST and its
    tokenizer.json). A run of an earlier version kept none: then its `data_dir`'s, which must
    still hold the corpus it trained on.

    Raises:
        ValueError: no copy in the run folder, and `data_dir` holds no corpus (where it is
            relative, the message says to run from where the run trained) or another one.
    """
    manifest = manifest_at(run_dir / RUN_MANIFEST)
    if manifest is not None:
        return Codec.for_corpus(run_dir, manifest)
    data_dir = Path(config.data_dir)
    saved = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    if not (data_dir / MANIFEST).is_file():
        relative = "" if data_dir.is_absolute() else ", a path relative to where the run trained"
        raise ValueError(
            f"{run_dir} keeps no tokenizer of its own (a run of an earlier version), and its "
            f"data_dir {data_dir}{relative} holds no corpus here; run this command from there"
        )
    if config.task_data_change(saved, str(run_dir)) is not None:
        raise ValueError(
            f"{data_dir} was prepared again since {run_dir} trained on it, and the run keeps no "
            "tokenizer of its own: prepare it as it was"
        )
    return Codec.for_corpus(data_dir, read_manifest(data_dir, "prepare it as it was"))


def run_template(run_dir: Path, config: Config) -> ChatTemplate | None:
    """The chat template a run's examples were rendered with: the copy its folder keeps
    (chat_template.jinja, from its prepared corpus), else that of the model folder it started
    from; None for a run with neither (a text corpus)."""
    if (run_dir / TEMPLATE_FILE).is_file():
        return ChatTemplate.load(run_dir / TEMPLATE_FILE)
    if config.init_from:
        return folder_template(Path(config.init_from))
    return None


def end_of_turn_ids(template: ChatTemplate, codec: Codec) -> list[int]:
    """The special tokens a template closes an assistant's turn with (`<|im_end|>`,
    `<|eot_id|>`, ...): those among the tokens that follow a reply's text in its turn (what
    prepare trains the model to write after a reply). Empty where the template ends a turn
    with ordinary text, or the tokenizer is bytes."""
    if codec.tokenizer is None:
        return []
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": PROBE_REPLY}]
    try:
        text, spans = template.reply_spans(messages)
    except ValueError:
        return []
    start, end = spans[-1]
    after = text[start:end].split(PROBE_REPLY, 1)[-1]
    special = set(codec.tokenizer.get_added_tokens_decoder())
    return [token for token in codec.encode_batch([after])[0] if token in special]


def checkpoint_weights(config: Config, folder: Path, out: Path) -> Path:
    """The model weights of the checkpoint `folder` as one safetensors file `out` (returned):
    the run's engine, built in this process on the CPU, loads it as a resume on one process
    does (a sharded checkpoint of any world size is resharded) and gathers the whole state
    dict. Holds the model and its optimizer state while it does.

    Raises:
        ValueError: `folder` is no checkpoint the engine loads.
    """
    if not (folder / "trainer.pt").is_file():
        raise ValueError(f"{folder} is no checkpoint folder (no trainer.pt); name a step-N folder")
    runtime = init_runtime("cpu")
    try:
        make_optimizer = functools.partial(build_optimizer, config=config)
        engine = Engine(build_on_meta(config), make_optimizer, runtime, config)
        engine.load(folder)
        state = engine.full_state_dict()
    finally:
        shutdown_runtime(runtime)
    save_file({name: tensor.contiguous() for name, tensor in state.items()}, out)
    return out
