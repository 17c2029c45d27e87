"""Speculative decoding over a `TargetAdapter`, and plain decoding through the same adapter.

    prefill -> repeat { draft γ, verify γ+1 positions in one target forward, accept, roll back }

Greedy (temperature 0) keeps the longest draft prefix equal to the target's argmax plus the
target's own next token, so the output is token for token the target's greedy output. With
sampling the rejection rule of `sampling.rejection_accept` keeps the output distributed exactly
as the target's. `plain_generate` is the target alone with its KV cache: the fair denominator.
Both return the tokens and `GenerationStats`; neither prints anything.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import NamedTuple

import torch
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.tree import TokenTree
from dreams_nas.supernet.decoding.protocol import Drafter, Proposal, supports_trees
from dreams_nas.supernet.decoding.sampling import (
    SamplingConfig,
    choose,
    greedy_accepted_length,
    logits_to_probs,
    rejection_accept,
)
from dreams_nas.supernet.decoding.tree_cycle import fitted_tree, tree_step
from dreams_nas.supernet.target.adapter import TargetAdapter, VerifyOutput
from torch import Tensor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationStats:
    """Counts and times of one call. The per-phase times (`prefill_s` .. `draft_prefill_s`) are
    measured only when the call is `timed=True`, and NaN otherwise; `total_s` always is."""

    new_tokens: int
    target_forwards: int  # prefill + one per verify (or decode) step
    cycle_lengths: tuple[int, ...]  # tokens kept per verify forward (accepted + 1, cut at EOS)
    proposed: tuple[int, ...]  # draft tokens (for a tree: levels) proposed in each cycle
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

    def accept_rates(self, draft_len: int) -> list[float | None]:
        """Per draft position i (1-based): accepted / proposed over the cycles that proposed it."""
        rates: list[float | None] = []
        for i in range(1, draft_len + 1):
            offered = [(n, p) for n, p in zip(self.cycle_lengths, self.proposed, strict=True)
                       if p >= i]
            rates.append(sum(n - 1 >= i for n, _ in offered) / len(offered) if offered else None)
        return rates

    def to_dict(self, draft_len: int | None = None) -> dict:
        phases = {"prefill_s": self.prefill_s, "draft_prefill_s": self.draft_prefill_s,
                  "draft_s": self.draft_s, "verify_s": self.verify_s, "other_s": self.other_s}
        out = {"new_tokens": self.new_tokens, "target_forwards": self.target_forwards,
               "tau": self.tau, "tokens_per_s": self.tokens_per_s,
               # untimed calls measure no phase: leave them out rather than write NaN
               **{k: v for k, v in phases.items() if v == v}, "total_s": self.total_s}
        if draft_len:
            out["accept_rates"] = self.accept_rates(draft_len)
        return out


@dataclass(frozen=True)
class GenerationResult:
    tokens: Tensor  # (n_new,) long, on CPU; ends at the first EOS if one was produced
    stats: GenerationStats


class _Clock:
    """Phase times for `GenerationStats`.

    Untimed (the default) a lap costs nothing and the device is synchronised once, in `stop`,
    for the whole call's wall time: production decoding never waits for the device to time
    itself. Timed, every lap synchronises first, so each phase owns the device work it queued;
    that is what speed measurements (`nas.stages.verify`, the benchmarks) ask for."""

    def __init__(self, device: torch.device, timed: bool) -> None:
        self.device, self.timed = device, timed
        self.totals: dict[str, float] = {}
        if timed:
            self._sync()  # work queued before the call is not the first phase's
        self._start = self._t = time.perf_counter()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def lap(self, name: str) -> None:
        if not self.timed:
            return
        self._sync()
        now = time.perf_counter()
        self.totals[name] = self.totals.get(name, 0.0) + now - self._t
        self._t = now

    def phase_seconds(self, drafted: bool) -> tuple[dict[str, float], float]:
        """`stop`, as the stats fields: {"prefill_s", "draft_prefill_s", "draft_s", "verify_s",
        "other_s"} (NaN when untimed; a phase plain decoding lacks is 0) and the whole call."""
        phases, total = self.stop()

        def t(name: str) -> float:
            if self.timed or (name == "draft_prefill" and not drafted):
                return phases.get(name, 0.0)
            return float("nan")

        names = ("prefill", "draft_prefill", "draft", "verify", "other")
        return {f"{name}_s": t(name) for name in names}, total

    def stop(self) -> tuple[dict[str, float], float]:
        """(seconds per phase, empty when untimed; the whole call's seconds)."""
        if self.timed:
            return dict(self.totals), sum(self.totals.values())
        self._sync()
        return {}, time.perf_counter() - self._start


def _check(draft_len: int, max_new_tokens: int) -> None:
    if draft_len < 1:
        raise InputError(f"draft_len {draft_len} must be >= 1; use plain decoding for no "
                         "drafting")
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens={max_new_tokens} must be >= 1")


def draft(drafter: Drafter, last_token: Tensor, draft_len: int, sampling: SamplingConfig,
          generator: torch.Generator | None) -> Proposal:
    if draft_len == 0:  # one token of budget left: a plain target step
        return Proposal(last_token.new_empty(1, 0))
    proposal = drafter.propose(last_token, draft_len, sampling, generator)
    if proposal.tokens.shape[1] > draft_len:
        raise RuntimeError(f"drafter proposed {proposal.tokens.shape[1]} tokens for "
                           f"draft_len={draft_len}")
    return proposal


class Accepted(NamedTuple):
    """What one verify keeps."""

    n: int  # draft tokens accepted
    tokens: Tensor  # (1, n + 1) the accepted drafts then the target's token, on the device
    ids: list[int]  # the same tokens on the host


def verify(target: TargetAdapter, last_token: Tensor, proposal: Proposal, sampling: SamplingConfig,
           generator: torch.Generator | None,
           layers: tuple[int, ...]) -> tuple[Accepted, VerifyOutput]:
    """One target forward over [last_token, drafts]; returns what is kept and the verify output
    of the committed positions. Rolls back the rejected positions.

    The accepted length and the kept tokens come to the host in one copy: at batch 1 the loop
    must learn the length to roll back, and that is the cycle's only wait for the device."""
    k = proposal.tokens.shape[1]
    out = target.verify(torch.cat([last_token, proposal.tokens.to(last_token.device)], dim=1),
                        layers)
    drafts = proposal.tokens[0].to(out.logits.device)  # (k,)
    if sampling.greedy:
        target_tokens = out.logits[0].argmax(-1)  # (k+1,); equals the drafts where they are kept
        n_t = greedy_accepted_length(drafts, target_tokens)
        n, *ids = torch.cat((n_t.view(1), target_tokens)).tolist()
        accepted = Accepted(n, target_tokens[None, :n + 1], ids[:n + 1])
    else:
        target_probs = logits_to_probs(out.logits[0], sampling)  # (k+1, vocab)
        if proposal.draft_probs is None:
            draft_probs = torch.nn.functional.one_hot(drafts, target_probs.shape[-1]).float()
        else:
            draft_probs = proposal.draft_probs[0].to(target_probs)
        n_t, token_t = rejection_accept(drafts[None], draft_probs[None], target_probs[None],
                                        generator)  # (1,), (1,)
        n, token, *draft_ids = torch.cat((n_t, token_t, drafts)).tolist()
        accepted = Accepted(n, torch.cat((drafts[:n], token_t))[None], draft_ids[:n] + [token])
    target.rollback(k - n)
    return accepted, out.head(n + 1)


def step(target: TargetAdapter, drafter: Drafter, last_token: Tensor, draft_len: int,
         sampling: SamplingConfig, generator: torch.Generator | None,
         clock: _Clock) -> tuple[Accepted, int]:
    """Draft, verify, accept, update the drafter: (what is kept, n proposed)."""
    proposal = draft(drafter, last_token, draft_len, sampling, generator)
    clock.lap("draft")
    accepted, out = verify(target, last_token, proposal, sampling, generator,
                           drafter.required_layers)
    clock.lap("verify")
    drafter.update(accepted.tokens, accepted.n, out)
    clock.lap("draft")
    return accepted, proposal.tokens.shape[1]


def cycle(target: TargetAdapter, drafter: Drafter, last_token: Tensor, draft_len: int,
          tree: TokenTree | None, sampling: SamplingConfig, generator: torch.Generator | None,
          clock: _Clock | None = None) -> tuple[Accepted, int, list[int], bool]:
    """One speculative cycle of `generate` drafting `draft_len` tokens (fewer than the run's
    when the token budget is nearly spent): a chain of `draft_len` drafts, or `tree` cut to
    `draft_len` levels; then the kept tokens cut at an EOS. Returns (what
    is kept, levels proposed, the new token ids, whether an EOS ended the answer).

    The latency profile times this very function (`dreams_nas.latency.measure.cycle`) for the
    per-cycle work outside the two models' forward passes. `clock`: None is untimed."""
    clock = clock if clock is not None else _Clock(target.device, False)
    if tree is not None and draft_len > 0:
        shape = fitted_tree(tree, draft_len)
        n, kept, ids = tree_step(target, drafter, last_token, shape, sampling, generator,
                                 clock.lap)
        accepted, k = Accepted(n, kept, ids), shape.draft_len
    else:
        accepted, k = step(target, drafter, last_token, draft_len, sampling, generator, clock)
    new, done = _truncate_at_eos(accepted.ids, target.eos_token_ids)
    return accepted, k, new, done


def _truncate_at_eos(tokens: list[int], eos: set[int]) -> tuple[list[int], bool]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], True
    return tokens, False


def tree_fallback(target: TargetAdapter, drafter: Drafter) -> str | None:
    """Why a tree cannot be drafted and verified here (None when it can)."""
    if not supports_trees(drafter):
        return f"{type(drafter).__name__} drafts chains only"
    if not getattr(target, "supports_trees", False):
        return getattr(target, "tree_note", None) or f"{target.family} verifies chains only"
    return None


@torch.inference_mode()
def generate(target: TargetAdapter, inputs: dict[str, Tensor], drafter: Drafter | None = None, *,
             shape: int | TokenTree = 5, max_new_tokens: int = 64,
             sampling: SamplingConfig = SamplingConfig(),
             generator: torch.Generator | None = None, timed: bool = False) -> GenerationResult:
    """Speculative decoding with `drafter` (plain decoding when it is None).

    shape: what each cycle drafts (`SubnetSpec.shape`): a chain of that many tokens (an int,
    the draft_len), or a token tree. Where the drafter or the target's family cannot do trees,
    the chain of the tree's draft_len is drafted and the reason logged once.
    timed: measure each phase (synchronising the device at every phase boundary); otherwise
    only the whole call is timed and the phase fields of the stats are NaN."""
    if drafter is None:
        return plain_generate(target, inputs, max_new_tokens=max_new_tokens, sampling=sampling,
                              generator=generator, timed=timed)
    tree = shape if isinstance(shape, TokenTree) else None
    draft_len = tree.draft_len if tree is not None else int(shape)
    if tree is not None:
        why = None if tree.is_chain else tree_fallback(target, drafter)
        if tree.is_chain or why:
            if why:
                log.warning("tree %s drafted as a chain of %d: %s", tree.label, draft_len, why)
            tree = None
    _check(draft_len, max_new_tokens)
    clock = _Clock(target.device, timed)
    width = tree.nodes + 1 if tree is not None else draft_len + 1  # the widest verify
    pre = target.prefill(inputs, layers=drafter.required_layers, reserve=max_new_tokens + width)
    last = choose(pre.logits, sampling, generator)
    clock.lap("prefill")
    drafter.start(target, pre)
    clock.lap("draft_prefill")
    tokens, done = _truncate_at_eos([int(last)], target.eos_token_ids)
    lengths: list[int] = []
    proposed: list[int] = []
    # static steps draft the whole shape to the end (a shorter one would be another shape to
    # compile) and keep what fits the budget; dynamic ones never draft past the budget
    whole = getattr(target, "static", None) is not None
    while not done and len(tokens) < max_new_tokens:
        left = max_new_tokens - len(tokens)
        this_len = draft_len if whole else min(draft_len, left - 1)
        accepted, k, new, done = cycle(target, drafter, last, this_len, tree, sampling, generator,
                                       clock)
        new = new[:left]
        tokens.extend(new)
        lengths.append(len(new))  # accepted + 1, less anything after an EOS
        proposed.append(k)
        last = accepted.tokens[:, -1:]
        clock.lap("other")
    return _result(tokens, lengths, proposed, clock, drafted=True)


@torch.inference_mode()
def plain_generate(target: TargetAdapter, inputs: dict[str, Tensor], *, max_new_tokens: int = 64,
                   sampling: SamplingConfig = SamplingConfig(),
                   generator: torch.Generator | None = None,
                   timed: bool = False) -> GenerationResult:
    """The target alone with its KV cache, one token per forward (`timed` as in `generate`)."""
    _check(1, max_new_tokens)
    clock = _Clock(target.device, timed)
    pre = target.prefill(inputs, reserve=max_new_tokens)
    last = choose(pre.logits, sampling, generator)
    tokens = [int(last)]
    clock.lap("prefill")
    eos = target.eos_token_ids
    while tokens[-1] not in eos and len(tokens) < max_new_tokens:
        logits = target.verify(last).logits[:, -1]
        last = choose(logits, sampling, generator)
        tokens.append(int(last))
    clock.lap("verify")
    return _result(tokens, [1] * (len(tokens) - 1), [0] * (len(tokens) - 1), clock,
                   drafted=False)


def _result(tokens: list[int], lengths: list[int], proposed: list[int], clock: _Clock,
            drafted: bool) -> GenerationResult:
    times, total = clock.phase_seconds(drafted)
    stats = GenerationStats(
        new_tokens=len(tokens), target_forwards=1 + len(lengths), cycle_lengths=tuple(lengths),
        proposed=tuple(proposed), total_s=total, **times)
    # the result is on the CPU whatever the default device
    return GenerationResult(torch.tensor(tokens, dtype=torch.long, device="cpu"), stats)
