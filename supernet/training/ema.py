"""An exponential moving average of the supernet's weights over phase 2.

The sandwich rule's step moves the shared weights by the gradients of three subnets of one
small batch, so the weights the run stops at carry that step's noise, and which batch came
last (a function of the seed) shows in the subnets' acceptance. The average of the weights
over the last ~1 / (1 - decay) steps (Polyak averaging; the weight EMA of BigNAS, which
evaluates its supernet with averaged weights) does not: held-out tau is scored on the average
and the kept weights are the average's.

The average starts from the weights at phase 2's first step, after the heads were sorted (a
sort permutes the weights, so an average over both orders would mix different heads). Every
rank updates its own copy from the same weights (data parallel keeps them equal), so the
copies stay equal too; rank 0 evaluates and checkpoints it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from dreams_nas.supernet.draft.model import DreamDraft


class WeightAverage:
    """The EMA of `model`'s trained parameters (those that require grad), in float32."""

    def __init__(self, model: DreamDraft, decay: float,
                 state: dict[str, torch.Tensor] | None = None) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay={decay} must be within (0, 1)")
        self.decay = float(decay)
        self._params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        if state is None:
            self.shadow = {n: p.detach().float().clone() for n, p in self._params.items()}
        else:
            missing = sorted(set(self._params) - set(state))
            if missing:
                raise ValueError(f"the saved weight average lacks {missing[:3]}")
            self.shadow = {n: state[n].to(p.device, torch.float32).clone()
                           for n, p in self._params.items()}

    @torch.no_grad()
    def update(self) -> None:
        """Fold the current weights in: shadow <- decay * shadow + (1 - decay) * weights."""
        for name, param in self._params.items():
            self.shadow[name].lerp_(param.detach().float(), 1.0 - self.decay)

    @contextmanager
    @torch.no_grad()
    def applied(self) -> Iterator[None]:
        """The model holds the averaged weights inside the block, its own after it."""
        saved = {n: p.detach().clone() for n, p in self._params.items()}
        try:
            for name, param in self._params.items():
                param.copy_(self.shadow[name])
            yield
        finally:
            for name, param in self._params.items():
                param.copy_(saved[name])

    @torch.no_grad()
    def copy_to(self, model: DreamDraft) -> None:
        """Leave `model` with the averaged weights."""
        params = dict(model.named_parameters())
        for name, value in self.shadow.items():
            params[name].copy_(value)

    def state(self) -> dict[str, torch.Tensor]:
        """CPU copies of the average, for a checkpoint."""
        return {n: t.detach().cpu().contiguous() for n, t in self.shadow.items()}
