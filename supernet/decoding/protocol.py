"""The drafter protocol: what the speculative loop asks of every drafter.

A drafter guesses the next tokens; the loop (`decoding.loop`) verifies them with the target. The
protocol (in the spirit of transformers' ``CandidateGenerator``) has three calls per sequence:

``start(target, prefill)``
    once, after the target's prefill. ``prefill`` is the `PrefillOutput` (input ids, last hidden
    states, ``layer_hidden`` for every layer in ``required_layers``, visual positions and
    scores). The target's cache then holds the prompt; the first generated token is not in it.
``propose(last_token, draft_len, sampling, generator) -> Proposal``
    up to ``draft_len`` tokens that follow ``last_token`` (1, 1): the newest generated token, which
    the target has not yet consumed. ``Proposal.draft_probs`` (1, k, vocab) are the draft's
    probabilities *after* `sampling` was applied (``logits_to_probs``); ``None`` means a
    deterministic drafter (treated as one-hot, which keeps the rejection rule exact). Fewer than
    ``draft_len`` tokens, even zero, is allowed. A drafter must not touch the target's cache.
``update(accepted_tokens, n_accepted, verify)``
    after each verification. ``accepted_tokens`` (1, n_accepted + 1) are the accepted draft tokens
    followed by the target's own next token (it becomes the next ``last_token``).
    ``verify`` is the `VerifyOutput` of exactly the positions now committed to the target's
    cache: ``last_token`` and the n accepted draft tokens (n + 1 positions), with
    ``last_hidden`` and ``layer_hidden`` for ``required_layers``.

``propose_tree(last_token, tree, sampling, generator) -> TreeProposal`` (optional)
    a token tree (`supernet.core.tree.TokenTree`) that follows ``last_token``: the tree's
    nodes 1..N in breadth-first order, each node's children ranked best first. Drafters
    without it draft chains only; the loop then falls back to the chain of the tree's draft_len.

``required_layers`` (a tuple of HF hidden-state indices) tells the loop which target layers the
adapter must capture at prefill and at every verify. An optional ``default_draft_len`` attribute (a
spec's ``draft_len``) is the draft length `dreams-nas generate` uses
when none is given. `registry.load_drafter` finds a drafter by name or spec folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from dreams_nas.supernet.core.tree import TokenTree
from dreams_nas.supernet.decoding.sampling import SamplingConfig
from torch import Tensor

if TYPE_CHECKING:
    from dreams_nas.supernet.target.adapter import PrefillOutput, TargetAdapter, VerifyOutput


@dataclass(frozen=True)
class Proposal:
    tokens: Tensor  # (1, k) long, k <= draft_len (may be 0)
    # (1, k, vocab) after sampling processing; None = deterministic
    draft_probs: Tensor | None = None


@dataclass(frozen=True)
class TreeProposal:
    tree: TokenTree
    tokens: Tensor  # (1, tree.nodes) long: nodes 1..N, breadth first
    # (1, m, vocab): at node i < m, the draft distribution (after sampling processing) its
    # children were drawn from without replacement; None = children chosen deterministically
    draft_probs: Tensor | None = None


def supports_trees(drafter: object) -> bool:
    """Whether `drafter` can draft token trees (has `propose_tree`)."""
    return callable(getattr(drafter, "propose_tree", None))


@runtime_checkable
class Drafter(Protocol):
    required_layers: tuple[int, ...]

    def start(self, target: TargetAdapter, prefill: PrefillOutput) -> None: ...

    def propose(self, last_token: Tensor, draft_len: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal: ...

    def update(self, accepted_tokens: Tensor, n_accepted: int, verify: VerifyOutput) -> None: ...
