"""The draft vocabulary's token order: the target's tokens ranked by how often its own
(self-distilled) answers use them (FR-Spec; EAGLE-3 ranks its draft vocabulary the same way).

A draft of vocabulary share s predicts over the first ceil(s * vocab) ids of this order
(`DreamDraft.logits`). Tokens the answers never use follow, by id; the target verifies every
drafted token, so a token outside the draft's vocabulary costs acceptance, never correctness.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from dreams_nas.supernet.core.errors import InputError
from torch import Tensor


def token_counts(answers: Sequence[Tensor], vocab_size: int) -> Tensor:
    """How often each token id occurs in `answers` -> (vocab_size,) int64."""
    counts = torch.zeros(int(vocab_size), dtype=torch.long, device="cpu")
    for answer in answers:
        ids = torch.as_tensor(answer, dtype=torch.long, device="cpu").flatten()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            raise InputError(f"an answer holds token id {int(ids.max())} outside the target's "
                             f"vocabulary of {vocab_size}; the answers are not this target's")
        counts += torch.bincount(ids, minlength=int(vocab_size))
    return counts


def frequency_order(answers: Sequence[Tensor], vocab_size: int) -> Tensor:
    """Every token id once, the most frequent in `answers` first (ties: lower id first) ->
    (vocab_size,) int64."""
    counts = token_counts(answers, vocab_size)
    return torch.sort(-counts, stable=True).indices


def coverage(answers: Sequence[Tensor], order: Tensor, rows: int) -> float:
    """Share of the answers' tokens among the first `rows` ids of `order` (1.0 without
    tokens): how much of the target's output a draft of that vocabulary can propose."""
    counts = token_counts(answers, int(order.numel()))
    total = int(counts.sum())
    return 1.0 if total == 0 else float(counts[order[:rows]].sum()) / total
