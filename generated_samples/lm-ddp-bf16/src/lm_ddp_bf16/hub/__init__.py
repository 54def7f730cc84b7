"""The Hugging Face format as the project's border: a model folder's config.json read into
this project's shapes (`architecture.py`), its safetensors weights read into a model built on
the meta device (`weights.py`, under the names `names.py` maps), and a trained model written
back as a folder transformers and vLLM load (`export_folder.py`, which `python -m
<package>.export` runs)."""

from .architecture import CONFIG_FILE, Architecture, GPT2Shape, hub_config, read_architecture
from .export_folder import export_folder
from .weights import HubWeights, weight_files

__all__ = [
    "Architecture",
    "CONFIG_FILE",
    "GPT2Shape",
    "HubWeights",
    "export_folder",
    "hub_config",
    "read_architecture",
    "weight_files",
]
