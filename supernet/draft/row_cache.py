"""The draft's KV cache for several requests at once: a fixed capacity, each row its own length.

Like `state.StaticDraftCache` (the batch-1 one compiled steps use), every layer's buffer is
(batch, heads, capacity, head_dim) and a step attends over all of it through a mask; here each
row writes its new positions after its own length (`lengths`, (batch,) on the device) and sees
its own slots only, so rows that accepted different numbers of drafts never wait for each other.
A row is filled from a batch-1 cache of the same draft (`admit`), as its request's prefill
left it. `crop` takes one length for every row or a (batch,) tensor.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def _static(t: Tensor) -> Tensor:
    if not torch.compiler.is_compiling():
        torch._dynamo.mark_static_address(t)
    return t


class RowDraftCache:
    """The draft's cache of `batch` rows of `capacity` positions."""

    static = True

    def __init__(self, batch: int, capacity: int, device: torch.device) -> None:
        if capacity < 1 or batch < 1:
            raise ValueError(f"a row draft cache of {batch} rows x {capacity} positions")
        self.batch, self.capacity = batch, capacity
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        self.lengths = _static(torch.zeros(batch, dtype=torch.long, device=device))

    def _allocate(self, like_k: Tensor, like_v: Tensor, layers: int) -> None:
        while len(self.keys) < layers:
            self.keys.append(_static(like_k.new_zeros(
                (self.batch, like_k.shape[1], self.capacity, like_k.shape[3]))))
            self.values.append(_static(like_v.new_zeros(
                (self.batch, like_v.shape[1], self.capacity, like_v.shape[3]))))

    def admit(self, row: int, keys: list[Tensor], values: list[Tensor], length: int) -> None:
        """Row `row` holds the first `length` positions of a batch-1 cache's layer buffers."""
        if length > self.capacity:
            raise RuntimeError(f"a draft prompt of {length} positions passes the row cache's "
                               f"capacity {self.capacity}")
        self._allocate(keys[0], values[0], len(keys))
        for mine, theirs in ((self.keys, keys), (self.values, values)):
            for buffer, source in zip(mine, theirs, strict=True):
                buffer[row, :, :length].copy_(source[0, :, :length])
        self.lengths[row] = length

    def take(self, source: RowDraftCache, index: Tensor) -> None:
        """The rows `index` of `source`, in that order (as many as this cache holds)."""
        if source.keys:
            self._allocate(source.keys[0], source.values[0], len(source.keys))
        for mine, theirs in ((self.keys, source.keys), (self.values, source.values)):
            for buffer, other in zip(mine, theirs, strict=True):
                buffer.copy_(other.index_select(0, index))
        self.lengths.copy_(source.lengths.index_select(0, index))

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write each row's new positions after its length; returns the buffers."""
        if layer == len(self.keys):
            self._allocate(k, v, layer + 1)
        slots = self.lengths[:, None] + torch.arange(k.shape[2], device=k.device)  # (B, n)
        for buffer, states in ((self.keys[layer], k), (self.values[layer], v)):
            index = slots[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[3])
            buffer.scatter_(2, index, states)
        return self.keys[layer], self.values[layer]

    def mask(self, seq: int, device: torch.device, tree_mask: Tensor | None = None) -> Tensor:
        """bool (batch, 1, seq, capacity): query i of row b sees its row's slots up to its own;
        with `tree_mask` (seq, t) the row's last t slots up to its newest query (a token
        tree's nodes so far and the new ones) are as it says."""
        query = self.lengths[:, None] + torch.arange(seq, device=device)  # (B, seq)
        cols = torch.arange(self.capacity, device=device)
        mask = cols[None, None] <= query[:, :, None]  # (B, seq, capacity)
        if tree_mask is not None:
            t = tree_mask.shape[-1]
            rel = cols[None] - (self.lengths + seq - t)[:, None]  # (B, capacity)
            inside = (rel >= 0) & (rel < t)
            index = rel.clamp(0, t - 1)[:, None, :].expand(-1, seq, -1)
            chosen = tree_mask.to(device)[None].expand(self.batch, -1, -1).gather(2, index)
            mask = torch.where(inside[:, None, :], chosen, mask)
        return mask[:, None]

    def advance(self, n: int) -> None:
        self.lengths.add_(n)

    @torch.inference_mode()
    def crop(self, length: Any) -> None:
        """Every row keeps its first `length` positions (an int, or (batch,) per row)."""
        if isinstance(length, Tensor):
            self.lengths.copy_(length)
        else:
            self.lengths.fill_(int(length))
