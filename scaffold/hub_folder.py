"""A Hugging Face model folder as the planner sees it (`init_from`): the shape its config.json
gives, in plain Python (scaffold does not need torch or transformers).

The architectures are the rendered project's (hub/architecture.py there): transformers'
`llama`, `mistral` and `qwen2` (the project's `llama` family) and `gpt2`; the project refuses
the rest when it loads the folder, and so does this reader, in the same words, before anything
is rendered. `tests/test_hub_folder.py` holds the parameter counts here to the rendered models'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from scaffold.errors import AnswerError
from scaffold.shapes import DecoderShape

LLAMA_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED = "llama, mistral and qwen2 (without sliding window or rope scaling), gpt2"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
HEADER_LIMIT = 100_000_000  # bytes; safetensors refuses a longer header too


@dataclass(frozen=True)
class HubDecoderShape(DecoderShape):
    """A decoder read from a model folder's config.json: the `DecoderShape` of its width,
    depth and heads (activations are estimated as for the example's decoder, whose blocks hold
    the same 12w^2 weights to a few percent), with the folder's exact parameter counts.

    Llama family per block: q and o w x heads x head_dim, k and v w x kv_heads x head_dim (plus
    Qwen2's q/k/v biases), the SwiGLU MLP 3 x w x intermediate, two RMSNorms w. Outside: the
    embedding, the final norm, and the head unless tied. GPT-2: as `DecoderShape`, its position
    embedding `max_positions` long, and its head the project's own (untied).
    """

    family: str = "llama"
    model_type: str = "llama"
    kv_heads: int = 0
    head_dim: int = 0
    intermediate: int = 0
    max_positions: int = 0
    tied: bool = False
    qkv_bias: bool = False
    output_bias: bool = False
    folder: str = ""

    def lora_parameters(self, rank: int) -> int:
        """Parameters of LoRA adapters of `rank` on every attention and MLP projection of a
        Llama-family model (the rendered `lora_targets`): rank x (inputs + outputs) each."""
        w, attention = self.width, self.heads * self.head_dim
        kv, mlp = self.kv_heads * self.head_dim, self.intermediate
        per_block = 2 * (w + attention) + 2 * (w + kv) + 3 * (w + mlp)
        return rank * per_block * self.depth

    @property
    def unit_params(self) -> tuple[int, ...]:
        if self.family == "gpt2":
            return super().unit_params
        w, attention = self.width, self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        block = 2 * w * attention + 2 * w * kv + 3 * w * self.intermediate + 2 * w
        block += (attention + 2 * kv) * self.qkv_bias + w * self.output_bias
        return (block,) * self.depth

    @property
    def root_params(self) -> int:
        if self.family == "gpt2":
            return (2 * self.vocab + self.max_positions + 2) * self.width
        return (self.vocab * (1 if self.tied else 2) + 1) * self.width

    @property
    def matmul_params(self) -> tuple[tuple[int, ...], int]:
        if self.family == "gpt2":
            return super().matmul_params
        norms = 2 * self.width
        return tuple(params - norms for params in self.unit_params), self.vocab * self.width

    def describe(self) -> str:
        return f"{self.model_type} {super().describe()}, from {self.folder}"

    def provenance(self) -> str:
        grouped = self.family == "llama" and self.kv_heads != self.heads
        kv = f", {self.kv_heads} key-value heads" if grouped else ""
        tied = ", tied embeddings" if self.tied else ""
        if self.family == "gpt2":
            tied = ", its output layer trained apart from the embedding (ByteGPT's is untied)"
        return (
            f"shape {self.depth} x {self.width}, {self.head_words}{kv}: {self.folder}'s "
            f"config.json ({self.model_type}, context {self.max_positions}, vocabulary "
            f"{self.vocab:,}{tied})"
        )


def read_hub_folder(folder: str, block_size: int) -> HubDecoderShape:
    """The shape of the model in `folder` trained at a context of `block_size` tokens (at most
    its own: longer is cut to it).

    Raises:
        AnswerError: no config.json or tokenizer.json there, JSON that does not parse, an
            architecture the project cannot hold (the message lists those it can), no
            safetensors weights, or a weights file cut short or corrupt (`check_safetensors`).
    """
    path = Path(folder).expanduser() / CONFIG_FILE
    if not path.parent.is_dir():
        raise AnswerError(f"init_from {folder} does not exist; name a Hugging Face model folder")
    if not path.is_file():
        raise AnswerError(
            f"init_from {folder} holds no {CONFIG_FILE}; name a Hugging Face model folder "
            "(config.json, safetensors weights, tokenizer.json)"
        )
    try:
        hub = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise AnswerError(f"{path} is not JSON ({error})") from None
    for weights in weight_files(Path(folder)):
        check_safetensors(weights)
    if not (Path(folder) / TOKENIZER_FILE).is_file():
        raise AnswerError(
            f"init_from {folder} holds no {TOKENIZER_FILE}, the tokenizer prepare encodes with"
        )
    model_type = hub.get("model_type")
    try:
        if model_type == "gpt2":
            shape = gpt2_shape(hub, folder, block_size)
        elif model_type in LLAMA_TYPES:
            shape = llama_shape(hub, folder, block_size)
        else:
            shape = None
    except KeyError as error:
        raise AnswerError(
            f"{path} has no {error.args[0]!r}, which a {model_type} config needs"
        ) from None
    if shape is None:
        raise AnswerError(
            f"{path}: model_type {model_type!r} is not supported; supported: {SUPPORTED}"
        )
    tokens = tokenizer_size(Path(folder) / TOKENIZER_FILE)
    if tokens > shape.vocab:
        raise AnswerError(
            f"init_from {folder}: its tokenizer.json has {tokens:,} tokens and the model's "
            f"embedding {shape.vocab:,} rows; name the tokenizer the model was trained with"
        )
    return shape


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of `folder`'s weights: model.safetensors, or each shard that
    model.safetensors.index.json maps a tensor to (transformers' layout), in name order.

    Raises:
        AnswerError: neither file is there, the index is not JSON or has no weight_map, or it
            names a shard that is not there.
    """
    index = folder / INDEX_FILE
    if not index.is_file():
        if not (folder / WEIGHTS_FILE).is_file():
            raise AnswerError(
                f"init_from {folder} holds no {WEIGHTS_FILE} or its index; save the weights "
                "as safetensors"
            )
        return [folder / WEIGHTS_FILE]
    try:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
        raise AnswerError(f"{index} is not a weight index ({error!r}); download it again") from None
    missing = [shard for shard in shards if not (folder / shard).is_file()]
    if missing:
        raise AnswerError(f"{index} names shards that are not there: {', '.join(missing)}")
    return [folder / shard for shard in shards]


def check_safetensors(path: Path) -> None:
    """Refuse `path` unless it is a complete safetensors file (`safetensors_problem`).

    Raises:
        AnswerError: naming `path` and what is wrong with it, in one line.
    """
    problem = safetensors_problem(path)
    if problem:
        raise AnswerError(
            f"init_from {path} is not a complete safetensors file ({problem}); download it again"
        )


def safetensors_problem(path: Path) -> str:
    """What keeps `path` from being a safetensors file, as safetensors checks it before it
    reads a tensor, or "" when nothing does. The format: an 8-byte little-endian header
    length N, N bytes of JSON mapping each tensor name to its `data_offsets` [begin, end)
    (bytes after the header), then the data, which must end where the file does. Reads the
    header only (at most HEADER_LIMIT bytes), never the tensors."""
    size = path.stat().st_size
    with path.open("rb") as file:
        if size < 8:
            return f"{size} bytes, fewer than the header's 8-byte length"
        length = int.from_bytes(file.read(8), "little")
        if length > min(size - 8, HEADER_LIMIT):
            return f"a header of {length:,} bytes in a file of {size:,}"
        raw = file.read(length)
    try:
        header = json.loads(raw)
        header.pop("__metadata__", None)
        end = 8 + length + max((entry["data_offsets"][1] for entry in header.values()), default=0)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as error:
        return f"its header does not parse: {error!r}"
    return "" if end == size else f"its tensors end at byte {end:,} of a {size:,}-byte file"


def tokenizer_size(path: Path) -> int:
    """Tokens of a tokenizer.json (its model's vocabulary and its added tokens: the largest id
    + 1), read as JSON; 0 where it names none.

    Raises:
        AnswerError: the file is not JSON.
    """
    try:
        tokenizer = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise AnswerError(f"{path} is not JSON ({error})") from None
    vocab = (tokenizer.get("model") or {}).get("vocab") or {}
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
    ids += [token.get("id", 0) for token in tokenizer.get("added_tokens") or []]
    return max(ids, default=-1) + 1


def refuse(folder: str, what: str) -> None:
    raise AnswerError(f"{folder}/{CONFIG_FILE}: {what} is not supported; supported: {SUPPORTED}")


def llama_shape(hub: dict, folder: str, block_size: int) -> HubDecoderShape:
    if hub.get("num_local_experts") or hub.get("num_experts"):
        refuse(folder, "a mixture of experts")
    window = hub.get("sliding_window") if hub.get("use_sliding_window", True) else None
    if hub["model_type"] != "llama" and window and window < hub["max_position_embeddings"]:
        refuse(folder, f"sliding-window attention (sliding_window {window})")
    scaling = hub.get("rope_scaling") or {}
    kind = (hub.get("rope_parameters") or {}).get("rope_type", "default")
    if scaling or kind != "default":
        refuse(folder, f"rope scaling ({scaling.get('rope_type') or scaling.get('type') or kind})")
    if hub.get("hidden_act", "silu") != "silu" or hub.get("mlp_bias"):
        refuse(
            folder,
            f"an MLP of {hub.get('hidden_act')}{' with biases' if hub.get('mlp_bias') else ''}",
        )
    qwen2 = hub["model_type"] == "qwen2"
    heads, width = hub["num_attention_heads"], hub["hidden_size"]
    context = hub["max_position_embeddings"]
    return HubDecoderShape(
        width=width,
        depth=hub["num_hidden_layers"],
        block_size=min(block_size, context),
        heads=heads,
        vocab=hub["vocab_size"],
        family="llama",
        model_type=hub["model_type"],
        kv_heads=hub.get("num_key_value_heads") or heads,
        head_dim=hub.get("head_dim") or width // heads,
        intermediate=hub["intermediate_size"],
        max_positions=context,
        tied=bool(hub.get("tie_word_embeddings", qwen2)),
        qkv_bias=qwen2 or bool(hub.get("attention_bias")),
        output_bias=not qwen2 and bool(hub.get("attention_bias")),
        folder=folder,
    )


def gpt2_shape(hub: dict, folder: str, block_size: int) -> HubDecoderShape:
    if hub.get("activation_function", "gelu_new") not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        refuse(folder, f"a GPT-2 MLP of {hub['activation_function']}")
    width, context = hub["n_embd"], hub["n_positions"]
    if hub.get("n_inner") not in (None, 4 * width):
        refuse(folder, f"a GPT-2 MLP of {hub['n_inner']} channels (not 4 x n_embd)")
    return HubDecoderShape(
        width=width,
        depth=hub["n_layer"],
        block_size=min(block_size, context),
        heads=hub["n_head"],
        vocab=hub["vocab_size"],
        family="gpt2",
        model_type="gpt2",
        head_dim=width // hub["n_head"],
        max_positions=context,
        folder=folder,
    )
