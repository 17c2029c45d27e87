"""Two-phase progressive training (TPPT) of the DREAM-S supernet.

Phase 1 (warm-up) trains the full draft (all heads, all visual tokens) with a random inject
layer per step, so every candidate layer's memory adapter is trained. Before phase 2 the heads
of every attention are sorted by importance (`importance.sort_heads`: |grad x weight| on
calibration batches) and the weights (and AdamW moments) reordered, so each smaller subnet is a
prefix. Phase 2 (multi-resolution) applies the sandwich rule: each step sums the gradients of
the largest subnet, the smallest and `random_subnets` random ones (once-for-all style).

Determinism and resume: the learning rate is a pure function of the step, and every random
choice of step `s` (batch order, subnets, feature noise: `schedule`) comes from generators
seeded with (seed, s), so a run restored from a checkpoint continues exactly like an
uninterrupted one. Checkpoints are safetensors (weights, AdamW state) + JSON (step, loss
curve, float16's loss scale), written atomically.

Data parallel (several ranks, `supernet.core.dist`): each rank holds the draft (the target's
features come from the shared feature store, so the target is not replicated here), takes every
size-th row of the step's global batch, runs the step's subnets forward and backward on it and
then averages the summed gradients over the ranks in one bucketed all-reduce per step
(`World.average`, as Horovod's DistributedOptimizer does for Once-for-All; PyTorch's
DistributedDataParallel rejects several subnets' backward passes per step with parameters
unused in some: "Encountered gradient which is undefined, but still allreduced by DDP
reducer"). Every loss term is normalised by the global batch's counted positions
(`batching.GlobalBatch`) and each row's feature noise has its own seed (`noise_seed`), so the
averaged gradients are the global batch's: the weights follow one process's with the same
batch (to float rounding) under any number of ranks, and a checkpoint resumes under another.
The subnets of a step are a function of (seed, step), the same on every rank; rank 0 evaluates
the held-out prompts (every rank decides on its figures) and writes the checkpoints.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from dreams_nas.supernet.core.dist import World, current
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.progress import progress
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.training.batching import (
    DraftBatch,
    GlobalBatch,
    LossSetup,
    LossWeights,
    Teacher,
    collate,
    counted_positions,
    loss_terms,
)
from dreams_nas.supernet.training.checkpoint import (
    TrainState,
    fingerprint_of,
    load_best,
    load_checkpoint,
    save_best,
    save_checkpoint,
    weights_of,
)
from dreams_nas.supernet.training.config import TrainConfig
from dreams_nas.supernet.training.convergence import HeldOut
from dreams_nas.supernet.training.ema import WeightAverage
from dreams_nas.supernet.training.features import TargetSample
from dreams_nas.supernet.training.importance import sort_heads
from dreams_nas.supernet.training.precision import MixedPrecision
from dreams_nas.supernet.training.schedule import (
    batch_indices,
    noise_seed,
    step_specs,
    training_space,
)


@dataclass(frozen=True)
class TrainingSet:
    """What a supernet trains on.

    samples:        the training prompts' target features (a list, or a `FeatureStore`).
    distill_layers: the target layers whose features supervise the draft's cross block.
    heldout:        prompts kept out of training; with them the run evaluates held-out tau every
                    `TrainConfig.eval_every` steps, stops phase 2 at a plateau (`convergence`)
                    or at the time budget, and keeps its best phase-2 evaluation's weights.
                    None: it runs every step and keeps the last weights.
    """

    samples: Sequence[TargetSample]
    distill_layers: Sequence[int]
    heldout: HeldOut | None = None


@dataclass(frozen=True)
class TrainOutcome:
    loss_curve: list[dict[str, float]]
    head_orders: list[list[int]] | None
    resumed_from: int
    steps_run: int
    evals: list[dict[str, Any]] = field(default_factory=list)  # held-out tau per evaluation
    best_step: int | None = None  # the step whose weights the model holds (None: the last)
    stopped: str | None = None  # "plateau" | "time budget" | None (the step cap)
    steps: int = 0  # optimizer steps taken in all (resumed ones included)

    @property
    def best(self) -> dict[str, Any] | None:
        """The held-out evaluation of `best_step` (None: no evaluation kept)."""
        return next((e for e in self.evals if e["step"] == self.best_step), None)


def make_optimizer(model: DreamDraft, config: TrainConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                             weight_decay=config.weight_decay)



def _calibration(model: DreamDraft, samples: Sequence[TargetSample], config: TrainConfig,
                 device: torch.device) -> list[DraftBatch]:
    return [collate([samples[i] for i in batch_indices(len(samples), config.batch_size,
                                                        config.seed, j)],
                    model.config.visual_in_self).to(device)
            for j in range(config.calibration_batches)]


def _step_losses(model: DreamDraft, batch: DraftBatch, specs: Sequence[SubnetSpec],
                 setup: LossSetup, config: TrainConfig, amp: MixedPrecision,
                 step: int, rows: Sequence[int], phase: int, world: World) -> dict[str, float]:
    """Forward and backward of every subnet of one step (gradients summed, mean loss).

    rows: the samples of `batch` (this rank's slice of the step's global batch); with several
    ranks every term is normalised by the global batch's counted positions and the gradients
    are then averaged over the ranks (`World.average`), so they, and the losses returned, are
    the global batch's."""
    sums = {"loss": 0.0, "kl": 0.0, "distill": 0.0, "feat": 0.0}
    teacher: list[torch.Tensor] | None = None
    inplace = config.inplace_distill if phase == 2 else 0.0
    whole = (GlobalBatch(world.sum(counted_positions(batch, setup.unroll)), world.size)
             if world.distributed else None)
    for i, spec in enumerate(specs):
        seeds = [noise_seed(config.seed, step, i, r) for r in rows]
        with amp.autocast():
            terms = loss_terms(model, batch, spec, setup, noise_seeds=seeds,
                               teacher=(Teacher(teacher, inplace)
                                        if i and teacher is not None else None),
                               keep_logp=inplace > 0 and i == 0, global_batch=whole)
        if i == 0 and inplace > 0:
            teacher = terms.pop("logp")  # the largest subnet's, detached
        amp.scaler.scale(terms["loss"] / len(specs)).backward()
        for key in sums:
            sums[key] += float(terms[key].detach()) / len(specs)
    if world.distributed:
        world.average([p for p in model.parameters() if p.requires_grad])
        totals = world.sum([sums[key] for key in sums])  # the mean of the slices' terms
        sums = {key: value / world.size for key, value in zip(sums, totals, strict=True)}
    return sums


class _Training:
    """One `train_supernet` call: the model, its data, optimiser, checkpoint and state."""

    def __init__(self, model: DreamDraft, data: TrainingSet, config: TrainConfig,
                 checkpoint_dir: str | Path | None, compute_dtype: torch.dtype | None) -> None:
        self.model, self.data, self.config = model, data, config
        self.world = current()
        self.device = next(model.parameters()).device
        self.space = training_space(model)
        self.setup = LossSetup(data.distill_layers, config.weights, config.unroll_depth,
                               config.feature_noise)
        self.optimizer = make_optimizer(model, config)
        self.fingerprint = fingerprint_of(model, data.samples, data.distill_layers,
                                          config.to_dict(), compute_dtype)
        self.amp = MixedPrecision(self.device, compute_dtype)
        self.ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.state = ((load_checkpoint(self.ckpt, model, self.optimizer, self.fingerprint)
                       if self.ckpt else None) or TrainState())
        if self.state.scaler:  # float16: the loss scale goes on from where the run stood
            self.amp.scaler.load_state_dict(self.state.scaler)
        self.average = (WeightAverage(model, config.ema_decay, self.state.ema)
                        if config.ema_decay and self.state.ema is not None else None)
        self.best = (load_best(self.ckpt, self.device)
                     if self.state.tracker.best_step is not None else None)
        self.orders: list[list[int]] | None = None

    def step(self) -> tuple[dict[str, float], int]:
        """One optimiser step (phase 2's first sorts the heads first): its losses and phase."""
        model, config, state, samples = self.model, self.config, self.state, self.data.samples
        step = state.step
        phase = 1 if step < config.warmup_steps else 2
        if phase == 2 and not state.heads_sorted:
            if config.sort_heads:
                self.orders = sort_heads(model, _calibration(model, samples, config, self.device),
                                         self.data.distill_layers, config, self.optimizer,
                                         self.amp)
            state.heads_sorted = True
        if phase == 2 and config.ema_decay and self.average is None:
            self.average = WeightAverage(model, config.ema_decay)  # from the sorted weights
        rows = self.world.mine(batch_indices(len(samples), config.batch_size, config.seed, step))
        batch = collate([samples[i] for i in rows], model.config.visual_in_self).to(self.device)
        self.optimizer.zero_grad(set_to_none=True)
        # every rank draws the same subnets: they are a function of (seed, step) alone
        sums = _step_losses(model, batch, step_specs(model, self.space, step, config),
                            self.setup, config, self.amp, step, rows, phase, self.world)
        self.amp.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        for group in self.optimizer.param_groups:
            group["lr"] = config.lr_at(step)
        self.amp.scaler.step(self.optimizer)
        self.amp.scaler.update()
        if self.average is not None:
            self.average.update()
        state.step += 1
        state.loss_curve.append({"step": state.step, **{k: round(v, 6) for k, v in sums.items()},
                                 "phase": phase})
        return sums, phase

    def evaluate(self, phase: int, over: bool) -> bool:
        """Score the held-out prompts when this step is due (rank 0 scores, every rank decides
        on its figures); keep the best weights, stop at a plateau. Whether it evaluated."""
        config, state, tracker, heldout = (self.config, self.state, self.state.tracker,
                                           self.data.heldout)
        if heldout is None or not (state.step % config.eval_every == 0 or over or state.step
                                   in (config.warmup_steps, config.total_steps)):
            return False
        world = self.world
        with self.average.applied() if self.average is not None else nullcontext():
            values = world.broadcast(heldout.evaluate(self.model, phase) if world.is_main
                                     else None)
            if tracker.record(state.step, phase, values, config.tolerance):
                self.best = weights_of(self.model)  # the average's, where there is one
                if world.is_main:
                    save_best(self.ckpt, self.best)
        if phase == 2 and tracker.stale >= config.patience:
            tracker.stopped = "plateau"
        self.model.train()
        return True

    def checkpoint(self, evaluated: bool) -> None:
        """Save the checkpoint (rank 0) after an evaluation, a stop, the last step, or every
        `checkpoint_every` steps."""
        state, config = self.state, self.config
        if self.ckpt is not None and self.world.is_main and (
                evaluated or state.tracker.stopped or state.step == config.total_steps
                or state.step % config.checkpoint_every == 0):
            state.ema = self.average.state() if self.average is not None else None
            state.scaler = self.amp.scaler.state_dict()  # {} unless float16 scales the loss
            save_checkpoint(self.ckpt, self.model, self.optimizer, state, self.fingerprint)

    def finish(self) -> None:
        """Leave the model with the best evaluation's weights (or the average's), in eval mode."""
        tracker = self.state.tracker
        if self.best is not None and (tracker.best_step != self.state.step
                                      or self.average is not None):
            self.model.load_state_dict(self.best)
        elif self.average is not None:  # no held-out prompts: the average at the last step
            self.average.copy_to(self.model)
        self.model.eval()


def train_supernet(model: DreamDraft, data: TrainingSet, config: TrainConfig,
                   checkpoint_dir: str | Path | None = None, *,
                   on_step: Callable[[int, dict[str, float]], None] | None = None,
                   show_progress: bool | None = None,
                   compute_dtype: torch.dtype | None = None) -> TrainOutcome:
    """Train `model` in place on `data`; resumes from `checkpoint_dir` when it holds a
    checkpoint.

    compute_dtype: the dtype the forward passes run in under autocast (the run's dtype, that
    of the target the draft is deployed with); the weights and optimiser state stay float32
    (master weights), and float16 scales the loss against gradient underflow. None or
    float32: plain float32.

    on_step(step, losses) is called after each optimizer step (tests use it to stop a run
    half-way, as a kill would).
    """
    world = current()
    _check(data, config, world)
    # The target's embedding and LM head are shared and frozen: no gradients accumulate on them.
    for module in (model.shared.embed_tokens, model.shared.lm_head):
        for param in module.parameters():
            param.requires_grad_(False)
    run = _Training(model, data, config, checkpoint_dir, compute_dtype)
    state, tracker = run.state, run.state.tracker
    resumed_from, steps_run = state.step, 0
    bar = progress(total=config.total_steps, desc="train supernet", unit="step",
                   disable=show_progress is False or None or not world.is_main)
    bar.update(state.step)
    model.train()
    clock, spent = time.perf_counter(), tracker.seconds
    while state.step < config.total_steps and tracker.stopped is None:
        sums, phase = run.step()
        steps_run += 1
        tracker.seconds = spent + time.perf_counter() - clock
        over = world.any(config.max_seconds is not None and tracker.seconds >= config.max_seconds)
        evaluated = run.evaluate(phase, over)
        if over:
            tracker.stopped = "time budget"
        bar.update(1)
        last = tracker.evals[-1] if tracker.evals else {}
        bar.set_postfix(loss=f"{sums['loss']:.4f}", kl=f"{sums['kl']:.3f}",
                        tau=last.get("score", last.get("tau_full", "-")))
        run.checkpoint(evaluated)
        if on_step is not None:
            on_step(state.step, sums)
    bar.close()
    run.finish()
    return TrainOutcome(loss_curve=state.loss_curve, head_orders=run.orders,
                        resumed_from=resumed_from, steps_run=steps_run,
                        evals=list(tracker.evals), best_step=tracker.best_step,
                        stopped=tracker.stopped, steps=state.step)


def _check(data: TrainingSet, config: TrainConfig, world: World) -> None:
    if not data.samples:
        raise InputError("no training samples; give a dataset with at least one prompt")
    if config.batch_size < world.size:
        raise InputError(f"--batch-size {config.batch_size} is below the {world.size} ranks "
                         "training data parallel; give each rank at least one sample a step "
                         f"(--batch-size {world.size} or more)")


@torch.no_grad()
def evaluate_losses(model: DreamDraft, batches: Sequence[DraftBatch], spec: SubnetSpec,
                    distill_layers: Sequence[int], weights: LossWeights | None = None
                    ) -> dict[str, float]:
    """Mean loss terms of one subnet over `batches` (no noise, eval mode)."""
    setup = LossSetup(distill_layers, weights or LossWeights())
    was_training = model.training
    model.eval()
    sums = {"loss": 0.0, "kl": 0.0, "distill": 0.0, "feat": 0.0}
    for batch in batches:
        terms = loss_terms(model, batch, spec, setup)
        for key in sums:
            sums[key] += float(terms[key]) / len(batches)
    model.train(was_training)
    return sums
