from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from _support.models import tiny_prompts
from _support.training import LAYERS, killed_then_resumed, tiny_supernet, tiny_target_data
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.state import SharedTargetModules
from dreams_nas.supernet.training.batching import collate
from dreams_nas.supernet.training.config import TrainConfig
from dreams_nas.supernet.training.features import TargetSample
from dreams_nas.supernet.training.schedule import step_specs, training_space
from dreams_nas.supernet.training.tppt import TrainingSet, evaluate_losses, train_supernet

pytestmark = pytest.mark.usefixtures("one_thread")




@pytest.fixture(scope="module")
def target_data():
    return tiny_target_data()


def _draft(target, seed=0) -> DreamDraft:
    return tiny_supernet(target, seed)


def test_self_distillation_data_are_the_targets_greedy_answers(target_data):
    target, samples, aifd = target_data
    s: TargetSample = samples[0]
    prompt = tiny_prompts(1)[0]
    ref = target.generate(**prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
    answer = s.input_ids[s.prompt_len:]
    assert torch.equal(ref[0, prompt["input_ids"].shape[1]:][: answer.numel()], answer)
    assert s.visual_mask.sum() == 16 and s.visual_scores[~s.visual_mask].abs().sum() == 0
    assert (s.visual_scores[s.visual_mask] > 0).all()
    mask = torch.ones(1, s.input_ids.numel(), dtype=torch.long)
    logits = target(**{**prompt, "input_ids": s.input_ids[None], "attention_mask": mask}).logits
    torch.testing.assert_close(target.lm_head(s.last_hidden), logits[0], atol=1e-4, rtol=1e-4)
    assert len(aifd.ae) == 4 and aifd.chosen[0] in (2, 3)


def test_training_lowers_every_loss_term(target_data):
    target, samples, aifd = target_data
    draft = _draft(target)
    batches = [collate(samples[i:i + 4]) for i in range(0, 12, 4)]
    spec = SubnetSpec(4, 1.0, 2, 1)
    before = evaluate_losses(draft, batches, spec, aifd.chosen)
    config = TrainConfig(unroll=2, warmup_steps=25, multires_steps=15, batch_size=4, lr=3e-3,
                         lr_warmup_steps=3, checkpoint_every=100)
    out = train_supernet(draft, TrainingSet(samples, aifd.chosen), config, show_progress=False)
    after = evaluate_losses(draft, batches, spec, aifd.chosen)
    for key in ("kl", "distill", "feat", "loss"):
        assert after[key] < 0.8 * before[key], (key, before, after)
    assert len(out.loss_curve) == 40 and out.head_orders is not None
    small = evaluate_losses(draft, batches, SubnetSpec(1, 0.25, 1, 1), aifd.chosen)
    assert small["kl"] < before["kl"]


def test_resume_after_kill_equals_uninterrupted(target_data, tmp_path):
    target, samples, aifd = target_data
    config = TrainConfig(unroll=2, warmup_steps=5, multires_steps=5, batch_size=4,
                         lr_warmup_steps=2, checkpoint_every=3)
    reference = _draft(target)
    ref_out = train_supernet(reference, TrainingSet(samples, aifd.chosen), config, tmp_path / "a",
                             show_progress=False)

    class Killed(Exception):
        pass

    def kill_at_7(step, _losses):
        if step == 7:  # checkpoints at 3 and 6: the resumed run redoes step 7
            raise Killed

    with pytest.raises(Killed):
        train_supernet(_draft(target), TrainingSet(samples, aifd.chosen), config, tmp_path / "b",
                       on_step=kill_at_7, show_progress=False)
    resumed = _draft(target, seed=123)  # whatever the init: the checkpoint overrides it
    out = train_supernet(resumed, TrainingSet(samples, aifd.chosen), config, tmp_path / "b",
                         show_progress=False)
    assert out.resumed_from == 6 and out.steps_run == 4
    assert out.loss_curve == ref_out.loss_curve
    for (name, a), (_, b) in zip(reference.state_dict().items(), resumed.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name
    again = train_supernet(resumed, TrainingSet(samples, aifd.chosen), config, tmp_path / "b",
                           show_progress=False)
    assert again.steps_run == 0
    other = TrainConfig(warmup_steps=5, multires_steps=6, batch_size=4, checkpoint_every=3)
    with pytest.raises(InputError, match="belongs to another training set-up"):
        train_supernet(_draft(target), TrainingSet(samples, aifd.chosen), other, tmp_path / "b",
                       show_progress=False)


def test_sandwich_rule_and_warmup_specs(target_data):
    draft = _draft(target_data[0])
    space = training_space(draft)
    config = TrainConfig(warmup_steps=2, multires_steps=2, random_subnets=2)
    warm = step_specs(draft, space, 0, config)
    assert len(warm) == 1 and warm[0].heads == 4 and warm[0].visual_keep == 1.0
    multi = step_specs(draft, space, 2, config)
    assert len(multi) == 4
    assert (multi[0].heads, multi[0].visual_keep) == (4, 1.0)
    assert (multi[1].heads, multi[1].visual_keep) == (1, 0.25)
    layers = {s.inject_layer for step in range(40) for s in step_specs(draft, space, step, config)}
    assert layers == set(LAYERS)
    with pytest.raises(InputError, match="train for at least one step"):
        TrainConfig(warmup_steps=0, multires_steps=0)


def test_the_targets_embedding_and_head_stay_frozen(target_data):
    target, samples, aifd = target_data
    target.lm_head.weight.requires_grad_(True)
    before = target.lm_head.weight.detach().clone()
    draft = _draft(target)
    train_supernet(draft, TrainingSet(samples, aifd.chosen),
                   TrainConfig(warmup_steps=2, multires_steps=0, batch_size=4),
                   show_progress=False)
    assert target.lm_head.weight.grad is None and not target.lm_head.weight.requires_grad
    assert torch.equal(target.lm_head.weight, before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_training_keeps_float32_master_weights(target_data, dtype):
    from dreams_nas.supernet.training.precision import MixedPrecision

    target, samples, aifd = target_data
    draft = _draft(target)
    config = TrainConfig(unroll=2, warmup_steps=8, multires_steps=4, batch_size=4, lr=3e-3,
                         lr_warmup_steps=2, checkpoint_every=100)
    batches = [collate(samples[i:i + 4]) for i in range(0, 12, 4)]
    spec = SubnetSpec(4, 1.0, 2, 1)
    before = evaluate_losses(draft, batches, spec, aifd.chosen)
    seen: set[torch.dtype | None] = set()  # the autocast dtype each forward of the draft ran in
    # the draft's forward runs its layers as functions of their weights (no module calls)
    hook = draft.register_forward_pre_hook(lambda module, args: seen.add(
        torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None))
    out = train_supernet(draft, TrainingSet(samples, aifd.chosen), config, show_progress=False,
                         compute_dtype=dtype)
    hook.remove()
    assert seen == {dtype}  # every forward ran in the 16-bit dtype ...
    assert {p.dtype for p in draft.parameters()} == {torch.float32}  # ... on fp32 weights
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in out.loss_curve)
    assert evaluate_losses(draft, batches, spec, aifd.chosen)["kl"] < before["kl"]
    amp = MixedPrecision(torch.device("cpu"), dtype)
    assert amp.scaler.is_enabled() == (dtype == torch.float16)  # bf16 needs no loss scaling


def _heldout(samples):
    from dreams_nas.supernet.training.convergence import HeldOut

    return HeldOut(samples[-3:], draft_len=3, max_new_tokens=8)


def test_training_stops_at_a_plateau_and_keeps_the_best_evaluation(target_data, tmp_path):
    """Phase 2 stops after `patience` evaluations without a gain above the tolerance, and the
    model holds the weights of its best phase-2 evaluation (not the last); a run killed
    half-way resumes to the same evaluations, stop and weights."""
    target, samples, aifd = target_data
    heldout = _heldout(samples)
    # a tolerance no gain can beat: the run stops at the third phase-2 evaluation
    config = TrainConfig(unroll=2, warmup_steps=6, multires_steps=200, batch_size=4, lr=5e-3,
                         lr_warmup_steps=2, eval_every=3, patience=2, tolerance=100.0,
                         checkpoint_every=4)
    draft = _draft(target)
    out = train_supernet(draft, TrainingSet(samples[:-3], aifd.chosen, heldout), config,
                         tmp_path / "a", show_progress=False)
    assert out.stopped == "plateau" and out.steps == 15 and len(out.loss_curve) == 15
    assert [(e["step"], e["phase"]) for e in out.evals] == [(3, 1), (6, 1), (9, 2), (12, 2),
                                                            (15, 2)]
    assert "tau_smallest" not in out.evals[0] and "score" in out.evals[-1]
    phase2 = [e for e in out.evals if e["phase"] == 2]
    best = max(phase2, key=lambda e: e["score"])  # the first of equal scores
    assert out.best_step == best["step"]
    assert heldout.evaluate(draft, 2) == {k: best[k] for k in ("tau_full", "tau_smallest",
                                                                "score")}

    resumed, again = killed_then_resumed(target, samples[:-3], aifd, config, tmp_path / "b",
                                         heldout, kill_at=11)
    assert again.resumed_from == 9  # the checkpoint of the evaluation at step 9
    assert [{k: v for k, v in e.items() if k != "seconds"} for e in again.evals] == [
        {k: v for k, v in e.items() if k != "seconds"} for e in out.evals]
    assert again.stopped == "plateau" and again.best_step == out.best_step
    for (name, a), (_, b) in zip(draft.state_dict().items(), resumed.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name


def test_a_time_budget_stops_the_run_with_an_evaluation(target_data):
    target, samples, aifd = target_data
    config = TrainConfig(unroll=1, warmup_steps=0, multires_steps=50, batch_size=4,
                         max_seconds=1e-6)
    out = train_supernet(_draft(target), TrainingSet(samples[:-3], aifd.chosen, _heldout(samples)),
                         config, show_progress=False)
    assert out.stopped == "time budget" and out.steps == 1
    assert [e["step"] for e in out.evals] == [1] and out.best_step == 1


def test_in_place_distillation_mixes_the_largest_subnets_distribution(target_data):
    from dreams_nas.supernet.training.batching import LossSetup, Teacher, loss_terms

    target, samples, aifd = target_data
    draft = _draft(target, seed=3)
    batch = collate(samples[:4])
    setup = LossSetup(aifd.chosen, unroll=2)
    spec = SubnetSpec(2, 0.5, 2, 1)
    with torch.no_grad():
        own = loss_terms(draft, batch, spec, setup, keep_logp=True)
        assert len(own["logp"]) == 3
        # taught by its own distribution, the in-place term is zero
        same = loss_terms(draft, batch, spec, setup, teacher=Teacher(own["logp"], 1.0))
        assert float(same["kl"]) == pytest.approx(0.0, abs=1e-6)
        half = loss_terms(draft, batch, spec, setup, teacher=Teacher(own["logp"], 0.5))
        assert float(half["kl"]) == pytest.approx(0.5 * float(own["kl"]), rel=1e-5)
        largest = loss_terms(draft, batch, SubnetSpec(4, 1.0, 2, 1), setup,
                             keep_logp=True)["logp"]
        taught = loss_terms(draft, batch, spec, setup, teacher=Teacher(largest, 1.0))
        assert float(taught["kl"]) > 0
    with pytest.raises(InputError, match="inplace_distill"):
        TrainConfig(inplace_distill=1.5)


def test_the_sandwich_rule_spans_depth_and_width_and_sorting_keeps_the_function(target_data):
    from dreams_nas.supernet.training.batching import LossSetup, loss_terms
    from dreams_nas.supernet.training.importance import sort_heads

    target, samples, aifd = target_data
    shared = SharedTargetModules(target.get_input_embeddings(), target.lm_head)
    cfg = DraftConfig.for_target(target.config.text_config, LAYERS, num_layers=2,
                                 mlp_shares=(0.5, 1.0))
    draft = DreamDraft.initialised(cfg, shared, 0)
    space = training_space(draft)
    assert (space.depth, space.mlp) == ((1, 2), (0.5, 1.0))
    config = TrainConfig(warmup_steps=1, multires_steps=2, random_subnets=6)
    warm = step_specs(draft, space, 0, config)  # phase 1: the deepest and its one-layer form
    assert [(s.depth, s.mlp, s.heads, s.visual_keep) for s in warm] == [(2, 1.0, 4, 1.0),
                                                                       (1, 1.0, 4, 1.0)]
    assert warm[0].inject_layer == warm[1].inject_layer
    deepest = step_specs(draft, space, 0, replace(config, phase1_shallowest=False))
    assert [s.depth for s in deepest] == [2]
    multi = step_specs(draft, space, 1, config)  # phase 2: the sandwich, then the one layer
    assert (multi[0].depth, multi[0].mlp) == (2, 1.0)
    assert (multi[1].depth, multi[1].mlp) == (1, 0.5)
    assert len(multi) == 2 + config.random_subnets + 1
    assert multi[-1] == multi[0].replace(depth=1)
    sandwich = step_specs(draft, space, 1, replace(config, phase2_shallowest=False))
    assert sandwich == multi[:-1]
    seen = {(s.depth, s.mlp) for step in range(1, 30) for s in step_specs(draft, space, step,
                                                                            config)}
    assert seen == {(1, 0.5), (1, 1.0), (2, 0.5), (2, 1.0)}
    batch = collate(samples[:4], cfg.visual_in_self)
    full, half = draft.config.largest(), SubnetSpec(4, 1.0, 4, 1, depth=2, mlp=0.5)
    with torch.no_grad():
        before = loss_terms(draft, batch, full, LossSetup(aifd.chosen))["loss"]
        half_before = loss_terms(draft, batch, half, LossSetup(aifd.chosen))["loss"]
    sort_heads(draft, [batch], aifd.chosen, config)
    with torch.no_grad():
        after = loss_terms(draft, batch, full, LossSetup(aifd.chosen))["loss"]
        half_after = loss_terms(draft, batch, half, LossSetup(aifd.chosen))["loss"]
    torch.testing.assert_close(after, before)  # the full subnet's function is unchanged
    assert not torch.allclose(half_after, half_before)  # the half MLP now keeps other channels


@pytest.mark.parametrize("name", ["phase1_shallowest", "phase2_shallowest"])
def test_shallow_anchors_are_in_the_fingerprint_only_with_elastic_depth(name: str) -> None:
    """A single-size run's checkpoints keep the fingerprint they had before the settings; an
    elastic-depth run trained without the one-layer anchor does not resume as one with it."""
    from _support.drafts import tiny_draft
    from dreams_nas.supernet.training.checkpoint import fingerprint_of

    def fingerprint(draft: DreamDraft, config: TrainConfig) -> str:
        return fingerprint_of(draft, [], [1], config.to_dict())

    both, deepest = TrainConfig(), TrainConfig(**{name: False})
    single, elastic = tiny_draft(), tiny_draft(num_layers=2)
    assert fingerprint(single, both) == fingerprint(single, deepest)
    assert fingerprint(elastic, both) != fingerprint(elastic, deepest)
