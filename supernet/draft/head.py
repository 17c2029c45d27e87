"""The draft's LM head: the target's own, over the whole vocabulary or a draft vocabulary's rows.

With a draft vocabulary (`SubnetSpec.draft_vocab` < 1) only the head's rows of its tokens are
computed (the cost that shrinks: FR-Spec's reduced head); they are written back at their target
ids and every other token gets -inf, so argmax, top-k and the sampling rules see a distribution
over target ids that is zero outside the draft's vocabulary (the target verifies, so output is
unchanged).
"""

from __future__ import annotations

from typing import Any

import torch
from dreams_nas.supernet.ops.linear import linear, slow_backward
from torch import Tensor, nn


def _version(tensor: Tensor) -> int:
    """The tensor's in-place version counter (-1 for an inference tensor, which has none and
    cannot be changed in place outside inference mode)."""
    return -1 if tensor.is_inference() else int(tensor._version)


class HeadRows:
    """The LM head's rows (and bias) of a draft vocabulary, cut once per vocabulary size and
    kept while the head's weight and the vocabulary order stay the same tensors, unchanged."""

    def __init__(self) -> None:
        self._rows: dict[tuple[Any, ...], tuple[Tensor, Tensor | None]] = {}

    def get(self, head: nn.Module, ids: Tensor, order: Tensor) -> tuple[Tensor, Tensor | None]:
        """`head`'s rows `ids` (a prefix of `order`, the draft's vocabulary order)."""
        weight, bias = head.weight, getattr(head, "bias", None)
        key = (int(ids.shape[0]), weight.data_ptr(), weight.device, weight.dtype,
               _version(weight), order.data_ptr(), _version(order))
        cached = self._rows.get(key)
        if cached is None:
            with torch.no_grad():
                cached = (weight.index_select(0, ids).contiguous(),
                          None if bias is None else bias.index_select(0, ids).contiguous())
            self._rows = {key: cached, **{k: v for k, v in self._rows.items()
                                          if k[0] != key[0]}}  # one slice per size
        return cached


def full_logits(head: nn.Module, feature: Tensor) -> Tensor:
    """feature: (..., hidden) -> (..., vocab) over the whole vocabulary."""
    weight = getattr(head, "weight", None)
    if weight is None:
        return head(feature)
    feature = feature.to(weight.dtype)
    if not slow_backward(feature, weight):  # the module itself: its hooks see the call
        return head(feature)
    return linear(feature, weight, getattr(head, "bias", None))


def vocab_logits(head: nn.Module, feature: Tensor, order: Tensor, rows: int,
                 cache: HeadRows) -> Tensor:
    """feature: (..., hidden) -> (..., vocab): the logits of the `rows` first tokens of `order`
    (target ids, most frequent first) at their ids, -inf elsewhere."""
    weight = getattr(head, "weight", None)
    ids = order[:rows].to(feature.device)
    if weight is None:  # a head without a weight matrix: compute all, keep the vocabulary
        full = head(feature)
        return torch.full_like(full, float("-inf")).index_copy_(
            -1, ids, full.index_select(-1, ids))
    w, b = cache.get(head, ids, order)
    sub = linear(feature.to(w.dtype), w, b)
    out = sub.new_full((*sub.shape[:-1], int(weight.shape[0])), float("-inf"))
    return out.index_copy_(-1, ids, sub)
