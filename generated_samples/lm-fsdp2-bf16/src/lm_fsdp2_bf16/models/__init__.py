"""The language model's families and what they share: the Llama-architecture decoder
(`llama.py`; the GPT-style one is model.py's own), PEFT's LoRA adapters on either (`lora.py`),
the masks and positions of packed rows (`packing.py`) and the key-value cache that decoding
reads (`kv_cache.py`). model.py, yours, builds from these."""

from .kv_cache import KVCache, LayerCache, new_positions
from .llama import Llama, LlamaShape
from .lora import adapter_state, add_adapters, base_name, merged_state, write_adapter
from .packing import document_causal_mask, document_positions

__all__ = [
    "KVCache",
    "LayerCache",
    "Llama",
    "LlamaShape",
    "adapter_state",
    "add_adapters",
    "base_name",
    "document_causal_mask",
    "document_positions",
    "merged_state",
    "new_positions",
    "write_adapter",
]
