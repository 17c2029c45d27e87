"""The DREAM-S draft for several requests at once: a chain or a token tree per row, every row at
its own pace.

    drafter = BatchDreamDrafter(draft, spec)
    drafter.start(batch, positions)               # rows' caches, empty
    drafter.admit(b, target, prefill)             # request b, right after its target prefill
    proposal = drafter.propose(last, draft_len, sampling, generator)   # (B, draft_len)
    drafter.update(kept, n, hidden)               # what each row kept of the verify
    drafter.select(index)                         # the rows that go on

Each request starts as at batch 1 (`DreamDrafter.start`: its memory, its own sequence in the
draft's cache) and is copied into its row (`RowDraftCache`, the memory padded to a common
length and masked). A cycle's first step runs every row's true positions -- the tokens the
last verify kept, n_b + 1 of them, then padding up to draft_len + 1 -- at one shape, keeps
n_b + 1 of them in row b's cache and reads row b's feature at its last true position
(`DraftSteps.pick`); then draft_len - 1 one-position steps draft every row's chain, or one step
per level every row's tree (`propose_tree`, each level seeing its ancestors).
Nothing is read back to the host: the loop's one copy per cycle is its own. A row that stopped
(n = -1 in `update`) keeps what it holds and costs only its share of each batched step until
the loop drops it (`select`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.core.tree import TokenTree
from dreams_nas.supernet.decoding.dream import DraftRow, DreamDrafter
from dreams_nas.supernet.decoding.protocol import Proposal, TreeProposal
from dreams_nas.supernet.decoding.sampling import SamplingConfig, logits_to_probs, sample
from dreams_nas.supernet.decoding.tree_sampling import sample_without_replacement
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.row_cache import RowDraftCache
from dreams_nas.supernet.draft.state import Memory
from dreams_nas.supernet.target.static import capacity_for
from torch import Tensor


class BatchDreamDrafter:
    """Drafts chains for a batch of requests with one subnet of a `DreamDraft`."""

    def __init__(self, draft: DreamDraft, spec: SubnetSpec | None = None) -> None:
        self.one = DreamDrafter(draft, spec)
        self.draft, self.spec, self.steps = self.one.draft, self.one.spec, self.one.steps
        self.required_layers = self.one.required_layers
        self.default_draft_len = self.one.default_draft_len
        self._pool: dict[tuple, RowDraftCache] = {}
        self.cache: RowDraftCache | None = None
        self._rows: list[DraftRow | None] = []

    @property
    def _device(self) -> torch.device:
        return next(self.draft.parameters()).device

    @torch.inference_mode()
    def start(self, batch: int, positions: int) -> None:
        """Empty rows for `batch` requests of up to `positions` positions each."""
        self.cache = self._cache(batch, capacity_for(positions))
        self.cache.crop(0)
        self._rows = [None] * batch
        self.memory: Memory | None = None

    def _cache(self, batch: int, capacity: int) -> RowDraftCache:
        key = (batch, capacity, self.spec.heads, self.spec.depth, str(self._device))
        if key not in self._pool:
            self._pool[key] = RowDraftCache(batch, capacity, self._device)
        return self._pool[key]

    @torch.inference_mode()
    def admit(self, row: int, target: Any, prefill: Any) -> None:
        """Request `row` starts, as at batch 1, from its target prefill (`target` holds it)."""
        assert self.cache is not None, "start() first"
        self.one.start(target, prefill)
        state = self._rows[row] = self.one.row_state()
        # the batch-1 cache is the next request's: copied now
        self.cache.admit(row, state.keys, state.values, state.committed)

    def _assemble(self) -> None:
        """The rows' caches, memories and positions as batch tensors."""
        rows = self._rows
        assert self.cache is not None and all(r is not None for r in rows), "admit every row"
        self.committed = self.cache.lengths.clone()
        device = self._device
        self.pos = torch.tensor([r.position for r in rows], device=device)
        self.next_prev = torch.cat([r.next_prev for r in rows])  # (B, 1, hidden)
        self.memory = _stack([r.memory for r in rows])
        self.ids: Tensor | None = None  # set by `update`: the tokens the last verify kept
        self._rows = []

    def _first(self, last: Tensor, draft_len: int) -> tuple[Tensor, Tensor]:
        """The cycle's first step over every row's true positions (padded to draft_len + 1):
        each row's feature (B, 1, hidden) and logits (B, vocab) at its last true one."""
        if self._rows:
            self._assemble()
        assert self.cache is not None
        width = draft_len + 1
        if self.ids is None:  # the first cycle: the prompt's next token only
            ids = F.pad(last.to(self._device), (0, width - 1))
            prev = F.pad(self.next_prev, (0, 0, 0, width - 1))
            valid = torch.ones_like(self.pos)
        else:
            if self.ids.shape[1] != width:
                raise ValueError(f"draft_len {draft_len} changed mid-request (was "
                                 f"{self.ids.shape[1] - 1})")
            ids, prev, valid = self.ids, self.prev, self.valid
        positions = self.pos[:, None] + torch.arange(width, device=self._device)
        out = self.steps.pick(self.draft, ids, prev, positions, self.memory, self.cache,
                              (valid - 1).clamp(min=0))
        self.committed = self.committed + valid
        self.cache.crop(self.committed)
        self.pos = self.pos + valid
        return out

    @torch.inference_mode()
    def propose(self, last: Tensor, draft_len: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:
        """A chain of `draft_len` tokens after each row's `last` (B, 1) token."""
        tokens: list[Tensor] = []
        probs: list[Tensor] = []
        with self.draft.using(self.spec):
            feature, logits = self._first(last, draft_len)
            for i in range(draft_len):
                if sampling.greedy:
                    token = logits.argmax(-1, keepdim=True)
                else:
                    p = logits_to_probs(logits, sampling)
                    token = sample(p, generator).view(-1, 1)
                    probs.append(p)
                tokens.append(token)
                if i + 1 < draft_len:
                    feature, logits = self.steps.run(self.draft, token, feature,
                                                     (self.pos + i)[:, None], self.memory,
                                                     self.cache, last=True)
        draft_probs = torch.stack(probs, dim=1) if probs else None
        return Proposal(torch.cat(tokens, dim=1), draft_probs)

    @torch.inference_mode()
    def propose_tree(self, last: Tensor, tree: TokenTree, sampling: SamplingConfig,
                     generator: torch.Generator | None) -> TreeProposal:
        """A token tree after each row's `last` (B, 1) token, as `DreamDrafter.propose_tree`
        drafts one: the first step, then one step per level over every row's nodes of that
        level, each seeing its row's true positions and its own ancestors."""
        ancestors = self.one._ancestor_mask(tree)
        levels: list[Tensor] = []
        probs: list[Tensor] = []
        batch = last.shape[0]
        with self.draft.using(self.spec):
            feats, logits = self._first(last, tree.draft_len)  # (B, 1, hidden), (B, vocab)
            logits = logits[:, None]
            for d, width in enumerate(tree.branching, start=1):
                flat = logits.reshape(-1, logits.shape[-1])  # a row per node of level d - 1
                if sampling.greedy:  # best first, ties toward the lower id
                    children = flat.sort(dim=-1, descending=True, stable=True).indices[:, :width]
                else:
                    p = logits_to_probs(flat, sampling)
                    children = sample_without_replacement(p, width, generator)
                    probs.append(p.view(batch, -1, p.shape[-1]))
                tokens = children.reshape(batch, -1)  # parent-major, rank-minor: breadth first
                levels.append(tokens)
                if d == tree.draft_len:
                    break
                level = tree.nodes_at(d)
                pos = (self.pos - 1 + d)[:, None].expand_as(tokens).contiguous()
                feats, logits = self.steps.run(
                    self.draft, tokens, feats.repeat_interleave(width, dim=1), pos, self.memory,
                    self.cache, tree_mask=ancestors[level.start:level.stop, 1:level.stop])
        draft_probs = torch.cat(probs, dim=1) if probs else None  # (B, inner nodes, vocab)
        return TreeProposal(tree, torch.cat(levels, dim=1), draft_probs)

    @torch.inference_mode()
    def update(self, kept: Tensor, n: Tensor, hidden: Tensor) -> None:
        """After a verify: row b kept `kept[b, :n[b] + 1]` (its accepted drafts, then the
        target's token; n[b] = -1 keeps nothing), `hidden` (B, draft_len + 1, hidden) the
        target's final hidden states at the verified positions."""
        assert self.cache is not None
        self.cache.crop(self.committed)
        # the kept tokens are the next cycle's true inputs, each with the target's hidden
        # state at the position before it: the verify's at the same index
        self.ids = kept.to(self._device)
        self.prev = hidden.to(self._device, self.next_prev.dtype)
        self.valid = n.to(self._device) + 1

    @torch.inference_mode()
    def select(self, index: list[int]) -> None:
        """Keep the rows `index`, in that order."""
        assert self.cache is not None and not self._rows
        at = torch.tensor(index, device=self._device)
        smaller = self._cache(len(index), self.cache.capacity)
        smaller.take(self.cache, at)
        self.cache = smaller
        for name in ("committed", "pos", "next_prev", "ids", "prev", "valid"):
            value = getattr(self, name, None)
            if isinstance(value, Tensor):
                setattr(self, name, value.index_select(0, at))
        if self.memory is not None:
            m = self.memory
            self.memory = Memory(m.keys.index_select(0, at), m.values.index_select(0, at),
                                 m.mask.index_select(0, at), padded=True)


def _stack(memories: list[Memory | None]) -> Memory | None:
    """One request's memories as a batch: padded to a common length (a multiple of the
    target's capacity step, as a static step pads one) and masked."""
    if memories[0] is None:
        return None
    width = capacity_for(max(int(m.mask.sum()) if m.padded else m.length for m in memories))

    def grow(t: Tensor, dim: int) -> Tensor:  # t's length along `dim` cut or padded to width
        t = t.narrow(dim, 0, min(width, t.shape[dim]))
        pad = [0, 0] * (t.dim() - 1 - dim) + [0, width - t.shape[dim]]
        return F.pad(t, pad)

    keys = torch.cat([grow(m.keys, 2) for m in memories])
    values = torch.cat([grow(m.values, 2) for m in memories])
    mask = torch.cat([grow(m.mask, 1) for m in memories])  # padding is False
    return Memory(keys, values, mask, padded=True)
