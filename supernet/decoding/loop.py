"""Speculative decoding over a `TargetAdapter`, and plain decoding through the same adapter.

    prefill -> repeat { draft γ, verify γ+1 positions in one target forward, accept, roll back }

Greedy (temperature 0) keeps the longest draft prefix equal to the target's argmax plus the
target's own next token, so the output is token for token the target's greedy output. With
sampling the rejection rule of `sampling.rejection_accept` keeps the output distributed exactly
as the target's. `plain_generate` is the target alone with its KV cache: the fair denominator.
Both return the tokens and `GenerationStats`; neither prints anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.decoding.protocol import Drafter, Proposal
from dreams_nas.supernet.decoding.sampling import (
    SamplingConfig,
    choose,
    greedy_accept,
    logits_to_probs,
    rejection_accept,
)
from dreams_nas.supernet.target.adapter import TargetAdapter, VerifyOutput
from torch import Tensor


@dataclass(frozen=True)
class GenerationStats:
    new_tokens: int
    target_forwards: int  # prefill + one per verify (or decode) step
    cycle_lengths: tuple[int, ...]  # tokens kept per verify forward (accepted + 1, cut at EOS)
    proposed: tuple[int, ...]  # draft tokens proposed in each cycle
    prefill_s: float  # the target's prompt pass
    draft_s: float  # the drafter's proposals and updates, every cycle
    verify_s: float
    other_s: float
    total_s: float
    # The drafter's own pass over the prompt (its KV cache and cross-attention memory), once per
    # request like the target's prefill: part of the prefill phase, not of any cycle.
    draft_prefill_s: float = 0.0

    @property
    def decode_s(self) -> float:
        """The decode phase: everything after both models have read the prompt."""
        return self.total_s - self.prefill_s - self.draft_prefill_s

    @property
    def tau(self) -> float:
        """Mean tokens per verify forward, bonus included; plain decoding scores 1.0."""
        return sum(self.cycle_lengths) / len(self.cycle_lengths) if self.cycle_lengths else 1.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s > 0 else float("nan")

    def accept_rates(self, gamma: int) -> list[float | None]:
        """Per draft position i (1-based): accepted / proposed over the cycles that proposed it."""
        rates: list[float | None] = []
        for i in range(1, gamma + 1):
            offered = [(n, p) for n, p in zip(self.cycle_lengths, self.proposed, strict=True)
                       if p >= i]
            rates.append(sum(n - 1 >= i for n, _ in offered) / len(offered) if offered else None)
        return rates

    def to_dict(self, gamma: int | None = None) -> dict:
        out = {"new_tokens": self.new_tokens, "target_forwards": self.target_forwards,
               "tau": self.tau, "tokens_per_s": self.tokens_per_s, "prefill_s": self.prefill_s,
               "draft_prefill_s": self.draft_prefill_s,
               "draft_s": self.draft_s, "verify_s": self.verify_s, "other_s": self.other_s,
               "total_s": self.total_s}
        if gamma:
            out["accept_rates"] = self.accept_rates(gamma)
        return out


@dataclass(frozen=True)
class GenerationResult:
    tokens: Tensor  # (n_new,) long, on CPU; ends at the first EOS if one was produced
    stats: GenerationStats


@dataclass
class _Clock:
    device: torch.device
    totals: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._t = self._now()

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def lap(self, name: str) -> None:
        now = self._now()
        self.totals[name] = self.totals.get(name, 0.0) + now - self._t
        self._t = now


def _check(gamma: int, max_new_tokens: int) -> None:
    if gamma < 1:
        raise InputError(f"draft length {gamma} must be >= 1; use plain decoding for no drafting")
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens={max_new_tokens} must be >= 1")


def draft(drafter: Drafter, last_token: Tensor, gamma: int, sampling: SamplingConfig,
          generator: torch.Generator | None) -> Proposal:
    if gamma == 0:  # one token of budget left: a plain target step
        return Proposal(last_token.new_empty(1, 0))
    proposal = drafter.propose(last_token, gamma, sampling, generator)
    if proposal.tokens.shape[1] > gamma:
        raise RuntimeError(f"drafter proposed {proposal.tokens.shape[1]} tokens for gamma={gamma}")
    return proposal


def verify(target: TargetAdapter, last_token: Tensor, proposal: Proposal, sampling: SamplingConfig,
           generator: torch.Generator | None,
           layers: tuple[int, ...]) -> tuple[int, Tensor, VerifyOutput]:
    """One target forward over [last_token, drafts]; returns (n_accepted, next token (1, 1),
    the verify output of the committed positions). Rolls back the rejected positions."""
    k = proposal.tokens.shape[1]
    out = target.verify(torch.cat([last_token, proposal.tokens.to(last_token.device)], dim=1),
                        layers)
    drafts = proposal.tokens[0].to(out.logits.device)
    if sampling.greedy:
        n, token = greedy_accept(drafts, out.logits[0])
    else:
        target_probs = logits_to_probs(out.logits[0], sampling)  # (k+1, vocab)
        if proposal.draft_probs is None:
            draft_probs = torch.nn.functional.one_hot(drafts, target_probs.shape[-1]).float()
        else:
            draft_probs = proposal.draft_probs[0].to(target_probs)
        n_t, token_t = rejection_accept(drafts[None], draft_probs[None], target_probs[None],
                                        generator)
        n, token = int(n_t[0]), int(token_t[0])
    target.rollback(k - n)
    return n, torch.tensor([[token]], device=last_token.device), out.head(n + 1)


def step(target: TargetAdapter, drafter: Drafter, last_token: Tensor, gamma: int,
         sampling: SamplingConfig, generator: torch.Generator | None,
         clock: _Clock) -> tuple[Tensor, int, int]:
    """Draft, verify, accept, update the drafter: (new tokens (1, n+1), n accepted, n proposed)."""
    proposal = draft(drafter, last_token, gamma, sampling, generator)
    clock.lap("draft")
    n, token, out = verify(target, last_token, proposal, sampling, generator,
                           drafter.required_layers)
    clock.lap("verify")
    accepted = torch.cat([proposal.tokens[:, :n].to(token.device), token], dim=1)
    drafter.update(accepted, n, out)
    clock.lap("draft")
    return accepted, n, proposal.tokens.shape[1]


def _truncate_at_eos(tokens: list[int], eos: set[int]) -> tuple[list[int], bool]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], True
    return tokens, False


@torch.inference_mode()
def generate(target: TargetAdapter, inputs: dict[str, Tensor], drafter: Drafter | None = None, *,
             gamma: int = 5, max_new_tokens: int = 64, sampling: SamplingConfig = SamplingConfig(),
             generator: torch.Generator | None = None) -> GenerationResult:
    """Speculative decoding with `drafter` (plain decoding when it is None)."""
    if drafter is None:
        return plain_generate(target, inputs, max_new_tokens=max_new_tokens, sampling=sampling,
                              generator=generator)
    _check(gamma, max_new_tokens)
    clock = _Clock(target.device)
    pre = target.prefill(inputs, layers=drafter.required_layers)
    last = choose(pre.logits, sampling, generator)
    clock.lap("prefill")
    drafter.start(target, pre)
    clock.lap("draft_prefill")
    tokens, done = _truncate_at_eos([int(last)], target.eos_token_ids)
    lengths: list[int] = []
    proposed: list[int] = []
    while not done and len(tokens) < max_new_tokens:
        room = min(gamma, max_new_tokens - len(tokens) - 1)  # never produce past the budget
        accepted, n, k = step(target, drafter, last, room, sampling, generator, clock)
        new, done = _truncate_at_eos(accepted[0].tolist(), target.eos_token_ids)
        tokens.extend(new)
        lengths.append(len(new))  # accepted + 1, less anything after an EOS
        proposed.append(k)
        last = accepted[:, -1:]
        clock.lap("other")
    return _result(tokens, lengths, proposed, clock)


@torch.inference_mode()
def plain_generate(target: TargetAdapter, inputs: dict[str, Tensor], *, max_new_tokens: int = 64,
                   sampling: SamplingConfig = SamplingConfig(),
                   generator: torch.Generator | None = None) -> GenerationResult:
    """The target alone with its KV cache, one token per forward."""
    _check(1, max_new_tokens)
    clock = _Clock(target.device)
    pre = target.prefill(inputs)
    last = choose(pre.logits, sampling, generator)
    tokens = [int(last)]
    clock.lap("prefill")
    eos = target.eos_token_ids
    while tokens[-1] not in eos and len(tokens) < max_new_tokens:
        logits = target.verify(last).logits[:, -1]
        last = choose(logits, sampling, generator)
        tokens.append(int(last))
    clock.lap("verify")
    return _result(tokens, [1] * (len(tokens) - 1), [0] * (len(tokens) - 1), clock)


def _result(tokens: list[int], lengths: list[int], proposed: list[int],
            clock: _Clock) -> GenerationResult:
    t = clock.totals
    stats = GenerationStats(
        new_tokens=len(tokens), target_forwards=1 + len(lengths), cycle_lengths=tuple(lengths),
        proposed=tuple(proposed), prefill_s=t.get("prefill", 0.0), draft_s=t.get("draft", 0.0),
        verify_s=t.get("verify", 0.0), other_s=t.get("other", 0.0), total_s=sum(t.values()),
        draft_prefill_s=t.get("draft_prefill", 0.0),
    )
    return GenerationResult(torch.tensor(tokens, dtype=torch.long), stats)
