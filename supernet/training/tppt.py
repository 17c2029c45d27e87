"""Two-phase progressive training (TPPT) of the DREAM-S supernet.

Phase 1 (warm-up) trains the full draft (all heads, all visual tokens) with a random inject
layer per step, so every candidate layer's memory adapter is trained. Before phase 2 the heads
of every attention are sorted by importance (|grad x weight| on calibration batches) and the
weights (and AdamW moments) reordered, so each smaller subnet is a prefix. Phase 2
(multi-resolution) applies the sandwich rule: each step sums the gradients of the largest
subnet, the smallest and `random_subnets` random ones (once-for-all style).

Determinism and resume: the learning rate is a pure function of the step, and every random
choice of step `s` (batch order, subnets, feature noise) comes from generators seeded with
(seed, s), so a run restored from a checkpoint continues exactly like an uninterrupted one.
Checkpoints are safetensors (weights, AdamW state) + JSON (step, loss curve), written
atomically.

Data parallel (several ranks, `supernet.core.dist`): each rank holds the draft (the target's
features come from the shared feature store, so the target is not replicated here), takes every
size-th row of the step's global batch, runs the step's subnets forward and backward on it and
then averages the summed gradients over the ranks in one bucketed all-reduce per step
(`World.average`, as Horovod's DistributedOptimizer does for Once-for-All; PyTorch's
DistributedDataParallel rejects several subnets' backward passes per step with parameters
unused in some: "Encountered gradient which is undefined, but still allreduced by DDP
reducer"). Every loss term is normalised by the global batch's counted positions
(`batching.loss_terms`' `counts`) and each row's feature noise has its own seed
(`noise_seed`), so the averaged gradients are the global batch's: the weights follow one
process's with the same batch (to float rounding) under any number of ranks, and a checkpoint
resumes under another. The subnets of a step are a function of (seed, step), the
same on every rank; rank 0 evaluates the held-out prompts (every rank decides on its figures)
and writes the checkpoints.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from dreams_nas.supernet.core.dist import World, current
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.progress import progress
from dreams_nas.supernet.core.space import SearchSpace, SubnetSpec
from dreams_nas.supernet.draft.elastic import importance_order
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.training.batching import (
    DraftBatch,
    LossWeights,
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
from dreams_nas.supernet.training.convergence import HeldOut
from dreams_nas.supernet.training.ema import WeightAverage
from dreams_nas.supernet.training.features import TargetSample

# EAGLE-3's training-time test: 7 drafting steps, the deepest draft of the default space
DEFAULT_UNROLL = 6


@dataclass(frozen=True)
class TrainConfig:
    warmup_steps: int = 300  # phase 1: the full draft
    multires_steps: int = 400  # phase 2: sandwich rule (at most: it stops at a plateau)
    batch_size: int = 8
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    lr_warmup_steps: int = 20
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    random_subnets: int = 1
    weights: LossWeights = field(default_factory=LossWeights)
    feature_noise: float = 0.1
    # drafting steps 2.. trained on the draft's own features (training-time test); None: up to
    # the deepest draft of the space (`train_run`), DEFAULT_UNROLL without one
    unroll: int | None = None
    calibration_batches: int = 4
    sort_heads: bool = True  # False: heads keep their natural order (the ablation)
    checkpoint_every: int = 25
    seed: int = 0
    # phase 2: the sampled subnets also learn the largest subnet's distribution (in-place
    # distillation, BigNAS/OFA) with this weight against the target's; 0: the target's only
    inplace_distill: float = 0.5
    # convergence (with held-out prompts): evaluate every `eval_every` steps; phase 2 stops
    # after `patience` evaluations without a gain of more than `tolerance` in held-out tau
    eval_every: int = 50
    patience: int = 3
    tolerance: float = 0.02
    max_seconds: float | None = None  # optimisation time budget (None: the step cap only)
    # phase 2's weights are averaged (EMA, `ema`) with this decay; held-out tau is scored on
    # the average and the run keeps it. 0: the weights as they stand (no average)
    ema_decay: float = 0.0
    # phase 1 of an elastic-depth supernet: each step trains the one-layer draft (all heads
    # and visual tokens, the whole MLP) beside the deepest, so the shallow path a search may
    # pick is trained from the first step (the sandwich rule over depth); False: the deepest
    # only. Without elastic depth it changes nothing (and is not in the checkpoint fingerprint)
    phase1_shallowest: bool = True
    # phase 2 of an elastic-depth supernet: the sandwich (largest, smallest, random) gains the
    # one-layer draft with all heads, visual tokens and the whole MLP at the step's layer, the
    # subnet a search on a fixed-overhead device picks most; False: the sandwich alone. Like
    # `phase1_shallowest`, out of the fingerprint without elastic depth
    phase2_shallowest: bool = True

    def __post_init__(self) -> None:
        for name in ("warmup_steps", "multires_steps", "random_subnets", "lr_warmup_steps",
                     "unroll", "patience", "tolerance"):
            if (getattr(self, name) or 0) < 0:
                raise InputError(f"{name}={getattr(self, name)} must be >= 0")
        if self.warmup_steps + self.multires_steps < 1:
            raise InputError("warmup_steps + multires_steps is 0; train for at least one step")
        if self.batch_size < 1 or self.checkpoint_every < 1 or self.eval_every < 1:
            raise InputError("batch_size, checkpoint_every and eval_every must be at least 1")
        if not 0.0 <= self.inplace_distill <= 1.0:
            raise InputError(f"inplace_distill={self.inplace_distill} must be within [0, 1]")
        if not 0.0 <= self.ema_decay < 1.0:
            raise InputError(f"ema_decay={self.ema_decay} must be within [0, 1) (0: no average)")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise InputError(f"max_seconds={self.max_seconds} must be above 0 (or None)")

    @property
    def unroll_depth(self) -> int:
        """The unrolled drafting passes each step trains (after the teacher-forced one)."""
        return DEFAULT_UNROLL if self.unroll is None else int(self.unroll)

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.multires_steps

    def lr_at(self, step: int) -> float:
        """Linear warm-up then cosine decay to min_lr_ratio * lr over all steps."""
        if step < self.lr_warmup_steps:
            return self.lr * (step + 1) / self.lr_warmup_steps
        span = max(1, self.total_steps - self.lr_warmup_steps)
        progress_ = min(1.0, (step - self.lr_warmup_steps) / span)
        cos = 0.5 * (1 + math.cos(math.pi * progress_))
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * cos)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.ema_decay:  # runs without an average keep their checkpoints' fingerprint
            data.pop("ema_decay")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if isinstance(known.get("weights"), dict):
            known["weights"] = LossWeights(**known["weights"])
        return cls(**known)


def _step_generator(seed: int, step: int, salt: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + step) * 7 + salt)


def batch_indices(num_samples: int, batch_size: int, seed: int, step: int) -> list[int]:
    """Sample indices of step `step`: epochs are seeded permutations, the tail is dropped."""
    per_epoch = max(1, num_samples // batch_size)
    epoch, offset = divmod(step, per_epoch)
    gen = _step_generator(seed, epoch, salt=1)
    perm = torch.randperm(num_samples, generator=gen, device=gen.device)
    size = min(batch_size, num_samples)
    return perm[offset * size: offset * size + size].tolist()


def training_space(model: DreamDraft) -> SearchSpace:
    """The subnets training visits (draft_len is inference-only, fixed to 1 here)."""
    space = model.space()
    return SearchSpace(heads=space.heads, visual_keep=space.visual_keep,
                       inject_layer=space.inject_layer, draft_len=(1,), depth=space.depth,
                       mlp=space.mlp)


def step_specs(model: DreamDraft, space: SearchSpace, step: int, config: TrainConfig
               ) -> list[SubnetSpec]:
    """Phase 1: the full draft at a random layer (with elastic depth and
    `config.phase1_shallowest`, also its one-layer form at that layer). Phase 2: largest,
    smallest, random ones (with elastic depth and `config.phase2_shallowest`, then the
    largest's one-layer form)."""
    gen = _step_generator(config.seed, step, salt=2)
    layers = space.inject_layer

    def layer() -> int:
        return layers[int(torch.randint(len(layers), (1,), generator=gen, device=gen.device))]

    largest = SubnetSpec(max(space.heads), max(space.visual_keep), layer(), 1,
                         depth=max(space.depth), mlp=max(space.mlp))
    if step < config.warmup_steps:
        if config.phase1_shallowest and min(space.depth) < largest.depth:
            return [largest, largest.replace(depth=min(space.depth))]
        return [largest]
    smallest = SubnetSpec(min(space.heads), min(space.visual_keep), layer(), 1,
                          depth=min(space.depth), mlp=min(space.mlp))
    everything = list(space.enumerate())
    picks = torch.randint(len(everything), (config.random_subnets,), generator=gen,
                          device=gen.device).tolist()
    specs = [largest, smallest, *(everything[i] for i in picks)]
    if config.phase2_shallowest and min(space.depth) < largest.depth:
        specs.append(largest.replace(depth=min(space.depth)))
    return specs


class MixedPrecision:
    """Autocast to the compute dtype around the forward, and a gradient scaler that is on only
    for float16 (bfloat16 has float32's exponent range and needs none)."""

    def __init__(self, device: torch.device, dtype: torch.dtype | None) -> None:
        self.device_type = device.type
        self.dtype = dtype if dtype in (torch.float16, torch.bfloat16) else None
        self.scaler = torch.amp.GradScaler(self.device_type,
                                           enabled=self.dtype == torch.float16)

    @contextmanager
    def autocast(self) -> Iterator[None]:
        with warnings.catch_warnings(), torch.autocast(
                self.device_type, dtype=self.dtype or torch.float32,
                enabled=self.dtype is not None):
            # the fp32 RMSNorm weights meet 16-bit activations: torch computes the norm
            # unfused (in the higher precision) and says so once per process; expected here
            warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
            yield


# --- head sorting ---------------------------------------------------------------------
def sort_heads(model: DreamDraft, batches: Sequence[DraftBatch], distill_layers: Sequence[int],
               config: TrainConfig, optimizer: torch.optim.Optimizer | None = None,
               amp: MixedPrecision | None = None) -> list[list[int]]:
    """Accumulate |grad x weight| per head and per MLP channel over `batches` (full draft,
    layers cycled), then reorder every attention's heads and every MLP's channels (and the
    optimizer's moments) by decreasing importance. Returns the head orders.
    `amp`: the forward's autocast (the loss is scaled alike; a common scale keeps the order)."""
    attns = model.attentions()
    mlps = model.mlps()
    totals = [torch.zeros(a.num_heads, device=a.q_proj.weight.device) for a in attns]
    channel_totals = [torch.zeros(m.inner, device=m.gate_proj.weight.device) for m in mlps]
    layers = model.config.inject_layers
    full = model.config.largest()
    for i, batch in enumerate(batches):
        model.zero_grad(set_to_none=True)
        spec = full.replace(inject_layer=layers[i % len(layers)])
        if amp is None:
            loss = loss_terms(model, batch, spec, distill_layers, config.weights)["loss"]
        else:
            with amp.autocast():
                loss = loss_terms(model, batch, spec, distill_layers, config.weights)["loss"]
            loss = amp.scaler.scale(loss)
        loss.backward()
        for total, attn in zip(totals, attns, strict=True):
            total += attn.head_importance()  # on the device: no copy per batch
        for total, mlp in zip(channel_totals, mlps, strict=True):
            total += mlp.channel_importance()
    model.zero_grad(set_to_none=True)
    for total, mlp in zip(channel_totals, mlps, strict=True):
        index = mlp.permute_channels(importance_order(total).to(mlp.gate_proj.weight.device))
        _permute_moments(optimizer, mlp.permuted_params(), index)
    orders = []
    for total, attn in zip(totals, attns, strict=True):
        order = importance_order(total)
        index = attn.permute_heads(order.to(attn.q_proj.weight.device))
        _permute_moments(optimizer, attn.permuted_params(), index)
        orders.append(order.tolist())
    return orders


def _permute_moments(optimizer: torch.optim.Optimizer | None,
                     params: Sequence[tuple[torch.nn.Parameter, int]], index: torch.Tensor
                     ) -> None:
    """Reorder the optimizer's per-parameter moments as their parameters were."""
    if optimizer is None:
        return
    for param, dim in params:
        for value in optimizer.state.get(param, {}).values():
            if torch.is_tensor(value) and value.shape == param.shape:
                value.copy_(value.index_select(dim, index))


# --- the loop -------------------------------------------------------------------------
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


def make_optimizer(model: DreamDraft, config: TrainConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                             weight_decay=config.weight_decay)


def _calibration(model: DreamDraft, samples: Sequence[TargetSample], config: TrainConfig,
                 device: torch.device) -> list[DraftBatch]:
    return [collate([samples[i] for i in batch_indices(len(samples), config.batch_size,
                                                        config.seed, j)],
                    model.config.visual_in_self).to(device)
            for j in range(config.calibration_batches)]


def noise_seed(seed: int, step: int, subnet: int, sample: int) -> int:
    """The seed of one sample's feature noise for one subnet of one step (`row_noise`)."""
    return ((seed * 1_000_003 + step) * 1_000_033 + sample) * 64 + subnet + 11


def _step_losses(model: DreamDraft, batch: DraftBatch, specs: Sequence[SubnetSpec],
                 distill_layers: Sequence[int], config: TrainConfig, amp: MixedPrecision,
                 step: int, rows: Sequence[int], phase: int, world: World) -> dict[str, float]:
    """Forward and backward of every subnet of one step (gradients summed, mean loss).

    rows: the samples of `batch` (this rank's slice of the step's global batch); with several
    ranks every term is normalised by the global batch's counted positions and the gradients
    are then averaged over the ranks (`World.average`), so they, and the losses returned, are
    the global batch's."""
    sums = {"loss": 0.0, "kl": 0.0, "distill": 0.0, "feat": 0.0}
    teacher: list[torch.Tensor] | None = None
    inplace = config.inplace_distill if phase == 2 else 0.0
    counts = (world.sum(counted_positions(batch, config.unroll_depth))
              if world.distributed else None)
    for i, spec in enumerate(specs):
        seeds = [noise_seed(config.seed, step, i, r) for r in rows]
        with amp.autocast():
            terms = loss_terms(model, batch, spec, distill_layers, config.weights,
                               config.feature_noise, seeds, config.unroll_depth,
                               teacher=teacher if i else None, teacher_weight=inplace,
                               keep_logp=inplace > 0 and i == 0, counts=counts,
                               replicas=world.size)
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


def train_supernet(model: DreamDraft, samples: Sequence[TargetSample],
                   distill_layers: Sequence[int], config: TrainConfig,
                   checkpoint_dir: str | Path | None = None,
                   on_step: Callable[[int, dict[str, float]], None] | None = None,
                   show_progress: bool | None = None,
                   compute_dtype: torch.dtype | None = None,
                   heldout: HeldOut | None = None) -> TrainOutcome:
    """Train `model` in place; resumes from `checkpoint_dir` when it holds a checkpoint.

    compute_dtype: the dtype the forward passes run in under autocast (the run's dtype, that
    of the target the draft is deployed with); the weights and optimiser state stay float32
    (master weights), and float16 scales the loss against gradient underflow. None or
    float32: plain float32.

    heldout: prompts kept out of training; with them the run evaluates held-out tau every
    `config.eval_every` steps, stops phase 2 at a plateau (`convergence`) or at the time
    budget, and leaves the model with its best phase-2 evaluation's weights. Without them it
    runs every step and keeps the last weights.

    on_step(step, losses) is called after each optimizer step (tests use it to stop a run
    half-way, as a kill would).
    """
    if not samples:
        raise InputError("no training samples; give a dataset with at least one prompt")
    world = current()
    if config.batch_size < world.size:
        raise InputError(f"--batch-size {config.batch_size} is below the {world.size} ranks "
                         "training data parallel; give each rank at least one sample a step "
                         f"(--batch-size {world.size} or more)")
    device = next(model.parameters()).device
    # The target's embedding and LM head are shared and frozen: no gradients accumulate on them.
    for module in (model.shared.embed_tokens, model.shared.lm_head):
        for param in module.parameters():
            param.requires_grad_(False)
    space = training_space(model)
    optimizer = make_optimizer(model, config)
    fingerprint = fingerprint_of(model, samples, distill_layers, config.to_dict(), compute_dtype)
    amp = MixedPrecision(device, compute_dtype)
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
    state = ((load_checkpoint(ckpt, model, optimizer, fingerprint) if ckpt else None)
             or TrainState())
    average = (WeightAverage(model, config.ema_decay, state.ema)
               if config.ema_decay and state.ema is not None else None)
    tracker = state.tracker
    best = load_best(ckpt, device) if tracker.best_step is not None else None
    resumed_from = state.step
    orders: list[list[int]] | None = None
    bar = progress(total=config.total_steps, desc="train supernet", unit="step",
                   disable=show_progress is False or None or not world.is_main)
    bar.update(state.step)
    model.train()
    steps_run = 0
    clock, spent = time.perf_counter(), tracker.seconds
    while state.step < config.total_steps and tracker.stopped is None:
        step = state.step
        phase = 1 if step < config.warmup_steps else 2
        if phase == 2 and not state.heads_sorted:
            if config.sort_heads:
                orders = sort_heads(model, _calibration(model, samples, config, device),
                                    distill_layers, config, optimizer, amp)
            state.heads_sorted = True
        if phase == 2 and config.ema_decay and average is None:
            average = WeightAverage(model, config.ema_decay)  # from the sorted weights
        rows = world.mine(batch_indices(len(samples), config.batch_size, config.seed, step))
        batch = collate([samples[i] for i in rows], model.config.visual_in_self).to(device)
        optimizer.zero_grad(set_to_none=True)
        # every rank draws the same subnets: they are a function of (seed, step) alone
        sums = _step_losses(model, batch, step_specs(model, space, step, config), distill_layers,
                            config, amp, step, rows, phase, world)
        amp.scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        for group in optimizer.param_groups:
            group["lr"] = config.lr_at(step)
        amp.scaler.step(optimizer)
        amp.scaler.update()
        if average is not None:
            average.update()
        state.step += 1
        steps_run += 1
        state.loss_curve.append({"step": state.step, **{k: round(v, 6) for k, v in sums.items()},
                                 "phase": phase})
        tracker.seconds = spent + time.perf_counter() - clock
        over = world.any(config.max_seconds is not None and tracker.seconds >= config.max_seconds)
        evaluated = False
        if heldout is not None and (state.step % config.eval_every == 0 or over
                                    or state.step in (config.warmup_steps, config.total_steps)):
            evaluated = True
            # rank 0 evaluates (the ranks' weights are equal); all decide on its figures
            with average.applied() if average is not None else nullcontext():
                values = world.broadcast(heldout.evaluate(model, phase) if world.is_main
                                         else None)
                if tracker.record(state.step, phase, values, config.tolerance):
                    best = weights_of(model)  # the average's, where there is one
                    if world.is_main:
                        save_best(ckpt, best)
            if phase == 2 and tracker.stale >= config.patience:
                tracker.stopped = "plateau"
            model.train()
        if over:
            tracker.stopped = "time budget"
        bar.update(1)
        last = tracker.evals[-1] if tracker.evals else {}
        bar.set_postfix(loss=f"{sums['loss']:.4f}", kl=f"{sums['kl']:.3f}",
                        tau=last.get("score", last.get("tau_full", "-")))
        if ckpt is not None and world.is_main and (
                evaluated or tracker.stopped or state.step == config.total_steps
                or state.step % config.checkpoint_every == 0):
            state.ema = average.state() if average is not None else None
            save_checkpoint(ckpt, model, optimizer, state, fingerprint)
        if on_step is not None:
            on_step(state.step, sums)
    bar.close()
    if best is not None and (tracker.best_step != state.step or average is not None):
        model.load_state_dict(best)
    elif average is not None:  # no held-out prompts: the average at the last step
        average.copy_to(model)
    model.eval()
    return TrainOutcome(loss_curve=state.loss_curve, head_orders=orders,
                        resumed_from=resumed_from, steps_run=steps_run,
                        evals=list(tracker.evals), best_step=tracker.best_step,
                        stopped=tracker.stopped, steps=state.step)


@torch.no_grad()
def evaluate_losses(model: DreamDraft, batches: Sequence[DraftBatch], spec: SubnetSpec,
                    distill_layers: Sequence[int], weights: LossWeights | None = None
                    ) -> dict[str, float]:
    """Mean loss terms of one subnet over `batches` (no noise, eval mode)."""
    weights = weights or LossWeights()
    was_training = model.training
    model.eval()
    sums = {"loss": 0.0, "kl": 0.0, "distill": 0.0, "feat": 0.0}
    for batch in batches:
        terms = loss_terms(model, batch, spec, distill_layers, weights)
        for key in sums:
            sums[key] += float(terms[key]) / len(batches)
    model.train(was_training)
    return sums
