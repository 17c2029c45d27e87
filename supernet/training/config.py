"""The hyperparameters of supernet training (`TrainConfig`): how TPPT optimises, not what it
trains (`recipe.SupernetRecipe`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.training.batching import LossWeights

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
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if isinstance(known.get("weights"), dict):
            known["weights"] = LossWeights(**known["weights"])
        return cls(**known)
