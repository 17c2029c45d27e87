"""The DREAM draft's steps as the target runs its own: eager over a growing cache, or over a
fixed-capacity cache with each step's shape compiled once (`TargetAdapter.use_steps`).

    steps = DraftSteps(draft)
    cache = steps.fresh_cache(target, spec)  # at `start`: in the target's step mode
    memory = steps.padded(memory)            # static: the memory padded to a fixed length
    feature, logits = steps.run(draft, ids, prev, positions, memory, cache, last=True)

A step is the draft's forward over some positions and its logits (of the last position with
`last`, else of every one): the first step of a cycle (`first`: the true positions, 1 ..
draft_len + 1 of them, padded to draft_len + 1 in static steps, the logits of the last true
one only), a chain's later step (one position) and a tree level (its width).
With static steps the cross-attention memory is padded to a multiple of the target's
`CAPACITY_STEP` (its length is a shape too, and differs with every prompt) and masked, and the
draft cache has the target cache's capacity; compiled, the step is `torch.compile`d with the
target's backend (CUDA graphs on CUDA, inductor on the CPU). `WARMUP_S` records each shape's
first call in the process: its compilation; the later calls of that shape on the same cache
skip dynamo's guards (`static.warm_call`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.state import DraftCache, Memory, StaticDraftCache
from dreams_nas.supernet.target.static import (
    capacity_for,
    compile_step,
    signature,
    warm_call,
)
from torch import Tensor


class DraftSteps:
    """The draft's steps in the target's step mode, compiled per shape when it is compiled.

    One per draft model (`DraftSteps.of`): every drafter of a draft shares its static caches,
    as the target's adapter shares its own, so requests run one after another, as the loop runs
    them. The compiled step is one for every draft (it takes the draft as an argument): drafts
    of the same shapes share its graphs, so a profile that extracts each subnet anew compiles
    each shape once."""

    @classmethod
    def of(cls, draft: DreamDraft) -> DraftSteps:
        """The draft's steps, made on first use and kept on the draft (a copy of it has none):
        they live and die with it."""
        steps = getattr(draft, "_steps", None)
        if not isinstance(steps, DraftSteps):
            steps = cls(draft)
            draft.__dict__["_steps"] = steps  # not a submodule: nn.Module's setattr is bypassed
        return steps

    def __init__(self, draft: DreamDraft) -> None:
        self.draft = draft
        self.mode = "dynamic"
        self.backend: str | None = None
        self._seen: set[tuple] = set()
        self._device = next(draft.parameters()).device  # the draft's, as of `configure`
        self._last: dict[tuple[int, torch.device], Tensor] = {}  # `first`'s last true position
        self._cache: StaticDraftCache | None = None  # the request's: one of `_caches`
        self._caches: dict[tuple[int, int, int, str], StaticDraftCache] = {}

    def fresh_cache(self, target: Any, spec: SubnetSpec) -> DraftCache | StaticDraftCache:
        """An empty cache for a new request of subnet `spec`, in the target's step mode (a
        static one has the target cache's capacity)."""
        static = getattr(target, "static", None)
        mode = getattr(target, "step_mode", "dynamic") if static is not None else "dynamic"
        self.configure(mode, None if static is None else static.backend)
        if mode == "dynamic":
            return DraftCache()
        return self.static_cache(static.capacity, spec)

    def configure(self, mode: str, backend: str | None = None) -> None:
        """Run the steps in `mode` (`STEP_MODES`) with torch.compile's `backend` from now on."""
        self.mode, self.backend = mode, backend
        self._device = next(self.draft.parameters()).device  # once a request, not once a step

    def static_cache(self, capacity: int, spec: SubnetSpec) -> StaticDraftCache:
        """An empty static cache of `capacity` positions for subnet `spec`: reused while the
        capacity and the subnet's heads and depth (its buffers' shapes) are the same, since
        compiled steps keep its buffers."""
        key = (capacity, spec.heads, spec.depth, str(next(self.draft.parameters()).device))
        self._cache = self._caches.get(key)
        if self._cache is None:
            self._cache = self._caches[key] = StaticDraftCache(capacity)
        self._cache.crop(0)
        return self._cache

    def padded(self, memory: Memory) -> Memory:
        """Static steps: the memory padded (and masked) to the next multiple of the target's
        capacity step, so that its length is one of few shapes."""
        if self.mode == "dynamic":
            return memory
        n = memory.length
        pad = capacity_for(n) - n

        def grow(t: Tensor) -> Tensor:
            return torch.nn.functional.pad(t, (0, 0, 0, pad))

        mask = torch.nn.functional.pad(memory.mask, (0, pad), value=False)
        return Memory(grow(memory.keys), grow(memory.values), mask, padded=True)

    def run(self, draft: Any, ids: Tensor, prev: Tensor, positions: Tensor,
            memory: Memory | None, cache: Any, *, last: bool = False,
            tree_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The active subnet's forward over `ids` and its float logits: (feature of the last
        position (batch, 1, hidden), logits (batch, vocab)) with `last`, else every position's
        feature (batch, seq, hidden) and logits (batch, seq, vocab). `draft`: the drafter's
        draft, which dynamic steps call (a wrapper that times its calls sees them); static
        steps run this draft's own (compiled) step."""
        return self._run(draft, (ids, prev, positions), memory, cache,
                         "last" if last else "all", tree_mask, None)

    def pick(self, draft: Any, ids: Tensor, prev: Tensor, positions: Tensor,
             memory: Memory | None, cache: Any, at: Tensor) -> tuple[Tensor, Tensor]:
        """`run` that returns row b's feature (batch, 1, hidden) and logits (batch, vocab) at
        position at[b] ((batch,) long): a batch whose rows end at different positions."""
        return self._run(draft, (ids, prev, positions), memory, cache, "pick", None, at)

    def _run(self, draft: Any, inputs: tuple[Tensor, Tensor, Tensor], memory: Memory | None,
             cache: Any, how: str, tree_mask: Tensor | None,
             pick: Tensor | None) -> tuple[Tensor, Tensor]:
        ids, prev, positions = inputs
        if self.mode == "dynamic" or memory is None:
            return _step(draft, ids, prev, positions, memory, cache, how, tree_mask, pick)
        fn = self._fn(how)
        args = (self.draft, _canonical(ids), _canonical(prev), _canonical(positions),
                memory.keys, memory.values, memory.mask, tree_mask, cache, pick)
        if self.mode != "compiled":
            return fn(*args)
        key = (ids.shape[1], how, None if tree_mask is None else tuple(tree_mask.shape),
               self.draft.active)
        # what the guards see besides: every input, the target's modules the draft shares;
        # a call like one met before need not be checked again
        warm = (key, id(getattr(self.draft, "_shared", None)), signature(*args))
        if warm in self._seen:
            return warm_call(fn, *args)
        self._seen.add(warm)
        start = time.perf_counter()
        out = fn(*args)  # its first call compiles it (or finds it compiled)
        WARMUP_S.setdefault(_label(key), time.perf_counter() - start)
        return out

    def first(self, draft: Any, ids: Tensor, prev: Tensor, positions: Tensor,
              memory: Memory | None, cache: DraftCache | StaticDraftCache, committed: int,
              width: int) -> tuple[Tensor, Tensor]:
        """A cycle's first step over its n true positions (1 .. width), as `run(last=True)`.
        Static steps run it at one shape, `width` positions: the true ones, then padding that
        no true position sees (it comes after them), whose cache entries are dropped
        (`committed` + n positions are kept) and overwritten by the next step."""
        n = ids.shape[1]
        if self.mode == "dynamic" or memory is None or n > width:
            return self.run(draft, ids, prev, positions, memory, cache, last=True)
        pad = width - n
        more = positions[:, -1:] + torch.arange(1, pad + 1, device=positions.device)
        inputs = (torch.nn.functional.pad(ids, (0, pad)),
                  torch.nn.functional.pad(prev, (0, 0, 0, pad)),
                  torch.cat((positions, more), dim=1))
        # the LM head of the last true position only (at a 32,000-token vocabulary the others'
        # logits would cost more than the rest of the step): which one is a tensor, one shape
        at = self._last.get((n, ids.device))
        if at is None:
            at = self._last[(n, ids.device)] = torch.full((1,), n - 1, device=ids.device)
        feature, logits = self._run(draft, inputs, memory, cache, "pick", None, at)
        cache.crop(committed + n)
        return feature, logits

    def _fn(self, how: str) -> Callable[..., tuple[Tensor, Tensor]]:
        """The static step, compiled in compiled mode: one function for every draft, which it
        takes as an argument, so drafts of the same shapes (every subnet with the same heads,
        depth and widths, extracted or not) share its graphs."""
        if self.mode != "compiled":
            return _STATIC[how]
        key = (self.backend, self._device.type, how)
        fn = _COMPILED.get(key)
        if fn is None:
            fn = _COMPILED[key] = compile_step(_STATIC[how], self.backend, self._device)
        return fn


# each draft shape's first call in this process, in seconds: its compilation, whichever draft
# made it (a profile extracts each subnet anew; `nas.stages.profile_checks.compile_seconds`)
WARMUP_S: dict[str, float] = {}

# (backend, device type, how) -> the compiled static step (`DraftSteps._fn`)
_COMPILED: dict[tuple[str | None, str, str], Callable[..., tuple[Tensor, Tensor]]] = {}


def _canonical(t: Tensor) -> Tensor:
    """`t` with a contiguous tensor's strides, no copy where it is contiguous: a compiled step
    is specialised on its inputs' strides, and a view of a longer tensor (the next token's
    position, a verify's hidden state) has other strides on its size-1 dimensions than a fresh
    tensor; each pattern would compile again."""
    if not t.is_contiguous():
        return t.contiguous()
    strides, step = [], 1
    for size in reversed(t.shape):
        strides.append(step)
        step *= size
    return t.as_strided(t.shape, tuple(reversed(strides)), t.storage_offset())


def _label(key: tuple) -> str:
    n, how, tree, spec = key
    name = "level" if tree else {"last": "step", "all": "all", "pick": "first"}[how]
    return f"{spec.id}:{name}{n}"


def _static(draft: Any, ids: Tensor, prev: Tensor, positions: Tensor, keys: Tensor,
            values: Tensor, mask: Tensor, tree_mask: Tensor | None, cache: Any,
            pick: Tensor | None, how: str) -> tuple[Tensor, Tensor]:
    return _step(draft, ids, prev, positions, Memory(keys, values, mask, padded=True), cache,
                 how, tree_mask, pick)


def _static_last(*args: Any) -> tuple[Tensor, Tensor]:
    return _static(*args, "last")


def _static_all(*args: Any) -> tuple[Tensor, Tensor]:
    return _static(*args, "all")


def _static_pick(*args: Any) -> tuple[Tensor, Tensor]:
    return _static(*args, "pick")


_STATIC = {"last": _static_last, "all": _static_all, "pick": _static_pick}


def _step(draft: DreamDraft, ids: Tensor, prev: Tensor, positions: Tensor,
          memory: Memory | None, cache: Any, how: str, tree_mask: Tensor | None,
          pick: Tensor | None = None) -> tuple[Tensor, Tensor]:
    feature = draft(ids, prev, positions, memory, cache=cache, tree_mask=tree_mask).feature
    if how == "all":
        return feature, draft.logits(feature).float()
    if how == "pick":
        assert pick is not None
        index = pick.view(-1, 1, 1).expand(-1, 1, feature.shape[-1])
        feature = feature.gather(1, index)
    else:
        feature = feature[:, -1:]
    return feature, draft.logits(feature)[:, -1].float()
