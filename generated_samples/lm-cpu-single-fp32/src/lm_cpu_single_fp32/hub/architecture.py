"""A Hugging Face model folder's `config.json` read into this project's shapes, and written
back from them: the architectures the project's two model families can hold exactly.

`llama` (models/llama.py) holds transformers' `llama`, `mistral` (no sliding window) and `qwen2`
(q/k/v biases, no sliding window) models; `gpt2` (model.py's `ByteGPT`) holds `gpt2`. Anything
else (mixture-of-experts, sliding-window attention, scaled rotary positions, another
`model_type`) is refused in one line that lists what is supported, since loading it into a
layout that differs would give other logits without a word.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tokenizers import Tokenizer

from ..models.llama import LlamaShape

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
LLAMA_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
LLAMA_TYPES |= {"qwen2": "Qwen2ForCausalLM"}
GPT2_ACTIVATIONS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}
SUPPORTED = "llama, mistral and qwen2 (without sliding window or rope scaling), gpt2"


class GPT2Shape(NamedTuple):
    """A GPT-2's sizes (transformers' `GPT2Config` fields in parentheses) and its GELU:
    `gelu_approximate` "none" (exact, `gelu`) or "tanh" (`gelu_new`, GPT-2's own)."""

    vocab_size: int  # vocab_size
    width: int  # n_embd
    depth: int  # n_layer
    heads: int  # n_head
    max_positions: int  # n_positions
    gelu_approximate: str = "none"


@dataclass(frozen=True)
class Architecture:
    """What a model folder's config.json says to build: its `model_type`, the family that
    holds it ("llama" or "gpt2") and that family's shape, and its special token ids."""

    model_type: str
    family: str
    shape: LlamaShape | GPT2Shape
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    @property
    def vocab_size(self) -> int:
        """Rows of the embedding."""
        return self.shape.vocab_size

    @property
    def special_token_ids(self) -> dict[str, int | list[int]]:
        """`bos_token_id` and `eos_token_id` where the model has them, as transformers' config
        and generation config name them."""
        ids = {"bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id}
        return {key: value for key, value in ids.items() if value is not None}

    @property
    def max_positions(self) -> int:
        """The longest context, in tokens."""
        return self.shape.max_positions


def read_architecture(folder: Path) -> Architecture:
    """The architecture `folder`'s config.json describes.

    Raises:
        ValueError: no such folder, no config.json there, or one that is not JSON, or an
            architecture neither family holds (the message lists the supported ones), a field
            missing, or a tokenizer.json that does not load or holds more tokens than the
            embedding has rows.
    """
    path = Path(folder) / CONFIG_FILE
    if not path.parent.is_dir():
        raise ValueError(f"init_from {folder} does not exist; name a Hugging Face model folder")
    if not path.is_file():
        raise ValueError(
            f"{folder} holds no {CONFIG_FILE}; init_from names a Hugging Face model folder"
        )
    try:
        hub = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not JSON ({error})") from None
    model_type = hub.get("model_type")
    try:
        if model_type in LLAMA_TYPES:
            shape, family = llama_shape(hub, path), "llama"
        elif model_type == "gpt2":
            shape, family = gpt2_shape(hub, path), "gpt2"
        else:
            raise ValueError(
                f"{path}: model_type {model_type!r} is not supported; supported: {SUPPORTED}"
            )
    except KeyError as error:
        raise ValueError(
            f"{path} has no {error.args[0]!r}, which a {model_type} config needs"
        ) from None
    tokenizer = Path(folder) / TOKENIZER_FILE
    if tokenizer.is_file():
        try:
            size = Tokenizer.from_file(str(tokenizer)).get_vocab_size(with_added_tokens=True)
        except Exception as error:  # the tokenizers library raises its own, untyped
            raise ValueError(f"{tokenizer} does not load as a tokenizer ({error})") from None
        if size > shape.vocab_size:
            raise ValueError(
                f"{tokenizer} has {size:,} tokens and the model's embedding {shape.vocab_size:,} "
                "rows; name the tokenizer the model was trained with"
            )
    tokens = {key: hub.get(key) for key in ("bos_token_id", "eos_token_id")}
    return Architecture(model_type, family, shape, **tokens)


def refuse(path: Path, what: str) -> None:
    """Raise the one-line refusal of an architecture feature the project cannot hold."""
    raise ValueError(f"{path}: {what} is not supported; supported: {SUPPORTED}")


def rope_theta(hub: dict[str, Any], path: Path) -> float:
    """The rotary base, from `rope_theta` or (transformers 5) `rope_parameters`; scaled rotary
    positions (Llama 3.1's `llama3`, YaRN, ...) are refused."""
    parameters = hub.get("rope_parameters") or {}
    scaling = hub.get("rope_scaling") or {}
    kind = parameters.get("rope_type", "default")
    if scaling or kind != "default":
        refuse(path, f"rope scaling ({scaling.get('rope_type') or scaling.get('type') or kind})")
    return float(parameters.get("rope_theta", hub.get("rope_theta", 10_000.0)))


def llama_shape(hub: dict[str, Any], path: Path) -> LlamaShape:
    """The `LlamaShape` of a llama, mistral or qwen2 config."""
    if hub.get("num_local_experts") or hub.get("num_experts"):
        refuse(path, "a mixture of experts")
    window = hub.get("sliding_window") if hub.get("use_sliding_window", True) else None
    if hub["model_type"] != "llama" and window and window < hub["max_position_embeddings"]:
        refuse(path, f"sliding-window attention (sliding_window {window})")
    if hub.get("hidden_act", "silu") != "silu" or hub.get("mlp_bias"):
        refuse(
            path,
            f"an MLP of {hub.get('hidden_act')}{' with biases' if hub.get('mlp_bias') else ''}",
        )
    qwen2 = hub["model_type"] == "qwen2"
    heads = hub["num_attention_heads"]
    return LlamaShape(
        vocab_size=hub["vocab_size"],
        width=hub["hidden_size"],
        depth=hub["num_hidden_layers"],
        heads=heads,
        kv_heads=hub.get("num_key_value_heads") or heads,
        intermediate=hub["intermediate_size"],
        max_positions=hub["max_position_embeddings"],
        rope_theta=rope_theta(hub, path),
        norm_eps=float(hub.get("rms_norm_eps", 1e-6 if qwen2 else 1e-5)),
        tied_embeddings=bool(hub.get("tie_word_embeddings", qwen2)),
        qkv_bias=qwen2 or bool(hub.get("attention_bias")),
        output_bias=not qwen2 and bool(hub.get("attention_bias")),
        head_dim=hub.get("head_dim") or 0,
    )


def gpt2_shape(hub: dict[str, Any], path: Path) -> GPT2Shape:
    """The `GPT2Shape` of a gpt2 config."""
    activation = hub.get("activation_function", "gelu_new")
    if activation not in GPT2_ACTIVATIONS:
        refuse(path, f"a GPT-2 MLP of {activation}")
    width = hub["n_embd"]
    if hub.get("n_inner") not in (None, 4 * width):
        refuse(path, f"a GPT-2 MLP of {hub['n_inner']} channels (not 4 x n_embd)")
    if hub.get("scale_attn_by_inverse_layer_idx") or hub.get("reorder_and_upcast_attn"):
        refuse(path, "GPT-2 attention scaled by layer (scale_attn_by_inverse_layer_idx)")
    if not hub.get("scale_attn_weights", True):
        refuse(path, "GPT-2 attention without 1/sqrt(head size) (scale_attn_weights false)")
    return GPT2Shape(
        vocab_size=hub["vocab_size"],
        width=width,
        depth=hub["n_layer"],
        heads=hub["n_head"],
        max_positions=hub["n_positions"],
        gelu_approximate=GPT2_ACTIVATIONS[activation],
    )


def hub_config(architecture: Architecture) -> dict[str, Any]:
    """The config.json transformers builds `architecture` from (`AutoConfig`), in float32. The
    special token ids are written even where the model has none (null): a missing key would take
    the config class's default (GPT-2's 50256, Llama's 1 and 2), ids of no token here."""
    shape = architecture.shape
    if isinstance(shape, GPT2Shape):
        activation = "gelu" if shape.gelu_approximate == "none" else "gelu_new"
        config = {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": shape.vocab_size,
            "n_positions": shape.max_positions,
            "n_embd": shape.width,
            "n_layer": shape.depth,
            "n_head": shape.heads,
            "activation_function": activation,
            "layer_norm_epsilon": 1e-5,
            # ByteGPT's output layer is a parameter of its own, trained apart from the embedding.
            "tie_word_embeddings": False,
            **dict.fromkeys(("resid_pdrop", "embd_pdrop", "attn_pdrop"), 0.0),
        }
    else:
        config = {
            "architectures": [LLAMA_TYPES[architecture.model_type]],
            "model_type": architecture.model_type,
            "vocab_size": shape.vocab_size,
            "hidden_size": shape.width,
            "intermediate_size": shape.intermediate,
            "num_hidden_layers": shape.depth,
            "num_attention_heads": shape.heads,
            "num_key_value_heads": shape.kv_heads,
            "head_dim": shape.channels_per_head,
            "max_position_embeddings": shape.max_positions,
            "rms_norm_eps": shape.norm_eps,
            "rope_theta": shape.rope_theta,
            "hidden_act": "silu",
            "tie_word_embeddings": shape.tied_embeddings,
        }
        if architecture.model_type == "llama":
            config |= {"attention_bias": shape.output_bias, "mlp_bias": False}
        else:
            config |= {"sliding_window": None, "use_sliding_window": False}
    special = {"bos_token_id": architecture.bos_token_id, "eos_token_id": architecture.eos_token_id}
    return config | special | {"torch_dtype": "float32"}
