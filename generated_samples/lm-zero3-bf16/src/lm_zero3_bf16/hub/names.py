"""Parameter names between this project's models and the Hugging Face checkpoints they load
from and export to.

The Llama family's names are transformers' own (models/llama.py). `ByteGPT` (model.py) keeps its own
readable names; GPT-2's checkpoints name the same tensors otherwise, and store its linear
layers' weights transposed (transformers' `Conv1D` keeps them `[in, out]`).
"""

from __future__ import annotations

import re

GPT2_PREFIX = "transformer."  # transformers' save_pretrained names; GPT-2's original files omit it
# (ByteGPT's name, GPT-2's name without GPT2_PREFIX); a linear layer's weight is transposed.
GPT2_NAMES = (
    (r"token_embedding\.weight", r"wte.weight"),
    (r"position_embedding\.weight", r"wpe.weight"),
    (r"blocks\.(\d+)\.ln_attn\.(weight|bias)", r"h.\1.ln_1.\2"),
    (r"blocks\.(\d+)\.attn\.qkv\.(weight|bias)", r"h.\1.attn.c_attn.\2"),
    (r"blocks\.(\d+)\.attn\.proj\.(weight|bias)", r"h.\1.attn.c_proj.\2"),
    (r"blocks\.(\d+)\.ln_mlp\.(weight|bias)", r"h.\1.ln_2.\2"),
    (r"blocks\.(\d+)\.mlp\.0\.(weight|bias)", r"h.\1.mlp.c_fc.\2"),
    (r"blocks\.(\d+)\.mlp\.2\.(weight|bias)", r"h.\1.mlp.c_proj.\2"),
    (r"ln_final\.(weight|bias)", r"ln_f.\1"),
    (r"head\.weight", r"lm_head.weight"),
)
GPT2_LINEAR = re.compile(r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight")
# Buffers older GPT-2 files hold (the causal mask), which ByteGPT builds in its attention call.
GPT2_BUFFERS = re.compile(r"h\.\d+\.attn\.(masked_)?bias")
GPT2_TIED_HEAD = "wte.weight"  # where a GPT-2 with tied embeddings keeps its output layer


def hub_name(family: str, name: str) -> tuple[str, bool]:
    """The checkpoint's name of this project's parameter `name` in a model of `family`
    ("llama" or "gpt2"; GPT-2's without GPT2_PREFIX), and whether the checkpoint stores the
    tensor transposed.

    Raises:
        KeyError: a GPT-2 parameter name that ByteGPT does not have.
    """
    if family == "llama":
        return name, False
    for own, hub in GPT2_NAMES:
        match = re.fullmatch(own, name)
        if match:
            key = match.expand(hub)
            return key, bool(GPT2_LINEAR.fullmatch(key))
    raise KeyError(name)


def file_name(family: str, key: str) -> str:
    """The name transformers' `save_pretrained` gives the tensor `hub_name` calls `key`."""
    if family == "gpt2" and key != "lm_head.weight":
        return GPT2_PREFIX + key
    return key


def canonical_name(family: str, stored: str) -> str | None:
    """A checkpoint's tensor name as `hub_name` gives it, or None for a buffer that is no
    parameter (GPT2_BUFFERS)."""
    if family != "gpt2":
        return stored
    key = stored.removeprefix(GPT2_PREFIX)
    return None if GPT2_BUFFERS.fullmatch(key) else key
