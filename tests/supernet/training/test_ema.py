"""Phase 2's weight average (`supernet.training.ema`): the closed form, evaluation and the kept
weights on the average, and a resume that continues it exactly."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from _support.training import killed_then_resumed, tiny_supernet, tiny_target_data
from dreams_nas.supernet.training.config import TrainConfig
from dreams_nas.supernet.training.convergence import HeldOut
from dreams_nas.supernet.training.ema import WeightAverage
from dreams_nas.supernet.training.tppt import TrainingSet, train_supernet

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target_data():
    return tiny_target_data()


_draft = tiny_supernet


def test_the_average_is_the_closed_form_and_applied_restores(target_data):
    target, _, _ = target_data
    draft = _draft(target)
    params = {n: p for n, p in draft.named_parameters() if p.requires_grad}
    name = next(iter(params))
    start = params[name].detach().clone()
    average = WeightAverage(draft, 0.9)
    seen = []
    with torch.no_grad():
        for i in range(3):
            params[name].add_(0.1 * (i + 1))
            seen.append(params[name].detach().clone())
            average.update()
    expected = start
    for value in seen:
        expected = 0.9 * expected + 0.1 * value
    torch.testing.assert_close(average.shadow[name], expected)
    with average.applied():
        torch.testing.assert_close(params[name].detach(), expected)
    assert torch.equal(params[name].detach(), seen[-1])  # its own weights back
    with pytest.raises(ValueError, match="decay"):
        WeightAverage(draft, 1.0)


def test_training_scores_and_keeps_the_average_and_resumes_it(target_data, tmp_path):
    target, samples, aifd = target_data
    heldout = HeldOut(samples[-3:], draft_len=3, max_new_tokens=8)
    config = TrainConfig(unroll=1, warmup_steps=4, multires_steps=8, batch_size=4, lr=5e-3,
                         lr_warmup_steps=2, eval_every=4, patience=5, checkpoint_every=3,
                         ema_decay=0.8)
    draft = _draft(target)
    out = train_supernet(draft, TrainingSet(samples[:-3], aifd.chosen, heldout), config,
                         tmp_path / "a", show_progress=False)
    assert out.steps == 12 and [e["step"] for e in out.evals] == [4, 8, 12]
    best = max((e for e in out.evals if e["phase"] == 2), key=lambda e: e["score"])
    assert out.best_step == best["step"]
    # the model holds the average of the best evaluation, which is what was scored
    assert heldout.evaluate(draft, 2) == {k: best[k] for k in ("tau_full", "tau_smallest",
                                                                "score")}
    plain = _draft(target)  # the same run without the average ends elsewhere
    train_supernet(plain, TrainingSet(samples[:-3], aifd.chosen, heldout),
                   replace(config, ema_decay=0.0), show_progress=False)
    assert any(not torch.equal(a, b) for a, b in zip(draft.state_dict().values(),
                                                     plain.state_dict().values(), strict=True))

    resumed, again = killed_then_resumed(target, samples[:-3], aifd, config, tmp_path / "b",
                                         heldout, kill_at=10)
    assert again.resumed_from == 9  # the checkpoint at step 9 (with the average of step 9)
    assert [{k: v for k, v in e.items() if k != "seconds"} for e in again.evals] == [
        {k: v for k, v in e.items() if k != "seconds"} for e in out.evals]
    for (name, a), (_, b) in zip(draft.state_dict().items(), resumed.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name


def test_an_ema_decay_outside_its_range_is_refused():
    from dreams_nas.supernet.core.errors import InputError

    with pytest.raises(InputError, match="ema_decay=1.0"):
        TrainConfig(ema_decay=1.0)
    assert TrainConfig().to_dict()["ema_decay"] == 0.0  # every field, whatever its value
    assert TrainConfig(ema_decay=0.99).to_dict()["ema_decay"] == 0.99
