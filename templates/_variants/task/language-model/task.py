"""The task: next-token prediction. The loss and validation metrics of a batch of logits, the
weights of an optimizer step's micro-batches, and the throughput line of the run summary
(tokens/s and model FLOPs utilisation).

A target equal to `IGNORE_INDEX` (padding, and the tokens of chat and instruction examples that
are not trained: corpus/examples.py) counts for nothing: not in the loss, its gradient, nor the
metrics. The bundled corpus has none."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .config import Config
from .corpus import IGNORE_INDEX, MANIFEST, ExampleRows, manifest_at
from .data import PLANNED_VOCABULARY, input_spec
from .engine.mfu import model_flops_utilization
from .runtime import Runtime, all_reduce_sum

# A uniform prediction's cross-entropy over the planned vocabulary (`expected_initial_loss`: the
# data's).
EXPECTED_INITIAL_LOSS = math.log(PLANNED_VOCABULARY)
# The validation metrics `validation_metrics` returns, and the direction in which each improves: the
# names `monitor` may take, and those the log, the plot and the summary show.
METRICS = {"val_loss": "min", "val_accuracy": "max"}
# What `eval_sums` adds up over validation batches and ranks, in its order.
SUMS = ("loss_sum", "correct", "count")


def expected_initial_loss(config: Config) -> float:
    """A uniform prediction's cross-entropy over the model's vocabulary (`data.input_spec`):
    the initial loss of random weights."""
    return math.log(input_spec(config)[0])


def plan_change(config: Config) -> str | None:
    """The line a run's start prints on what the prepared data changed against the plan (the
    vocabulary, and with it the model's shape: model.py's `plan_change`); None where nothing
    changed, or where model.py is one of your own that does not say."""
    try:
        from .model import plan_change as model_plan_change
    except ImportError:  # a model.py of your own
        return None
    return model_plan_change(config)


def counted_targets(targets: Tensor) -> Tensor:
    """How many of int64 `targets` (any shape) are not `IGNORE_INDEX`: an int64 0-dim tensor
    on their device."""
    return (targets != IGNORE_INDEX).sum()


def loss_fn(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy over the counted positions: logits `[B, T, V]`, int64 targets `[B, T]`
    (a 0-dim tensor, computed in fp32 whatever the logits' dtype); 0 where none counts, instead
    of the 0/0 NaN (its gradient is 0 either way)."""
    flat_logits, flat_targets = logits.float().flatten(0, 1), targets.flatten()
    loss = F.cross_entropy(flat_logits, flat_targets, ignore_index=IGNORE_INDEX)
    return torch.where(counted_targets(targets) > 0, loss, 0.0)


def micro_batch_weights(targets: list[Tensor], runtime: Runtime) -> list[Tensor]:
    """The factor of each micro-batch's mean loss in one optimizer step, given the step's
    targets on this rank (one int64 tensor per micro-batch, on the device): `n_i * M * W / N`
    for `n_i` counted targets of micro-batch i, M micro-batches, W processes and N counted
    targets of the step on every process (a collective; no host sync). With the loop's `/ M`
    and the gradient mean over processes, the step's gradient is that of the mean over all N
    tokens, not the mean of per-micro-batch means, which weighs a nearly empty padded
    micro-batch like a full one (huggingface/transformers#24725, fixed there in PR #34191).
    Equal counts give weights of exactly 1.0: the same step, bitwise, as unweighted."""
    counts = torch.stack([counted_targets(batch) for batch in targets])
    total = all_reduce_sum(counts.sum(), runtime)
    return list(counts * (len(targets) * runtime.world_size) / total)


def eval_sums(logits: Tensor, targets: Tensor) -> Tensor:
    """Per-batch SUMS `[loss_sum, correct, count]` over counted tokens (float64), to be summed
    over batches and ranks.

    Accuracy is next-token accuracy. Sums, not means, so batches of any size weigh by tokens.
    """
    flat_logits, flat_targets = logits.float().flatten(0, 1), targets.flatten()
    loss_sum = F.cross_entropy(
        flat_logits, flat_targets, reduction="sum", ignore_index=IGNORE_INDEX
    )
    correct = (flat_logits.argmax(dim=-1) == flat_targets).sum()  # never IGNORE_INDEX
    count = counted_targets(flat_targets)
    return torch.stack([loss_sum.double(), correct.double(), count.double()])


def validation_metrics(totals: dict[str, float]) -> dict[str, float]:
    """The METRICS of a validation from the totals of its SUMS over every batch and rank."""
    count = totals["count"]
    return {"val_loss": totals["loss_sum"] / count, "val_accuracy": totals["correct"] / count}


def throughput(summary: dict[str, Any]) -> dict[str, float | None]:
    """The summary's rates per second of training time (validation excluded): sequences,
    tokens, model FLOPs (6 N per token for forward + backward, N parameters; Kaplan et al.
    2020, "Scaling Laws for Neural Language Models", §2.1) and their share of the GPU's peak
    (engine/mfu.py, where scaffold keeps the GPUs' peaks).
    At the run's end (`summary` has its `steps`), also the data it trained on (`data_trained`)
    and, for chat and instruction examples, their padding (`example_padding`)."""
    block_size = summary["config"]["block_size"]
    samples_per_second = summary["samples"] / max(summary["train_seconds"], 1e-9)
    tokens_per_second = samples_per_second * block_size
    flops_per_second = 6 * summary["parameters"] * tokens_per_second
    rates = {
        "samples_per_second": samples_per_second,
        "tokens_per_second": tokens_per_second,
        "model_flops_per_second": flops_per_second,
        "mfu": model_flops_utilization(flops_per_second, summary["device"]),
    }
    if "steps" not in summary:
        return rates
    return rates | example_padding(summary["config"]) | data_trained(summary)


def data_trained(summary: dict[str, Any]) -> dict[str, float | None]:
    """What the run trained on, counted from the summary's `epochs` (passes of the training
    loader over its `samples_per_epoch` windows or rows), so that no figure contradicts the
    Steps line's epochs:
    `tokens_per_step`, the positions of one full optimizer step (global batch x block_size;
    an epoch's last step may hold fewer micro-batches); `tokens_per_epoch`, the corpus tokens
    one loader epoch reads (`loader_epoch_tokens`: padding excluded); `tokens_trained`,
    epochs x that; `tokens_per_parameter`, per TRAINED parameter (a LoRA run's adapters;
    Hoffmann et al. 2022 find ~20 compute-optimal for training all of them);
    `corpus_train_tokens`, the prepared corpus's training tokens; `epoch_share_of_corpus`,
    the share of them one loader epoch reads (under 1: each shard's tail shorter than a
    window, and the samples of a last partial batch, are left out); `epochs_over_corpus`,
    epochs x that share (None without a manifest).
    A summary without `samples_per_epoch` (one a test of an earlier release builds) counts
    `steps` full steps instead, and has no `tokens_per_epoch` or `epoch_share_of_corpus`."""
    config = summary["config"]
    corpus = corpus_train_tokens(config["data_dir"])
    tokens_per_step = summary["global_batch_size"] * config["block_size"]
    per_epoch = share = None
    trained = summary["steps"] * tokens_per_step
    if "samples_per_epoch" in summary:
        per_epoch = loader_epoch_tokens(config, summary["samples_per_epoch"])
        trained = round(summary["epochs"] * per_epoch)
        share = per_epoch / corpus if corpus else None
    trained_parameters = summary.get("trained_parameters") or summary["parameters"]
    over = None if not corpus else trained / corpus if share is None else summary["epochs"] * share
    return {
        "tokens_per_step": tokens_per_step,
        "tokens_per_epoch": per_epoch,
        "tokens_trained": trained,
        "tokens_per_parameter": trained / trained_parameters,
        "corpus_train_tokens": corpus,
        "epoch_share_of_corpus": share,
        "epochs_over_corpus": over,
    }


def loader_epoch_tokens(config: dict[str, Any], samples_per_epoch: int) -> float:
    """The corpus tokens one epoch of the training loader reads from its `samples_per_epoch`
    samples: windows of `block_size` tokens for text (a window's inputs; its last target is
    the next window's first token), or for chat and instruction examples, rows at the train
    split's mean example tokens per row (padding excluded; `pack` puts several in a row)."""
    data_dir = Path(config["data_dir"])
    manifest = manifest_at(data_dir / MANIFEST)
    if manifest is None or manifest.kind == "text":
        return float(samples_per_epoch * config["block_size"])
    train = manifest.shards["train"]
    rows = ExampleRows(data_dir, train, manifest.dtype, config["block_size"], config["pack"], 0)
    return samples_per_epoch * manifest.tokens("train") / max(len(rows), 1)


def example_padding(config: dict[str, Any]) -> dict[str, float]:
    """For chat and instruction examples (none for text), the share of the training rows'
    positions that is padding one example a row (`padding_unpacked`) and packed
    (`padding_packed`): what packing saves."""
    data_dir = Path(config["data_dir"])
    manifest = manifest_at(data_dir / MANIFEST)
    if manifest is None or manifest.kind == "text":
        return {}
    rows = ExampleRows(
        data_dir, manifest.shards["train"], manifest.dtype, config["block_size"], False, 0
    )
    return {
        "padding_unpacked": rows.padding_share(False),
        "padding_packed": rows.padding_share(True),
    }


def corpus_train_tokens(data_dir: str) -> int | None:
    """The training tokens of the corpus prepared in `data_dir` (None: no manifest there)."""
    manifest = manifest_at(Path(data_dir) / MANIFEST)
    return None if manifest is None else manifest.tokens("train")


def describe_throughput(summary: dict[str, Any]) -> str:
    """The rates of `throughput` as the summary's Throughput line shows them; the epochs over
    the corpus as the Steps line's epochs times the share of the corpus an epoch reads."""
    mfu = summary["mfu"]
    mfu_text = "n/a (no GPU peak known)" if mfu is None else f"{mfu:.1%}"
    line = (
        f"{summary['samples_per_second']:,.0f} sequences/s, "
        f"{summary['tokens_per_second']:,.0f} tokens/s, MFU {mfu_text}"
    )
    if "tokens_trained" not in summary:
        return line
    over, share = summary["epochs_over_corpus"], summary["epoch_share_of_corpus"]
    corpus = "" if over is None else f", {over:.3g} passes over the corpus"
    if share is not None:
        corpus = (
            f"; {summary['epochs']:.3g} epochs x {share:.1%} of the corpus's "
            f"{summary['corpus_train_tokens']:,} training tokens = {over:.3g} passes over it"
        )
    padding = ""
    if "padding_packed" in summary:
        packed = "packed" if summary["config"]["pack"] else "packing would leave"
        padding = (
            f"; padding {summary['padding_unpacked']:.1%} of positions one example a row, "
            f"{summary['padding_packed']:.1%} {packed}"
        )
    return (
        f"{line}; data: {summary['tokens_per_step']:,} tokens per step, "
        f"{summary['tokens_trained']:,} corpus tokens trained "
        f"({summary['tokens_per_parameter']:.3g} per trained parameter{corpus}){padding}"
    )
