"""The DREAM-S draft behind the engine's `Drafter` protocol (supernet subnet or extracted draft).

Per sequence the draft keeps its own KV cache over the positions whose inputs are *true*
(token + the target's hidden state of the position before): the prompt's text and kept visual
tokens (`DreamDraft.draft_positions`), then the verified tokens. Each cycle:

* `propose`: run the pending true positions (the drafts accepted last cycle and the target's
  own newest token) in one forward, then draft autoregressively, each step feeding the draft's
  own feature in place of the target's unknown hidden state;
* `propose_tree` (a token tree instead of a chain): the same first forward, then one forward
  per level over all that level's nodes, each node seeing the true positions and its own
  ancestors (a tree mask over the draft's cache), the top-k of each node's distribution as
  its children (sampled without replacement when sampling);
* `update`: crop the cache back to the true positions and queue the newly accepted tokens with
  the target hidden states the verify just returned.

The cross-attention memory (keys/values of the prompt's text + kept visual tokens at the
spec's inject layer) is built once at `start`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.core.tree import TokenTree
from dreams_nas.supernet.decoding.draft_steps import DraftSteps
from dreams_nas.supernet.decoding.protocol import Proposal, TreeProposal
from dreams_nas.supernet.decoding.sampling import SamplingConfig, choose, logits_to_probs, sample
from dreams_nas.supernet.decoding.tree_sampling import sample_without_replacement
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.state import (
    DraftCache,
    Memory,
    SharedTargetModules,
    StaticDraftCache,
)
from dreams_nas.supernet.target.adapter import PrefillOutput, TargetAdapter, VerifyOutput
from dreams_nas.supernet.target.tree_attention import ancestor_mask
from torch import Tensor


class DraftRow(NamedTuple):
    """What `DreamDrafter.start` left for one request, for a batch to take (`batch_dream`)."""

    memory: Memory | None  # (1, heads, mem, head_dim), padded or not
    keys: list[Tensor]  # per layer (1, heads, >= committed, head_dim)
    values: list[Tensor]
    committed: int  # the cache's true positions
    position: int  # the target position of the next true token
    next_prev: Tensor  # (1, 1, hidden): the first new token's input feature


class DreamDrafter:
    """Drafts with one subnet of a `DreamDraft` (the supernet or a `CompactDraft`)."""

    def __init__(self, draft: DreamDraft, spec: SubnetSpec | None = None) -> None:
        self.draft = draft.eval()
        self.spec = spec or draft.active
        with draft.using(self.spec):  # validate now, not mid-generation
            pass
        self.required_layers: tuple[int, ...] = (self.spec.inject_layer,)
        self.default_draft_len: int = self.spec.draft_len
        self._cache: DraftCache | StaticDraftCache = DraftCache()
        self._memory: Memory | None = None
        self.steps = DraftSteps.of(self.draft)  # eager, or compiled when the target's steps are
        self.default_tree: TokenTree | None = self.spec.shape if self.spec.is_tree else None
        self._ancestors: dict[tuple[int, ...], Tensor] = {}

    @property
    def _param(self) -> Tensor:
        return next(self.draft.parameters())

    @torch.inference_mode()
    def start(self, target: TargetAdapter, prefill: PrefillOutput) -> None:
        if not self.draft.is_attached:
            self.draft.attach(SharedTargetModules(target.embed_tokens, target.lm_head))
        dtype, device = self._param.dtype, self._param.device
        ids = prefill.input_ids.to(device)  # (1, prompt)
        prompt = ids.shape[1]
        visual = torch.zeros(1, prompt, dtype=torch.bool, device=device)
        scores = torch.zeros(1, prompt, device=device)
        visual[0, prefill.visual_positions.to(device)] = True
        scores[0, prefill.visual_positions.to(device)] = prefill.visual_scores.to(device).float()
        last = prefill.last_hidden.to(device, dtype)  # (1, prompt, hidden)
        self._cache = self.steps.fresh_cache(target, self.spec)
        with self.draft.using(self.spec):
            layer = prefill.layer_hidden[self.spec.inject_layer].to(device, dtype)
            self._memory = self.steps.padded(self.draft.memory(layer, visual, scores))
            # the subnet's own sequence: the text and, in a draft that keeps visual tokens
            # there, the kept ones (the memory's)
            text = torch.nonzero(self.draft.draft_positions(visual, scores)[0],
                                 as_tuple=False).flatten()
            prev = torch.cat((torch.zeros_like(last[:, :1]), last[:, :-1]), dim=1)
            self.draft(ids[:, text], prev[:, text], text[None], self._memory, cache=self._cache)
        self._committed = int(text.numel())  # the host's count of the cache's true positions
        self._pos = prompt  # target position of the next chunk's first token
        self._pending_ids = ids[:, :0]
        self._pending_prev = last[:, :0]
        self._next_prev = last[:, -1:]  # H_{prompt-1}: the input feature of the first new token

    def row_state(self) -> DraftRow:
        """This request's state after `start`: its memory, cache and next input."""
        return DraftRow(self._memory, list(self._cache.keys), list(self._cache.values),
                        self._committed, self._pos, self._next_prev)

    def _true_positions(self, last_token: Tensor, extra: int) -> tuple[Tensor, Tensor, Tensor]:
        """The pending true inputs (ids, prev features) with `last_token` and the positions of
        this cycle: the true ones, then `extra` more for the drafted steps."""
        device = self._param.device
        ids = torch.cat((self._pending_ids, last_token.to(device).view(1, 1)), dim=1)
        prev = torch.cat((self._pending_prev, self._next_prev), dim=1)
        n = ids.shape[1]
        positions = torch.arange(self._pos, self._pos + n + extra, device=device)[None]
        return ids, prev, positions

    def _ancestor_mask(self, tree: TokenTree) -> Tensor:
        """bool (nodes+1, nodes+1): [i, j] when node j is node i or one of its ancestors."""
        mask = self._ancestors.get(tree.branching)
        if mask is None:
            mask = self._ancestors[tree.branching] = ancestor_mask(tree.parents).to(
                self._param.device)
        return mask

    @torch.inference_mode()
    def propose_tree(self, last_token: Tensor, tree: TokenTree, sampling: SamplingConfig,
                     generator: torch.Generator | None) -> TreeProposal:
        ids, prev, positions = self._true_positions(last_token, 0)
        ancestors = self._ancestor_mask(tree)
        levels: list[Tensor] = []
        probs: list[Tensor] = []
        with self.draft.using(self.spec):
            feats, logits = self.steps.first(self.draft, ids, prev, positions, self._memory,
                                             self._cache, self._committed, tree.draft_len + 1)
            feats = feats[0]  # (1, hidden): the root's; logits (1, vocab)
            self._committed += ids.shape[1]
            self._pos += ids.shape[1]
            for d, width in enumerate(tree.branching, start=1):
                if sampling.greedy:
                    # best first, ties toward the lower id (as argmax and the scorer's ranks)
                    children = logits.sort(dim=-1, descending=True,
                                           stable=True).indices[:, :width]
                else:
                    p = logits_to_probs(logits, sampling)
                    children = sample_without_replacement(p, width, generator)
                    probs.append(p)
                tokens = children.reshape(1, -1)  # parent-major, rank-minor: breadth first
                levels.append(tokens)
                if d == tree.draft_len:
                    break
                level = tree.nodes_at(d)
                pos = torch.full_like(tokens, self._pos - 1 + d)
                feats, logits = self.steps.run(
                    self.draft, tokens, feats.repeat_interleave(width, 0)[None], pos, self._memory,
                    self._cache, tree_mask=ancestors[level.start:level.stop, 1:level.stop])
                feats, logits = feats[0], logits[0]  # (nodes at level d, hidden / vocab)
        draft_probs = torch.cat(probs)[None] if probs else None
        return TreeProposal(tree, torch.cat(levels, dim=1), draft_probs)

    @torch.inference_mode()
    def propose(self, last_token: Tensor, draft_len: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:
        ids, prev, positions = self._true_positions(last_token, max(draft_len - 1, 0))
        n = ids.shape[1]
        # every position this cycle feeds was made on the device at once (no per-step host
        # copy): the n true ones, then one per drafted token but the last
        tokens: list[Tensor] = []
        probs: list[Tensor] = []
        with self.draft.using(self.spec):
            feature, logits = self.steps.first(
                self.draft, ids, prev, positions[:, :n], self._memory, self._cache,
                self._committed, draft_len + 1)  # (1, 1, hidden), (1, vocab)
            self._committed += n
            self._pos += n
            for i in range(draft_len):
                if sampling.greedy:
                    token = choose(logits, sampling, None)
                else:
                    p = logits_to_probs(logits, sampling)
                    token = sample(p, generator).view(1, 1)
                    probs.append(p)
                tokens.append(token)
                if i + 1 < draft_len:
                    feature, logits = self.steps.run(self.draft, token, feature,
                                                     positions[:, n + i:n + i + 1],
                                                     self._memory, self._cache, last=True)
        out = torch.cat(tokens, dim=1) if tokens else ids[:, :0]
        draft_probs = torch.stack(probs, dim=1) if probs else None  # (1, k, vocab)
        return Proposal(out, draft_probs)

    @torch.inference_mode()
    def update(self, accepted_tokens: Tensor, n_accepted: int, verify: VerifyOutput) -> None:
        device, dtype = self._param.device, self._param.dtype
        self._cache.crop(self._committed)
        hidden = verify.last_hidden.to(device, dtype)  # (1, n_accepted + 1, hidden)
        self._pending_ids = accepted_tokens[:, :n_accepted].to(device)
        self._pending_prev = hidden[:, :n_accepted]
        self._next_prev = hidden[:, n_accepted:n_accepted + 1]
