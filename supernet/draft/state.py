"""What the DREAM draft's layers pass around (the cross-attention memory, the KV cache, the
shared target modules) and which visual tokens the memory keeps."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn


# --- state passed around --------------------------------------------------------------
@dataclass
class Memory:
    """Cross-attention keys/values for one subnet over the prompt's kept positions."""

    keys: Tensor  # (batch, heads, mem, head_dim)
    values: Tensor  # (batch, heads, mem, head_dim)
    mask: Tensor  # bool (batch, mem): True = a real (not padded) memory slot
    # whether `mask` may hold padding (False: every slot is real, as one request's memory,
    # and the cross-attention applies no mask)
    padded: bool = True

    @property
    def attn_mask(self) -> Tensor | None:
        """bool (batch, 1, 1, mem) for the attention, or None where every slot is real."""
        return self.mask[:, None, None, :] if self.padded else None

    @property
    def length(self) -> int:
        return int(self.keys.shape[2])


# Positions a draft cache's buffers hold at least when first written (they double past it).
CACHE_MIN_CAPACITY = 256


@dataclass
class DraftCache:
    """The draft's own KV cache (self-attention layers), reused across speculative cycles.

    Each layer's keys and values live in a buffer of (batch, heads, capacity, head_dim) written
    in place: a step copies only its own positions, and the attention reads a view of the
    first `length` positions (`update`). Past the capacity the buffer doubles (an amortised
    copy, not one per step); `crop` moves the length and copies nothing. (A cache that grew by
    concatenation copied every position at every step: O(sequence) a step.)"""

    static = False  # `StaticDraftCache` is the fixed-capacity one

    keys: list[Tensor | None] = field(default_factory=list)  # per layer: the key buffer
    values: list[Tensor | None] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)  # per layer: positions held

    @property
    def length(self) -> int:
        return self.lengths[0] if self.lengths else 0

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new positions' keys and values (batch, heads, n, head_dim) after the
        layer's held ones; returns views of all of them."""
        while len(self.keys) <= layer:
            self.keys.append(None)
            self.values.append(None)
            self.lengths.append(0)
        start = self.lengths[layer]
        end = start + k.shape[2]
        buffer = self.keys[layer]
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            # autograd keeps the views a step read, which a later write would change under it:
            # concatenate instead (nothing trains through a cache today)
            old_v = self.values[layer]
            if start:
                assert buffer is not None and old_v is not None
                k = torch.cat((buffer[:, :, :start], k), dim=2)
                v = torch.cat((old_v[:, :, :start], v), dim=2)
            self.keys[layer], self.values[layer], self.lengths[layer] = k, v, end
            return k, v
        if buffer is None or buffer.shape[2] < end or buffer.shape[:2] != k.shape[:2] \
                or buffer.shape[3] != k.shape[3] or buffer.dtype != k.dtype \
                or buffer.device != k.device:
            self._grow(layer, k, v, end)
        keys, values = self.keys[layer], self.values[layer]
        assert keys is not None and values is not None
        keys[:, :, start:end].copy_(k)
        values[:, :, start:end].copy_(v)
        self.lengths[layer] = end
        return keys[:, :, :end], values[:, :, :end]

    def _grow(self, layer: int, k: Tensor, v: Tensor, end: int) -> None:
        """A buffer for at least `end` positions (double the old capacity, at least
        CACHE_MIN_CAPACITY) holding the layer's positions so far."""
        old_k, old_v, held = self.keys[layer], self.values[layer], self.lengths[layer]
        capacity = max(end, CACHE_MIN_CAPACITY, 2 * (0 if old_k is None else old_k.shape[2]))
        shape = (*k.shape[:2], capacity, k.shape[3])
        new_k = k.new_empty(shape)
        new_v = v.new_empty((*v.shape[:2], capacity, v.shape[3]))
        if held:
            assert old_k is not None and old_v is not None
            new_k[:, :, :held].copy_(old_k[:, :, :held])
            new_v[:, :, :held].copy_(old_v[:, :, :held])
        self.keys[layer], self.values[layer] = new_k, new_v

    def advance(self, n: int) -> None:
        """After a forward (each `update` already counted its positions)."""

    def crop(self, length: int) -> None:
        """Keep the first `length` positions (drop drafted positions after a verify)."""
        if length < 0 or length > self.length:
            raise ValueError(f"cannot crop a draft cache of {self.length} positions to {length}")
        self.lengths = [min(held, length) for held in self.lengths]


def _static(t: Tensor) -> Tensor:
    """`t`, marked as a fixed address for compiled steps (CUDA graphs write it in place)."""
    if not torch.compiler.is_compiling():
        torch._dynamo.mark_static_address(t)
    return t


class StaticDraftCache:
    """The draft's KV cache at a fixed capacity, for compiled steps: every layer's buffer is
    (batch, heads, capacity, head_dim) from the first write, the positions held are a 0-d
    tensor on the device (`position`), a step writes at it and attends over the whole buffer
    through a mask made from it (`mask`), so a step's shapes never change with the sequence.
    `crop` moves the position; the host keeps its own count of what it committed (reading the
    position would wait for the device)."""

    static = True

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a static draft cache of capacity {capacity}: give one of at "
                             "least the positions a request holds (the target's capacity)")
        self.capacity = capacity
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        self.position: Tensor | None = None

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new positions' keys and values at the position; returns the buffers."""
        if layer == len(self.keys):  # first write of this layer (eager, at `start`): allocate
            self.keys.append(_static(k.new_zeros((*k.shape[:2], self.capacity, k.shape[3]))))
            self.values.append(_static(v.new_zeros((*v.shape[:2], self.capacity, v.shape[3]))))
        self._position(k.device)
        index = self.position + torch.arange(k.shape[2], device=k.device)
        self.keys[layer].index_copy_(2, index, k)
        self.values[layer].index_copy_(2, index, v)
        return self.keys[layer], self.values[layer]

    def mask(self, seq: int, device: torch.device, tree_mask: Tensor | None = None) -> Tensor:
        """bool (1, 1, seq, capacity): query i (at cache index position + i) sees every index
        up to its own; with `tree_mask` (seq, t) the last t indices up to the newest query's
        (a token tree's nodes so far and the new ones) are as it says."""
        position = self._position(device)
        query = position + torch.arange(seq, device=device)
        cols = torch.arange(self.capacity, device=device)
        mask = cols[None] <= query[:, None]  # (seq, capacity)
        if tree_mask is not None:
            t = tree_mask.shape[-1]
            rel = cols - (position + seq - t)  # the column's index into tree_mask
            inside = (rel >= 0) & (rel < t)
            chosen = tree_mask.to(device).gather(1, rel.clamp(0, t - 1)[None].expand(seq, -1))
            mask = torch.where(inside[None], chosen, mask)
        return mask[None, None]

    def _position(self, device: torch.device) -> Tensor:
        if self.position is None:
            self.position = _static(torch.zeros((), dtype=torch.long, device=device))
        return self.position

    def advance(self, n: int) -> None:
        """After a forward's every layer wrote its n positions."""
        if self.position is not None:
            self.position.add_(n)

    @torch.inference_mode()  # the position was made in a forward: an inference tensor
    def crop(self, length: int) -> None:
        """Keep the first `length` positions (the host's count: nothing is read back)."""
        if length < 0 or length > self.capacity:
            raise ValueError(f"cannot crop a draft cache of capacity {self.capacity} to {length}")
        if self.position is not None:
            self.position.fill_(length)


def causal_mask(seq: int, past: int, attention_mask: Tensor | None,
                device: torch.device) -> Tensor:
    """bool (1, 1, seq, past + seq): seq new positions after `past` cached ones, causally;
    `attention_mask` (batch, seq), training's keys that exist, only without a cache (a
    position always sees itself)."""
    q_pos = torch.arange(seq, device=device)[:, None] + past
    k_pos = torch.arange(past + seq, device=device)[None]
    mask = (k_pos <= q_pos)[None, None]
    if attention_mask is not None:
        if past:
            raise ValueError("attention_mask is for training without a cache")
        own = torch.eye(seq, dtype=torch.bool, device=device)
        mask = (mask & attention_mask[:, None, None, :]) | own
    return mask


@dataclass
class DraftOutput:
    # (batch, seq, hidden): the draft's final (normed) feature, ~ target last hidden
    feature: Tensor
    cross_out: Tensor | None  # (batch, seq, hidden): the cross-attention block's output


@dataclass(frozen=True)
class SharedTargetModules:
    """The target's token embedding and LM head: shared, frozen, never copied or saved."""

    embed_tokens: nn.Module
    lm_head: nn.Module


# --- visual token selection (pure functions) ------------------------------------------
def keep_count(num_visual: int, visual_keep: float) -> int:
    """How many of `num_visual` tokens a subnet keeps: ceil(keep * n), at least 1 if any."""
    if num_visual == 0:
        return 0
    return max(1, min(num_visual, math.ceil(visual_keep * num_visual - 1e-9)))


def select_memory_positions(visual_mask: Tensor, visual_scores: Tensor, prompt_mask: Tensor,
                            visual_keep: float) -> Tensor:
    """Which prompt positions the cross-attention reads.

    visual_mask:   bool (batch, prompt) True at visual-token positions
    visual_scores: (batch, prompt) attention each position *receives* from the text positions in
                   the target's last layer at prefill (only read at visual positions)
    prompt_mask:   bool (batch, prompt) True at real (not padded) prompt positions
    Returns bool (batch, prompt): every text position and the top `keep_count` visual positions
    by score (ties: the earlier position), in their original order.
    """
    keep = prompt_mask & ~visual_mask
    for b in range(visual_mask.shape[0]):
        vis = torch.nonzero(visual_mask[b] & prompt_mask[b], as_tuple=False).flatten()
        n = keep_count(int(vis.numel()), visual_keep)
        if n == 0:
            continue
        order = torch.sort(visual_scores[b, vis].float(), descending=True, stable=True).indices
        keep[b, vis[order[:n]]] = True
    return keep


def gather_rows(states: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """Compact the kept positions of each row to the front, order preserved.

    states: (batch, seq, hidden); keep: bool (batch, seq) -> (batch, kept_max, hidden), mask
    """
    counts = keep.sum(dim=1)
    width = int(counts.max().item()) if counts.numel() else 0
    # stable sort puts kept positions first, each group in its original order
    order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices[:, :width]
    out = states.gather(1, order[..., None].expand(-1, -1, states.shape[-1]))
    mask = torch.arange(width, device=keep.device)[None] < counts[:, None]
    return out, mask
