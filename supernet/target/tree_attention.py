"""Tree attention for the target: verify every node of a token tree in one forward.

The n nodes (breadth first, node 0 the root) are appended to the KV cache in one forward. Node i
sits at position ``cache_len + level(i)`` and attends to the whole cache plus its own ancestors
and itself, so its logits equal those of a chain forward of its root-to-node path. Afterwards
`compact_cache` keeps the accepted path's entries, packed right after the old cache.

The mask is additive (0 where a node may look, the dtype's minimum elsewhere), shaped
(1, 1, n, cache_len + n) and in the model's dtype: transformers' `create_causal_mask` returns a
4D mask unchanged, eager attention adds it to the scores and sdpa takes it as ``attn_mask``
(a boolean mask would be *added* as 0/1 by eager attention). Flash attention takes no such mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

# Attention implementations that take a custom 4D additive mask unchanged.
MASKED_ATTENTION = ("eager", "sdpa")


@dataclass(frozen=True)
class TreeLayout:
    """What a tree's mask and positions need that does not depend on the cache length."""

    parents: tuple[int, ...]
    levels: Tensor  # (n,) long: 0 for the root
    bias: Tensor  # (n, n) additive: 0 where node i may attend node j (an ancestor or itself)

    @property
    def nodes(self) -> int:
        return len(self.parents)

    def mask(self, cache_len: int) -> Tensor:
        """(1, 1, n, cache_len + n): every node sees the whole cache, then its ancestors."""
        prefix = self.bias.new_zeros(self.nodes, cache_len)
        return torch.cat((prefix, self.bias), dim=1)[None, None]

    def positions(self, cache_len: int, rope_deltas: Tensor | None = None,
                  mrope: bool = False) -> Tensor:
        """Position ids: (1, n), or (3, 1, n) for M-RoPE, where every axis of a text token is
        its sequential position plus the prompt's ``rope_deltas`` (what an incremental step
        at that level would get)."""
        pos = (self.levels + cache_len)[None]  # (1, n)
        if not mrope:
            return pos
        if rope_deltas is not None:
            pos = pos + rope_deltas.to(pos.device).view(-1, 1)[:1]
        return pos[None].expand(3, 1, -1)


def check_parents(parents: Sequence[int], n: int) -> tuple[int, ...]:
    """`parents` as a tuple after checking it describes a tree of n nodes in breadth-first
    order (parents[0] == -1, 0 <= parents[i] < i); ValueError otherwise."""
    out = tuple(int(p) for p in parents)
    if len(out) != n:
        raise ValueError(f"parents has {len(out)} entries for {n} tree nodes; give one per node")
    if n == 0 or out[0] != -1:
        raise ValueError(f"parents {list(out)} must start with -1 (node 0 is the root)")
    bad = [i for i in range(1, n) if not 0 <= out[i] < i]
    if bad:
        raise ValueError(f"parents[{bad[0]}] = {out[bad[0]]} must name an earlier node "
                         f"(0..{bad[0] - 1}); nodes are numbered breadth first")
    return out


def ancestor_mask(parents: Sequence[int]) -> Tensor:
    """bool (n, n) on the CPU: [i, j] when node j is node i or one of its ancestors (built once
    per tree shape; callers cache it on their device)."""
    out = torch.eye(len(parents), dtype=torch.bool)  # cpu: built once per shape, then moved
    for i in range(1, len(parents)):
        out[i] |= out[parents[i]]
    return out


def build_layout(parents: tuple[int, ...], device: torch.device, dtype: torch.dtype
                 ) -> TreeLayout:
    """The layout of a checked `parents` tuple, on `device`, the mask in `dtype`."""
    levels = [0] * len(parents)
    for i in range(1, len(parents)):  # once per tree shape; the layout is cached by the caller
        levels[i] = levels[parents[i]] + 1
    bias = torch.zeros(len(parents), len(parents), dtype=dtype).masked_fill_(  # cpu: moved below
        ~ancestor_mask(parents), torch.finfo(dtype).min)
    return TreeLayout(parents, torch.tensor(levels, device=device), bias.to(device))


class LayoutCache:
    """Layouts by (parents, device, dtype): a decoding run verifies the same few shapes."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self._layouts: dict[tuple, TreeLayout] = {}

    def get(self, parents: tuple[int, ...], device: torch.device, dtype: torch.dtype
            ) -> TreeLayout:
        key = (parents, device, dtype)
        layout = self._layouts.get(key)
        if layout is None:
            if len(self._layouts) >= self.size:
                self._layouts.pop(next(iter(self._layouts)))
            layout = self._layouts[key] = build_layout(parents, device, dtype)
        return layout


def check_path(path: Sequence[int], parents: tuple[int, ...]) -> list[int]:
    """`path` as a list after checking it is a root-to-node path of the tree (starts at 0,
    each node the child of the one before); ValueError otherwise."""
    out = [int(i) for i in path]
    if not out or out[0] != 0:
        raise ValueError(f"path {out} must start at node 0 (the root)")
    for a, b in zip(out, out[1:], strict=False):
        if not 0 < b < len(parents) or parents[b] != a:
            raise ValueError(f"path {out} is not a root-to-node path: node {b} is not a child "
                             f"of node {a}")
    return out


def compact_cache(cache: Any, start: int, keep: Tensor) -> None:
    """Keep, after the first `start` positions of every layer of a DynamicCache, only the
    entries at `keep` (absolute positions, ascending, on the cache's device), packed in order.

    Only the tail is copied: the kept rows are gathered, written at ``start`` and the rest cut
    off, so a long prompt's cache is not copied every cycle."""
    end = start + len(keep)
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", False) or layer.keys is None:
            continue
        index = keep.to(layer.keys.device)
        for name in ("keys", "values"):
            states = getattr(layer, name)  # (batch, kv_heads, seq, head_dim)
            states[:, :, start:end] = states.index_select(-2, index)
            setattr(layer, name, states[:, :, :end])
        if hasattr(layer, "cumulative_length"):  # sliding-window layers count their tokens
            layer.cumulative_length = end


def sliding_window(config: Any) -> int | None:
    """The sliding window of a text config's attention layers (None when all are full)."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return None
    if types is not None and "sliding_attention" not in types:
        return None
    return int(window)


def tree_support(config: Any) -> str | None:
    """Why a decoder with text config `config` cannot verify token trees (None when it can)."""
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl not in MASKED_ATTENTION:
        return (f"attention implementation {impl!r} takes no custom tree mask; load the target "
                "with attn_implementation='sdpa' or 'eager' to verify trees")
    window = sliding_window(config)
    limit = getattr(config, "max_position_embeddings", None)
    if window is not None and (limit is None or window < limit):
        return (f"sliding-window attention (window {window}) drops the cache entries a tree's "
                "path needs once the context passes the window")
    return None
