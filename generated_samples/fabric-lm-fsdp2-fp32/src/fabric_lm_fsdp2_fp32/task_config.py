"""The task's settings: the example's data, model and schedule. Yours, with data.py, model.py
and task.py: `config.Config` takes every field here, and configs/train.toml sets their values.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .corpus import (
    MANIFEST,
    RUN_MANIFEST,
    TEMPLATE_FILE,
    TOKENIZER_FILE,
    describe_change,
    manifest_at,
    same_tokenizer,
)

MODEL_FAMILIES = ("gpt2", "llama")  # model.py's ByteGPT and models/llama.py's Llama
FINETUNES = ("full", "lora")  # every weight trains, or LoRA adapters only (models/lora.py)

# How a task's data changed since a checkpoint, in words, and why a run may not go on with it
# (None: it may): `TaskConfig.task_data_change`.
DataChange = tuple[str, str | None]


@dataclass(frozen=True)
class TaskConfig:
    """The task's fields of the run's `Config` (units as there: `epochs` are passes over the
    training split, `warmup_steps` optimizer steps, `micro_batch_size` samples per process;
    `max_tokens` training tokens, 0 for no token budget)."""

    run_dir: str = "runs/stdlib-lm"
    data_dir: str = "data/stdlib"
    prepare_example: bool = True
    tokenizer: str = "bytes"
    val_fraction: float = 0.1
    corpus_bytes: int = 300_000
    block_size: int = 64
    pack: bool = True
    model_family: str = "gpt2"
    init_from: str = ""
    finetune: str = "full"
    lora_rank: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.0
    lora_targets: str = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    dropout: float = 0.0
    eval_every: int = 61
    eval_bytes: int = 45000
    epochs: int = 4
    max_tokens: int = 20_000_000
    micro_batch_size: int = 32
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    early_stop_patience: int = 3
    # data settings a resume must keep (checkpoint/resume.py): they fix what a checkpoint trained on
    task_resume_keys: ClassVar[tuple[str, ...]] = (
        "model_family",
        "init_from",
        "finetune",
        "lora_rank",
        "lora_alpha",
        "lora_targets",
        "base_fingerprint",
        "data_dir",
        "block_size",
        "pack",
        "max_tokens",
        "data_fingerprint",
    )

    @property
    def data_fingerprint(self) -> str:
        """The content fingerprint of the corpus prepared in `data_dir` ('' before prepare):
        its shards' and tokenizer's checksums (`Manifest.fingerprint`), so that a corpus
        prepared again to the same tokens is the same corpus."""
        manifest = manifest_at(Path(self.data_dir) / MANIFEST)
        return manifest.fingerprint() if manifest else ""

    @property
    def base_fingerprint(self) -> str:
        """For LoRA, the checksum of init_from's weights files, which a run's adapters rest on
        and its checkpoints leave out (models/lora.py); '' otherwise."""
        if self.finetune != "lora" or not self.init_from:
            return ""
        return weights_fingerprint(Path(self.init_from))

    def task_max_steps(self, sequences_per_step: int) -> int:
        """The most optimizer steps of `sequences_per_step` sequences of `block_size` tokens
        that train at most `max_tokens` tokens, and at least one (0: no token budget)."""
        if not self.max_tokens:
            return 0
        return max(1, self.max_tokens // (sequences_per_step * self.block_size))

    def task_evaluation(self, runtime: Any, step: int) -> Any:
        """Bits per byte of the first `eval_bytes` of the validation split every `eval_every`
        optimizer steps (evaluate/bits_per_byte.py's HeldOutEvaluation, for a launch that
        starts at `step`); None where `eval_every` is 0."""
        if not self.eval_every:
            return None
        from .evaluate.bits_per_byte import HeldOutEvaluation

        return HeldOutEvaluation(self, runtime, step)

    def task_data_change(self, saved: dict[str, Any], run_dir: str) -> DataChange | None:
        """How the corpus in `data_dir` differs from the one a checkpoint trained on (`saved`:
        its config), in words, and why a run may not continue on it (None: it may): not on
        another tokenizer's ids, which would mean other text. None when it is the same corpus.
        `run_dir`'s RUN_MANIFEST, the manifest the run recorded, names what changed."""
        if saved.get("base_fingerprint", "") != self.base_fingerprint:
            return (
                f"the weights in init_from={self.init_from} are not those the adapters trained on",
                "the adapters would sit on other weights; put the model folder back as it was",
            )
        path = Path(self.data_dir) / MANIFEST
        if saved.get("data_fingerprint") in (self.data_fingerprint, legacy_fingerprint(path)):
            return None
        now, before = manifest_at(path), manifest_at(Path(run_dir) / RUN_MANIFEST)
        if now is None:
            return f"{self.data_dir} holds no prepared corpus now", "prepare one there first"
        if before is None:
            return f"{self.data_dir} holds another corpus (the run recorded none of its own)", None
        if same_tokenizer(before, now):
            return describe_change(before, now), None
        tokenizer = "bytes" if before.tokenizer == "bytes" else f"{run_dir}/{TOKENIZER_FILE}"
        fix = f"prepare the corpus with --tokenizer {tokenizer}, the run's own"
        return describe_change(before, now), f"its token ids would mean other text; {fix}"

    def task_run_files(self) -> dict[str, Path]:
        """Files a run keeps in its folder, by name, copied there when a launch starts, so its
        weights stay usable whatever becomes of `data_dir`: the manifest of the corpus it
        trains on (RUN_MANIFEST), its tokenizer.json (none for bytes) and the chat template its
        examples were rendered with (chat records only)."""
        files = {RUN_MANIFEST: Path(self.data_dir) / MANIFEST}
        for name in (TOKENIZER_FILE, TEMPLATE_FILE):
            if (Path(self.data_dir) / name).is_file():
                files[name] = Path(self.data_dir) / name
        return files

    def task_problems(self) -> list[str]:
        """Every task setting outside its range, one message per key (empty when all are
        valid); `Config.problems` adds them to its own."""
        problems = []
        for key in ("block_size", "corpus_bytes"):
            if getattr(self, key) <= 0:
                problems.append(f"{key} must be > 0, got {getattr(self, key)!r}")
        for key in ("max_tokens", "eval_every"):
            if getattr(self, key) < 0:
                problems.append(f"{key} must be >= 0, got {getattr(self, key)!r}")
        if self.eval_bytes <= self.block_size:
            problems.append(
                f"eval_bytes must be > block_size ({self.block_size}), got {self.eval_bytes!r}"
            )
        if not 0 <= self.dropout < 1:
            problems.append(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.model_family not in MODEL_FAMILIES:
            families = ", ".join(MODEL_FAMILIES)
            problems.append(f"model_family must be one of {families}, got {self.model_family!r}")
        if problem := tokenizer_problem(self.init_from, self.tokenizer):
            own = Path(self.init_from) / TOKENIZER_FILE
            problems.append(f'{problem}; set tokenizer = "{own}"')
        if self.finetune not in FINETUNES:
            finetunes = ", ".join(FINETUNES)
            problems.append(f"finetune must be one of {finetunes}, got {self.finetune!r}")
        elif self.finetune == "lora" and not self.init_from:
            problems.append(
                "finetune = lora adapts a Llama-family model started from init_from; set "
                "init_from to its folder, or finetune = full"
            )
        elif self.finetune == "lora" and self.model_family != "llama":
            problems.append(
                f"finetune = lora adapts a Llama-family model, and model_family is "
                f"{self.model_family!r} ({self.init_from}); set finetune = full"
            )
        if self.lora_rank < 1 or self.lora_alpha <= 0 or not 0 <= self.lora_dropout < 1:
            problems.append(
                "lora_rank must be >= 1, lora_alpha > 0 and lora_dropout in [0, 1), got "
                f"{self.lora_rank!r}, {self.lora_alpha!r}, {self.lora_dropout!r}"
            )
        if self.dropout and self.model_family == "llama":
            problems.append("dropout applies to model_family gpt2 only; set it to 0")
        if self.tokenizer not in ("bytes", "bpe") and not self.tokenizer.endswith(".json"):
            problems.append(
                f"tokenizer must be bytes, bpe or a tokenizer.json path, got {self.tokenizer!r}"
            )
        if not 0 < self.val_fraction < 1:
            problems.append(f"val_fraction must be in (0, 1), got {self.val_fraction!r}")
        return problems


def tokenizer_problem(init_from: str, tokenizer: str) -> str | None:
    """Why `tokenizer` cannot encode the data of a model started from `init_from` (None: it
    can): where the model folder has a tokenizer.json, its ids are the ones the model was
    trained on, so the data must be encoded with that one (the same file's content)."""
    own = Path(init_from) / TOKENIZER_FILE if init_from else None
    if own is None or not own.is_file():
        return None
    named = tokenizer not in ("bytes", "bpe") and Path(tokenizer).is_file()
    if named and Path(tokenizer).read_bytes() == own.read_bytes():
        return None
    return (
        f"tokenizer {tokenizer!r} is not {own}, the one init_from's model was trained with "
        "(its ids would mean other text to it)"
    )


@functools.cache
def _fingerprint(folder: Path, files: tuple[tuple[str, int, int], ...]) -> str:
    """SHA-256 over the weights `files` (name, bytes, modification time) of `folder`: their
    names, sizes and bytes, in name order."""
    digest = hashlib.sha256()
    for name, size, _ in files:
        digest.update(json.dumps([name, size]).encode())
        with open(folder / name, "rb") as file:
            while chunk := file.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


def weights_fingerprint(folder: Path) -> str:
    """The checksum of a model folder's weights files (*.safetensors), computed once per
    process for the files as they are (names, sizes, modification times): a whole read of a
    large model takes a while."""
    files = tuple(
        (path.name, path.stat().st_size, path.stat().st_mtime_ns)
        for path in sorted(folder.glob("*.safetensors"))
    )
    return _fingerprint(folder.resolve(), files)


def legacy_fingerprint(path: Path) -> str:
    """What a checkpoint of an earlier version recorded as the data's fingerprint: the
    SHA-256 of manifest.json's bytes ('' where there is none)."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
