"""Training to convergence: held-out tau every few steps, a patience rule, the best checkpoint.

The held-out prompts are training prompts kept out of the gradient (their self-distilled
answers are the target's greedy ones, so `heldout.heldout_tau` scores them teacher-forced with
no target call). Phase 1 trains the full draft only and its evaluations are the curve's first
part; in phase 2 the score is the mean held-out tau of the largest and the smallest subnet at
the deepest draft of the space, the run keeps the weights of its best evaluation, and it stops
once `patience` evaluations in a row have not beaten the last significant best by more than
`tolerance` -- or when the time budget is spent, or at the step cap.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.training.features import TargetSample
from dreams_nas.supernet.training.heldout import heldout_tau


@dataclass(frozen=True)
class HeldOut:
    """The held-out prompts and how to score them."""

    samples: Sequence[TargetSample]
    draft_len: int  # the deepest chain the space drafts
    max_new_tokens: int  # the budget the answers were generated with
    eos_ids: Collection[int] = ()

    def evaluate(self, model: DreamDraft, phase: int) -> dict[str, float]:
        """tau of the largest subnet (and in phase 2 the smallest) and the run's score."""
        config = model.config
        largest = config.largest()
        layer = config.inject_layers[len(config.inject_layers) // 2]
        full = largest.replace(inject_layer=layer, draft_len=self.draft_len)
        out = {"tau_full": heldout_tau(model, self.samples, full, self.draft_len,
                                       self.max_new_tokens, self.eos_ids)}
        if phase == 2:
            space = model.space()
            small = space.smallest().replace(inject_layer=layer, draft_len=self.draft_len)
            out["tau_smallest"] = heldout_tau(model, self.samples, small, self.draft_len,
                                              self.max_new_tokens, self.eos_ids)
            out["score"] = (out["tau_full"] + out["tau_smallest"]) / 2
        return {k: round(v, 4) for k, v in out.items()}


@dataclass
class Tracker:
    """The evaluations so far and the patience rule's state (checkpointed with the run)."""

    evals: list[dict[str, Any]] = field(default_factory=list)
    best_step: int | None = None
    best_score: float | None = None
    anchor: float | None = None  # the last best that beat the one before by > tolerance
    stale: int = 0  # phase-2 evaluations since the anchor moved
    seconds: float = 0.0  # optimisation time spent so far (all attempts of the run)
    stopped: str | None = None  # why the run stopped before its step cap

    def record(self, step: int, phase: int, values: dict[str, float], tolerance: float) -> bool:
        """Add one evaluation; True when it is the best so far (keep these weights)."""
        self.evals.append({"step": step, "phase": phase, "seconds": round(self.seconds, 1),
                           **values})
        score = values.get("score")
        if phase != 2 or score is None:
            return False
        best = self.best_score is None or score > self.best_score
        if best:
            self.best_step, self.best_score = step, score
        if self.anchor is None or score > self.anchor + tolerance:
            self.anchor, self.stale = score, 0
        else:
            self.stale += 1
        return best

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tracker:
        return cls(**data)


def default_holdout(n_samples: int) -> int:
    """Training prompts held out for the convergence check: an eighth, at most 32, none below
    8 prompts (too few to both train and judge)."""
    return min(32, n_samples // 8)


def split_heldout(samples: Sequence[TargetSample], holdout: int | None
                  ) -> tuple[Sequence[TargetSample], Sequence[TargetSample]]:
    """(training samples, held-out samples): the last `holdout` (None: `default_holdout`);
    slices of `samples` (of a `FeatureStore`: views, nothing read)."""
    n = default_holdout(len(samples)) if holdout is None else int(holdout)
    if n >= len(samples):
        raise InputError(f"--holdout {n} keeps all {len(samples)} prompts out of training; "
                         f"give fewer than {len(samples)} (or 0 to train to the step cap)")
    if n <= 0:
        return samples, samples[:0]
    return samples[:-n], samples[-n:]
