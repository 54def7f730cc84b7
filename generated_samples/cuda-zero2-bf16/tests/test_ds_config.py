"""ds_config.json: only keys the project checks pass, and train.toml's settings are filled in."""

from __future__ import annotations

import json

import pytest

from cuda_zero2_bf16.engine.deepspeed_zero import DS_CONFIG_PATH, load_ds_config


def test_the_rendered_config_loads_with_the_runs_settings(config):
    ds_config = load_ds_config(DS_CONFIG_PATH, config)
    assert ds_config["zero_optimization"]["stage"] == 2
    assert ds_config["train_micro_batch_size_per_gpu"] == config.micro_batch_size
    assert ds_config["gradient_accumulation_steps"] == config.grad_accum_steps
    assert ds_config["gradient_clipping"] == config.max_grad_norm


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ({"zero_optimisation": {"stage": 2}}, "zero_optimisation"),
        ({"zero_optimization": {"stage": 2, "overlap_com": True}}, "overlap_com"),
        ({"torch_autocast": {"enabled": True}}, "torch_autocast"),
        ({"train_micro_batch_size_per_gpu": 4}, "micro_batch_size"),
        ({"gradient_clipping": 0.5}, "max_grad_norm"),
    ],
)
def test_unchecked_and_train_toml_keys_are_refused(tmp_path, config, bad, named):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=named):
        load_ds_config(path, config)


def test_a_file_that_is_not_json_is_a_one_line_error(tmp_path, config):
    path = tmp_path / "ds_config.json"
    path.write_text("{stage: 3")
    with pytest.raises(ValueError, match="cannot read the DeepSpeed config"):
        load_ds_config(path, config)
