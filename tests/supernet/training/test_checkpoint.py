"""Checkpoints of supernet training (`training.checkpoint`): a float16 run killed half-way
resumes with its loss scaler where it stood, and continues exactly like an uninterrupted run."""

from __future__ import annotations

import pytest
import torch
from _support.drafts import tiny_draft, tiny_samples
from dreams_nas.supernet.training import precision
from dreams_nas.supernet.training.config import TrainConfig
from dreams_nas.supernet.training.tppt import TrainingSet, train_supernet

pytestmark = pytest.mark.usefixtures("one_thread")
CONFIG = TrainConfig(warmup_steps=4, multires_steps=6, batch_size=4, unroll=0,
                     calibration_batches=1, checkpoint_every=2)


class Killed(Exception):
    """Raised from `on_step`, as a kill would end a run half-way."""


class _QuickScaler(torch.amp.GradScaler):
    """float16's scaler, grown every other step (2000 by default): its state moves within a
    few steps, as a long run's does; every scaler made records its state after each step."""

    made: list[torch.amp.GradScaler] = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs, growth_interval=2)
        self.made.append(self)


def _train(folder, kill_at: int | None = None) -> tuple[torch.nn.Module, dict[int, dict]]:
    """Train (in `folder`), killed after step `kill_at`: the draft and the scaler's state
    after each step."""
    draft = tiny_draft(0).train()
    states: dict[int, dict] = {}

    def on_step(step: int, _losses) -> None:
        states[step] = _QuickScaler.made[-1].state_dict()
        if step == kill_at:
            raise Killed

    train_supernet(draft, TrainingSet(tiny_samples(8), (2,)), CONFIG, folder,
                   on_step=on_step, show_progress=False, compute_dtype=torch.float16)
    return draft, states


def test_a_resumed_float16_run_keeps_its_loss_scale(tmp_path, monkeypatch):
    monkeypatch.setattr(precision.torch.amp, "GradScaler", _QuickScaler)
    whole, expected = _train(tmp_path / "whole")
    assert len({s["scale"] for s in expected.values()}) > 2  # the scale moved during the run
    with pytest.raises(Killed):
        _train(tmp_path / "resumed", kill_at=4)
    resumed, states = _train(tmp_path / "resumed")
    assert sorted(states) == list(range(5, CONFIG.total_steps + 1))  # it resumed after step 4
    assert states == {step: expected[step] for step in states}
    for name, tensor in whole.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name
