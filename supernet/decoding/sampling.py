"""Logit processing and the acceptance rules of speculative decoding, as pure tensor functions.

Names follow the tensors, not the papers: ``draft_probs`` come from the drafter, ``target_probs``
from the target (the papers' p/q swap meaning between codebases).

* `greedy_accept`: the longest prefix of the draft equal to the target's argmax, plus the
  target's own token at the first mismatch (or the bonus token after a full match);
  `greedy_accepted_length` is its device-side half (the loop brings it back with the tokens).
* `rejection_accept`: Chen et al. 2023 / Leviathan et al. 2023. Draft token x_i is kept with
  probability min(1, target_probs[i, x_i] / draft_probs[i, x_i]); at the first rejection a token
  is drawn from normalise(max(0, target_probs[i] - draft_probs[i])); when all are kept the bonus
  token is drawn from target_probs[k]. The output is distributed exactly as target_probs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from dreams_nas.supernet.core.errors import InputError
from torch import Tensor


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy; top_k 0 and top_p 1.0 mean off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise InputError(f"temperature={self.temperature} must be >= 0 (0 means greedy)")
        if self.top_k < 0:
            raise InputError(f"top_k={self.top_k} must be >= 0 (0 turns it off)")
        if not 0.0 < self.top_p <= 1.0:
            raise InputError(f"top_p={self.top_p} must be in (0, 1] (1.0 turns it off)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def logits_to_probs(logits: Tensor, sampling: SamplingConfig) -> Tensor:
    """(..., vocab) logits -> (..., vocab) float32 probabilities after temperature, top-k, top-p.

    Applied identically to draft and target logits. Greedy gives the one-hot of the argmax."""
    logits = logits.float()
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / sampling.temperature
    if sampling.top_k and sampling.top_k < logits.shape[-1]:
        kth = logits.topk(sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass strictly before it already reaches top_p (keeps at least one)
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= sampling.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """(..., vocab) -> (...) long, one draw per row."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def greedy_accepted_length(draft_tokens: Tensor, target_tokens: Tensor) -> Tensor:
    """draft_tokens (..., k), target_tokens (..., k+1) -> (...) long: how many leading drafts
    equal the target's tokens. Stays on the device (no host sync)."""
    k = draft_tokens.shape[-1]
    return (draft_tokens == target_tokens[..., :k]).long().cumprod(-1).sum(-1)


def greedy_accept(draft_tokens: Tensor, target_logits: Tensor) -> tuple[int, int]:
    """draft_tokens (k,), target_logits (k+1, vocab) -> (n_accepted, next token).

    One device->host copy brings both numbers back."""
    target_tokens = target_logits.argmax(-1)  # (k+1,)
    n = greedy_accepted_length(draft_tokens, target_tokens).view(1)
    n_accepted, token = torch.cat((n, target_tokens.gather(0, n))).tolist()
    return n_accepted, token


def rejection_accept(draft_tokens: Tensor, draft_probs: Tensor, target_probs: Tensor,
                     generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """Batched rejection rule.

    draft_tokens (B, k) drawn from draft_probs (B, k, vocab); target_probs (B, k+1, vocab).
    Returns (n_accepted (B,), next token (B,)): the first n_accepted drafts are kept and the next
    token is drawn from the residual at the first rejection, or from target_probs[:, k] (the
    bonus) when all k are kept. `generator` supplies every random draw."""
    batch, k = draft_tokens.shape
    rows = torch.arange(batch, device=draft_tokens.device)
    p_target = target_probs[:, :k].gather(-1, draft_tokens[..., None])[..., 0]  # (B, k)
    p_draft = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]  # (B, k)
    u = torch.rand(batch, k, generator=generator, device=draft_tokens.device)
    # u * p_draft < p_target  <=>  u < p_target / p_draft, without dividing by zero
    rejected = u * p_draft >= p_target  # (B, k)
    first = torch.cat([rejected, torch.ones(batch, 1, dtype=torch.bool, device=rejected.device)], 1)
    n = first.int().argmax(-1)  # (B,) index of the first rejection, k when none
    residual = (target_probs[:, :k] - draft_probs).clamp_min(0)  # (B, k, vocab)
    residual = torch.cat([residual, target_probs[:, k:]], dim=1)[rows, n]  # (B, vocab)
    total = residual.sum(-1, keepdim=True)
    # a zero residual only happens where draft == target, where rejection has probability 0
    residual = torch.where(total > 0, residual / total.clamp_min(1e-30), target_probs[rows, n])
    return n, sample(residual, generator)


def choose(logits: Tensor, sampling: SamplingConfig, generator: torch.Generator | None) -> Tensor:
    """(B, vocab) logits -> (B, 1) next tokens (argmax when greedy, else a draw per row)."""
    if sampling.greedy:
        return logits.argmax(-1, keepdim=True)
    return sample(logits_to_probs(logits, sampling), generator).view(-1, 1)
