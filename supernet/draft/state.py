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


@dataclass
class DraftCache:
    """The draft's own KV cache (self-attention layers), reused across speculative cycles."""

    keys: list[Tensor | None] = field(default_factory=list)  # per layer (batch, heads, len, d)
    values: list[Tensor | None] = field(default_factory=list)

    @property
    def length(self) -> int:
        return 0 if not self.keys or self.keys[0] is None else int(self.keys[0].shape[2])

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        while len(self.keys) <= layer:
            self.keys.append(None)
            self.values.append(None)
        cached_k, cached_v = self.keys[layer], self.values[layer]
        if cached_k is not None:
            k = torch.cat((cached_k, k), dim=2)
            v = torch.cat((cached_v, v), dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def crop(self, length: int) -> None:
        """Keep the first `length` positions (drop drafted positions after a verify)."""
        if length < 0 or length > self.length:
            raise ValueError(f"cannot crop a draft cache of {self.length} positions to {length}")
        self.keys = [None if k is None else k.narrow(2, 0, length) for k in self.keys]
        self.values = [None if v is None else v.narrow(2, 0, length) for v in self.values]


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
