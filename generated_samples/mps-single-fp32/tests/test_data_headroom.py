"""The data-headroom measurement: what it reads, what it trains, and what its verdict says."""

from __future__ import annotations

import pytest

from mps_single_fp32 import data_headroom
from mps_single_fp32.data_headroom import describe, main, measure_headroom
from mps_single_fp32.loader import make_train_loader
from mps_single_fp32.runtime import init_runtime
from mps_single_fp32.train import Trainer

from conftest import PROJECT_ROOT, TEST_OVERRIDES


class CountingDataset:
    """Wraps a dataset and counts the batch reads that reach it."""

    def __init__(self, dataset):
        self.dataset, self.reads = dataset, 0

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices):
        self.reads += 1
        return self.dataset[indices]


def test_reads_the_batches_asked_for_and_times_the_steps_asked_for(config):
    runtime = init_runtime("cpu")
    trainer = Trainer(config, runtime)
    counting = CountingDataset(trainer.train_loader.dataset)
    trainer.train_loader = make_train_loader(counting, config, runtime)
    batches = len(trainer.train_loader) + 3  # more than one epoch: the loader starts over
    figures = measure_headroom(trainer, batches=batches, steps=2)
    assert counting.reads == batches
    assert trainer.scheduler.last_epoch == 2 + 2, "two untimed steps, then the timed ones"
    expected = figures["step_seconds"] / (
        figures["loader_seconds_per_batch"] * config.grad_accum_steps
    )
    assert figures["headroom"] == pytest.approx(expected)
    assert figures["micro_batches_per_step"] == config.grad_accum_steps


@pytest.mark.parametrize(
    ("headroom", "verdict"),
    [(0.5, "bottleneck"), (3.0, "less than 10x"), (40.0, "room to spare")],
)
def test_the_verdict_follows_the_rule(headroom, verdict):
    figures = {"loader_seconds_per_batch": 1e-3, "step_seconds": headroom * 1e-3}
    figures |= {"micro_batches_per_step": 1, "headroom": headroom}
    assert verdict in describe(figures).splitlines()[1]


def test_the_command_prints_the_figures_writes_nothing_and_refuses_bad_counts(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)  # where a run folder would appear
    # The process group is this test session's, which later tests still use: not shut down.
    monkeypatch.setattr(data_headroom, "shutdown_runtime", lambda runtime: None)
    settings = ["--config", str(PROJECT_ROOT / "configs" / "train.toml"), "device=cpu"]
    figures = main([*settings, "--batches", "3", "--steps", "1", *TEST_OVERRIDES])
    assert f"headroom {figures['headroom']:.1f}x" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="at least 1"):
        main([*settings, "--steps", "0"])
    assert list(tmp_path.iterdir()) == []
