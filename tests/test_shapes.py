"""scaffold.shapes against the rendered models: the same parameter counts at every size, and the
activation bytes the memory model counts are the bytes autograd really keeps."""

from __future__ import annotations

import functools
import importlib
import sys

import pytest
import torch
from conftest import REPO_ROOT

from scaffold.shapes import cnn_for, decoder_for
from scaffold.variants import DEFAULT_VARIANT

LM_SAMPLE = "lm-cpu-single-fp32"


@functools.cache
def rendered(variant: str, module: str):
    """A module of a committed sample's package, imported from its src/ folder."""
    src = REPO_ROOT / "generated_samples" / variant / "src"
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    return importlib.import_module(f"{variant.replace('-', '_')}.{module}")


def parameter_count(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


SIZES = [30_000, 10**5, 10**6, 5 * 10**6, 5 * 10**7, 3 * 10**8, 7 * 10**9]


@pytest.mark.parametrize("params", SIZES)
@pytest.mark.parametrize("block_size", [32, 64, 2048])
def test_the_decoder_shape_is_the_rendered_models(params, block_size):
    model_py = rendered(LM_SAMPLE, "model")
    shape = decoder_for(params, block_size)
    depth = model_py.depth_for(params)
    width = model_py.width_for_param_count(params, depth, block_size)
    assert (shape.width, shape.depth) == (width, depth)
    with torch.device("meta"):
        model = model_py.ByteGPT(width, depth, block_size)
    assert shape.params == parameter_count(model)
    assert shape.unit_params[0] == parameter_count(model.shard_units()[0])


@pytest.mark.parametrize("params", [25_000, 10**5, 10**6, 5 * 10**7])
def test_the_cnn_shape_is_the_rendered_models(params):
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
def test_decoder_activations_are_what_autograd_saves(precision, checkpointing):
    model_py, task = rendered(LM_SAMPLE, "model"), rendered(LM_SAMPLE, "task")
    residual, compute, autocast = PRECISIONS[precision]
    shape, batch = decoder_for(10**6, 64), 8
    model = model_py.ByteGPT(shape.width, shape.depth, shape.block_size)
    if precision == "bf16-params":
        model = model.to(torch.bfloat16)
    if checkpointing:
        rendered(LM_SAMPLE, "build").checkpoint_units(model)
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
    model_py, task = rendered(DEFAULT_VARIANT, "model"), rendered(DEFAULT_VARIANT, "task")
    shape, batch = cnn_for(10**5), 16
    model = model_py.DigitsCNN(shape.width, dropout=0.0)
    images, labels = torch.randn(batch, 1, 8, 8), torch.randint(0, 10, (batch,))
    measured = saved_bytes(model, lambda: task.loss_fn(model(images), labels))
    predicted = shape.activations(batch, 4, 4, 0.0).saved(False)
    assert predicted == pytest.approx(measured, rel=0.01)
