"""scaffold.shapes against the rendered models: the same shapes, head counts and parameter counts
at every size, and the activation bytes the memory model counts are the bytes autograd really
keeps."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import itertools
import math
import sys
from typing import TYPE_CHECKING

import pytest
from conftest import REPO_ROOT

from scaffold.fitting import micro_batch_candidates
from scaffold.shapes import BYTE_VOCAB, PUBLISHED_DECODERS, DecoderShape, cnn_for, decoder_for
from scaffold.variants import DEFAULT_VARIANT

if TYPE_CHECKING:
    import torch

# torch is imported by the tests that use it, not at collection (seconds in every process).
LM_SAMPLE = "lm-cpu-single-fp32"
LM_MODEL = REPO_ROOT / "templates" / "_variants" / "task" / "language-model" / "model.py"


@functools.cache
def rendered(variant: str, module: str):
    """A module of a committed sample's package, imported from its src/ folder."""
    src = REPO_ROOT / "generated_samples" / variant / "src"
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    return importlib.import_module(f"{variant.replace('-', '_')}.{module}")


@functools.cache
def lm_model():
    """The language model's model.py as the template renders it (included verbatim), imported
    into the LM sample's package for its relative imports: the committed sample may lag the
    template until the samples are regenerated."""
    package = rendered(LM_SAMPLE, "config").__package__
    spec = importlib.util.spec_from_file_location(f"{package}.template_model", LM_MODEL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def parameter_count(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def geometric_mean(a: int, b: int) -> int:
    return round(math.sqrt(a * b))


PUBLISHED = sorted({row.size for row in PUBLISHED_DECODERS})
# Every published size, a size between each two (in log scale), the example's small sizes and
# both sides of where its small shapes end (10M), past the largest published decoder, and past
# the largest decoder the model builds (its widest width).
SIZES = [30_000, 10**5, 10**6, 5 * 10**6, 10**7, 10**7 + 1, 3 * 10**7, 5 * 10**7, 10**12, 10**13]
SIZES += PUBLISHED + [geometric_mean(a, b) for a, b in itertools.pairwise(PUBLISHED)]


@pytest.mark.parametrize("params", sorted(SIZES))
@pytest.mark.parametrize(("block_size", "vocab"), [(32, 257), (2048, 257), (2048, 50_304)])
def test_the_decoder_shape_is_the_rendered_models(params, block_size, vocab, monkeypatch):
    import torch

    # Everything here is built on the meta device, where filling a tensor stores nothing but
    # torch still runs each initializer's Python decomposition (most of this test's time, in
    # shape_for's search too): shapes and parameter counts need no initial values.
    for name in dir(torch.nn.init):
        if name.endswith("_") and not name.startswith("_"):
            monkeypatch.setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
    model_py = lm_model()
    monkeypatch.setattr(model_py, "PLANNED_VOCABULARY", vocab)  # as the planner renders it
    shape = decoder_for(params, block_size, vocab)
    assert model_py.shape_for(params, block_size) == (shape.depth, shape.width, shape.heads)
    with torch.device("meta"):
        model = model_py.ByteGPT(shape.width, shape.depth, shape.heads, block_size)
    assert shape.params == parameter_count(model)
    assert shape.unit_params[0] == parameter_count(model.shard_units()[0])
    assert model.shard_units()[0].attn.heads == shape.heads


def test_the_byte_vocabulary_is_the_rendered_codecs():
    """The planner's byte vocabulary (the bytes plan's NUM_CLASSES) is the one the rendered
    `bytes` tokenizer encodes with."""
    corpus = rendered(LM_SAMPLE, "corpus.shards")
    assert corpus.BYTE_VOCABULARY == BYTE_VOCAB == corpus.Codec(None).vocab_size


def test_the_published_tables_are_the_same():
    rows = [(r.name, r.size, r.depth, r.width, r.heads) for r in PUBLISHED_DECODERS]
    assert rows == list(lm_model().PUBLISHED_SHAPES)


@pytest.mark.parametrize("row", PUBLISHED_DECODERS, ids=lambda row: row.name)
def test_a_published_size_renders_that_decoders_shape(row):
    shape = decoder_for(row.size, 2048)
    assert (shape.depth, shape.width, shape.heads) == (row.depth, row.width, row.heads)
    assert shape.row == row and shape.exact
    assert row.name in shape.provenance() and "counts" in shape.provenance()


@pytest.mark.parametrize(
    ("size", "depth", "width", "heads", "row"),
    [(3 * 10**7, 6, 640, 10, "Pythia-70M"), (10**8, 12, 832, 13, "GPT-2"),
     (10**9, 24, 1920, 15, "GPT-3 XL"), (4 * 10**9, 32, 3280, 41, "GPT-3 2.7B"),
     (30 * 10**9, 60, 6528, 51, "LLaMA-33B")],
)  # fmt: skip
def test_a_size_between_published_ones_takes_the_nearest_ones_depth_and_head_size(
    size, depth, width, heads, row
):
    """1B: the nearest published blocks are GPT-3 XL's 24 x 2048 (1.21B as built here, against
    Large's 0.68B): 24 blocks of heads of 128, and 24 x (12 w^2 + 13 w) + (2 x 257 + 2048 + 2) w
    first reaches 1B at w = 1920 = 15 x 128 (1,067,201,280; 14 x 128 = 1792 gives 929,994,240)."""
    shape = decoder_for(size, 2048)
    assert (shape.depth, shape.width, shape.heads, shape.row.name) == (depth, width, heads, row)
    assert not shape.exact and shape.params >= size
    assert DecoderShape(width - width // heads, depth, 2048, heads - 1).params < size


def test_small_sizes_keep_the_examples_own_shapes():
    """What the rendered tests and the default project train: 2 blocks up to 1M parameters, 4
    up to 10M, heads of 32 (the test settings' 30K at context 32: 2 x 32; the default 100K)."""
    shapes = [decoder_for(30_000, 32), decoder_for(10**5, 64), decoder_for(10**7, 64)]
    assert [(s.depth, s.width, s.heads, s.row) for s in shapes] == [
        (2, 32, 1, None), (2, 64, 2, None), (4, 480, 15, None)
    ]  # fmt: skip
    assert decoder_for(10**7 + 1, 64).row.name == "Pythia-70M"


@pytest.mark.parametrize("params", [25_000, 10**5, 10**6, 5 * 10**7])
def test_the_cnn_shape_is_the_rendered_models(params):
    import torch

    model_py = rendered(DEFAULT_VARIANT, "model")
    shape = cnn_for(params)
    assert shape.width == model_py.width_for_param_count(params)
    with torch.device("meta"):
        model = model_py.DigitsCNN(shape.width)
    assert shape.params == parameter_count(model)
    assert list(shape.unit_params) == [parameter_count(unit) for unit in model.shard_units()]


def saved_bytes(model: torch.nn.Module, forward) -> int:
    """Bytes autograd keeps for backward during `forward()`: each storage once, parameters'
    own storage excluded (it is the weights, not an activation)."""
    import torch

    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    return sum(storages.values())


# (residual bytes, compute bytes, how the model runs): fp32; bf16 parameters, as FSDP2's
# MixedPrecisionPolicy computes; bf16 autocast over fp32 parameters, which also keeps the
# low-precision copy of every matmul weight for backward.
PRECISIONS = {"fp32": (4, 4, None), "bf16-params": (2, 2, None), "autocast": (4, 2, "cpu")}


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("size", [10**6, 10**7 + 1])  # heads of 32; of 64 (6 x 384)
def test_decoder_activations_are_what_autograd_saves(precision, checkpointing, size):
    import torch

    model_py, task = lm_model(), rendered(LM_SAMPLE, "task")
    residual, compute, autocast = PRECISIONS[precision]
    shape, batch = decoder_for(size, 64), 8
    model = model_py.ByteGPT(shape.width, shape.depth, shape.heads, shape.block_size)
    if precision == "bf16-params":
        model = model.to(torch.bfloat16)
    if checkpointing:
        rendered(LM_SAMPLE, "engine.build").checkpoint_units(model)
    tokens = torch.randint(0, 256, (batch, shape.block_size))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast is not None):
        measured = saved_bytes(model, lambda: task.loss_fn(model(tokens), tokens))
    predicted = shape.activations(batch, residual, compute, 0.0).saved(checkpointing)
    if autocast and not checkpointing:
        unit_casts, root_cast = shape.matmul_params
        predicted += compute * (sum(unit_casts) + root_cast)
    elif autocast:  # the head's copy only: checkpointed units recompute their casts
        predicted += compute * shape.matmul_params[1]
    assert predicted == pytest.approx(measured, rel=0.01)


def test_cnn_activations_are_what_autograd_saves():
    import torch

    model_py, task = rendered(DEFAULT_VARIANT, "model"), rendered(DEFAULT_VARIANT, "task")
    shape, batch = cnn_for(10**5), 16
    model = model_py.DigitsCNN(shape.width, dropout=0.0)
    images, labels = torch.randn(batch, 1, 8, 8), torch.randint(0, 10, (batch,))
    measured = saved_bytes(model, lambda: task.loss_fn(model(images), labels))
    predicted = shape.activations(batch, 4, 4, 0.0).saved(False)
    assert predicted == pytest.approx(measured, rel=0.01)


def test_a_resume_on_another_world_size_splits_the_batch_as_the_planner_does():
    """The rendered `split_global_batch` and the planner's rule (`micro_batch_candidates`: the
    largest divisor of the samples per process that fits, here that is at most the limit)."""
    split_global_batch = rendered(LM_SAMPLE, "checkpoint.world_size").split_global_batch
    for world_size in (1, 2, 3, 4, 8):
        for global_batch in range(world_size, 200, world_size):
            per_process = global_batch // world_size
            for limit in (1, 3, 8, 64):
                micro = next(m for m in micro_batch_candidates(per_process) if m <= limit)
                expected = (micro, per_process // micro)
                assert split_global_batch(global_batch, world_size, limit) == expected
