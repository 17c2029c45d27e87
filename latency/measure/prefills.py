"""The target's prefilled KV caches a profile keeps, one per context length.

Every timed target step starts from a cache holding exactly `context_len` positions and rolls
back what it appends, so the cache's cost depends on its length, not on which tokens it holds.
A profile visits its keys in a shuffled order (`profiler.run_profile`), so consecutive steps
usually differ in context; keeping only the last cache made nearly every step refill one, and a
prefill of 600 positions of a 0.4B target in bfloat16 on a CPU takes seconds (the profile of
the real-shaped proxy spent most of its time there). Each cache here is a real prefill at its
own length, never a longer one rolled back (whose storage would not be what decoding reads),
kept while the caches together fit `budget_bytes`; the least recently used goes first.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# What the kept caches may hold together on one device, at most.
MAX_KEPT_BYTES = 4 << 30
# ... and at most this share of the device's free memory when they are kept.
FREE_SHARE = 0.2


def cache_bytes(cache: Any) -> int:
    """The bytes of a Hugging Face cache's key and value tensors (0 for an unknown layout)."""
    total = 0
    for layer in getattr(cache, "layers", ()) or ():
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
    return total


def free_bytes(device: torch.device) -> int:
    """The free memory of `device` (CUDA: the driver's figure; CPU: the host's available)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:  # Linux: what can be allocated without swapping (page cache included)
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # no such figure here
        return MAX_KEPT_BYTES


@dataclass
class _Kept:
    cache: Any
    output: Any  # the prefill's output (with the hidden states the draft reads)
    rope_deltas: Any  # M-RoPE targets: the position offsets the prefill left on the model
    nbytes: int


class KeptPrefills:
    """Prefilled caches of one adapter by context length (see the module text)."""

    def __init__(self, adapter: Any, budget_bytes: int | None = None) -> None:
        self.adapter = adapter
        self.budget_bytes = budget_bytes
        self._kept: OrderedDict[int, _Kept] = OrderedDict()
        self.prefills = 0  # prefills run (for tests and logs)

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, context_len: int, fill: Callable[[int], Any]) -> Any:
        """Leave the adapter's cache holding `context_len` positions (a kept cache swapped in
        and rolled back to that length, else `fill(context_len)`, which prefills); returns the
        prefill's output."""
        adapter = self.adapter
        kept = self._kept.get(context_len)
        if kept is not None:
            length = int(kept.cache.get_seq_length())
            if length >= context_len:
                self._kept.move_to_end(context_len)
                self._swap_in(kept)
                if length > context_len:  # a cycle leaves its accepted tokens
                    adapter.rollback(length - context_len)
                return kept.output
            del self._kept[context_len]  # cut below its length by someone: refilled
        output = fill(context_len)
        self.prefills += 1
        model = getattr(adapter.model, "model", None)
        kept = _Kept(adapter.cache, output, getattr(model, "rope_deltas", None),
                     cache_bytes(adapter.cache))
        self._keep(context_len, kept)
        return output

    def _swap_in(self, kept: _Kept) -> None:
        adapter = self.adapter
        if adapter.cache is kept.cache:
            return
        adapter.rollback(0)  # forget a tree verify in flight (it belongs to the other cache)
        adapter.cache = kept.cache
        if getattr(getattr(adapter, "info", None), "uses_mrope", False):
            adapter.model.model.rope_deltas = kept.rope_deltas

    def _keep(self, context_len: int, kept: _Kept) -> None:
        budget = self.budget_bytes
        if budget is None:
            budget = min(MAX_KEPT_BYTES, int(FREE_SHARE * free_bytes(self.adapter.device)))
        self._kept[context_len] = kept
        while len(self._kept) > 1 and sum(k.nbytes for k in self._kept.values()) > budget:
            self._kept.popitem(last=False)  # the least recently used (never the new one)
