"""Several requests at once: batched speculative decoding whose rows advance on their own, and
plain batched decoding through the same rows (its fair denominator).

    prefill each request alone -> repeat { draft a chain (or a token tree) per row, verify
    every row's positions in one batched forward, each row keeps its own accepted prefix }

Each row keeps what the batch-1 rules keep (`loop`: greedy's longest matching prefix plus the
target's token, or the rejection rule with sampling), so every row's output is the target's:
at temperature 0 token for token what plain batched decoding of the same batch gives (each
row's arithmetic is its batch-1 arithmetic up to the order of sums in batched products:
`supernet.target.rows`). A row that ends (EOS or its token budget) keeps nothing more; the
rows that go on are gathered into a smaller batch as soon as they fit one (exactly the rows
left, or with compiled steps the next power of two: a compiled shape per batch size, few of
them), so a finished row stops costing. One host copy a cycle brings every row's accepted
length and tokens back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.tree import TokenTree
from dreams_nas.supernet.decoding.loop import _Clock, _truncate_at_eos, tree_fallback
from dreams_nas.supernet.decoding.sampling import (
    SamplingConfig,
    choose,
    greedy_accepted_length,
    logits_to_probs,
    rejection_accept,
)
from dreams_nas.supernet.target.adapter import TargetAdapter
from dreams_nas.supernet.target.rows import RowSteps
from torch import Tensor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchStats:
    """Counts and times of one batched call (phase times as `loop.GenerationStats`: NaN
    unless `timed`)."""

    batch: int
    new_tokens: int  # every row's
    steps: tuple[int, ...]  # the rows of each batched target forward after the prefills
    cycle_lengths: tuple[int, ...]  # tokens kept per row per verify, every row's cycles
    prefill_s: float
    draft_prefill_s: float
    draft_s: float
    verify_s: float
    other_s: float
    total_s: float

    @property
    def decode_s(self) -> float:
        return self.total_s - self.prefill_s - self.draft_prefill_s

    @property
    def tau(self) -> float:
        """Mean tokens a row keeps per verify, bonus included (1.0 for plain decoding)."""
        n = len(self.cycle_lengths)
        return sum(self.cycle_lengths) / n if n else 1.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        phases = {"prefill_s": self.prefill_s, "draft_prefill_s": self.draft_prefill_s,
                  "draft_s": self.draft_s, "verify_s": self.verify_s, "other_s": self.other_s}
        return {"batch": self.batch, "new_tokens": self.new_tokens,
                "target_steps": len(self.steps), "tau": self.tau,
                "tokens_per_s": self.tokens_per_s,
                **{k: v for k, v in phases.items() if v == v}, "total_s": self.total_s}


@dataclass(frozen=True)
class BatchResult:
    tokens: list[Tensor]  # per request, in input order: (n_new,) long on the CPU
    stats: BatchStats


def _accept(drafts: Tensor, draft_probs: Tensor | None, logits: Tensor,
            sampling: SamplingConfig, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """(n (B,), kept (B, k + 1)): row b keeps kept[b, :n[b] + 1], its first n[b] drafts then
    the target's token, by the batch-1 rules."""
    if sampling.greedy:
        target = logits.argmax(-1)  # (B, k+1); equals the drafts where they are kept
        return greedy_accepted_length(drafts, target), target
    probs = logits_to_probs(logits, sampling)
    if draft_probs is None:
        draft_probs = torch.nn.functional.one_hot(drafts, probs.shape[-1]).float()
    n, token = rejection_accept(drafts, draft_probs.to(probs), probs, generator)
    kept = torch.cat((drafts, drafts[:, :1]), dim=1).scatter(1, n[:, None], token[:, None])
    return n, kept


def _bucket(n: int, compiled: bool) -> int:
    """The batch the rows left go on at: n, or compiled the next power of two."""
    return 1 << (n - 1).bit_length() if compiled else n


class _Rows:
    """The host's view of the batch: which request each row holds and what each has made."""

    def __init__(self, firsts: list[int], max_new: int, eos: set[int]) -> None:
        self.order = list(range(len(firsts)))
        self.out: list[list[int]] = []
        self.done: list[bool] = []
        self.max_new, self.eos = max_new, eos
        self.cycles: list[int] = []
        self._alive: tuple[tuple[bool, ...], Tensor] | None = None
        for token in firsts:
            kept, ended = _truncate_at_eos([token], eos)
            self.out.append(kept)
            self.done.append(ended or max_new <= 1)

    def take(self, counts: list[int], kept: list[list[int]]) -> None:
        for row, request in enumerate(self.order):
            if self.done[request]:
                continue
            new, ended = _truncate_at_eos(kept[row][:counts[row] + 1], self.eos)
            new = new[:self.max_new - len(self.out[request])]
            self.out[request].extend(new)
            self.cycles.append(len(new))
            self.done[request] = ended or len(self.out[request]) >= self.max_new

    def live(self) -> list[int]:
        return [row for row, request in enumerate(self.order) if not self.done[request]]

    def alive(self, device: torch.device) -> Tensor:
        """Which rows still decode, on the device: made again only when that changed."""
        flags = tuple(not self.done[r] for r in self.order)
        if self._alive is None or self._alive[0] != flags:
            self._alive = (flags, torch.tensor(flags, device=device))
        return self._alive[1]


@torch.inference_mode()
def generate_batch(target: TargetAdapter, requests: list[dict[str, Tensor]],
                   drafter: Any | None = None, *, shape: int | TokenTree = 5,
                   max_new_tokens: int = 64, sampling: SamplingConfig = SamplingConfig(),
                   generator: torch.Generator | None = None, timed: bool = False) -> BatchResult:
    """Speculative decoding of `requests` (each `TargetAdapter.build_inputs`' dict) as one
    batch with `drafter` (a `batch_dream.BatchDreamDrafter`; None: plain batched decoding),
    each cycle drafting `shape`: a chain of that many tokens, or a token tree (a chain of its
    draft_len where the target's family verifies no tree). The target's step mode
    (`use_steps`) picks eager or compiled row steps; `timed` as in `loop.generate`."""
    if not requests:
        raise InputError("no requests to decode; give at least one")
    tree = shape if isinstance(shape, TokenTree) and not shape.is_chain else None
    draft_len = shape.draft_len if isinstance(shape, TokenTree) else int(shape)
    if tree is not None and drafter is not None:
        why = tree_fallback(target, drafter)
        if why:
            log.warning("tree %s drafted as a chain of %d: %s", tree.label, draft_len, why)
            tree = None
    if max_new_tokens < 1 or (drafter is not None and draft_len < 1):
        raise InputError(f"max_new_tokens {max_new_tokens} and draft_len {draft_len} must "
                         "be >= 1")
    clock = _Clock(target.device, timed)
    rows = RowSteps.of(target)
    width = (tree.nodes + 1 if tree is not None else draft_len + 1) if drafter is not None else 1
    positions = max(int(r["input_ids"].shape[-1]) for r in requests) + max_new_tokens + width
    rows.start(len(requests), positions)
    if drafter is not None:
        drafter.start(len(requests), positions)
    firsts = []
    layers = drafter.required_layers if drafter is not None else ()
    for b, inputs in enumerate(requests):
        pre = target.prefill(inputs, layers=layers)
        rows.admit(b, target, pre)
        firsts.append(choose(pre.logits, sampling, generator))
        clock.lap("prefill")
        if drafter is not None:
            drafter.admit(b, target, pre)
            clock.lap("draft_prefill")
    last = torch.cat(firsts)  # (B, 1)
    book = _Rows(last.view(-1).tolist(), max_new_tokens, target.eos_token_ids)
    steps: list[int] = []
    last = _shrink(book, rows, drafter, last)
    while last is not None:
        n, kept, table = batch_cycle(rows, drafter, last, tree or draft_len, sampling,
                                     generator, book.alive(last.device), clock)
        steps.append(len(table))
        book.take([row[0] for row in table], [row[1:] for row in table])
        last = kept.gather(1, n.clamp(min=0)[:, None])
        last = _shrink(book, rows, drafter, last)
        clock.lap("other")
    return _result(book, steps, clock, drafted=drafter is not None)


def batch_cycle(rows: RowSteps, drafter: Any | None, last: Tensor, shape: int | TokenTree,
                sampling: SamplingConfig, generator: torch.Generator | None, alive: Tensor,
                clock: _Clock | None = None) -> tuple[Tensor, Tensor, list[list[int]]]:
    """One cycle of every row: draft `shape` (a chain of that many tokens, or a token tree:
    `batch_tree.batch_tree_cycle`) after each row's `last` (B, 1) token (plain decoding:
    none), verify in one batched forward, keep each row's accepted prefix (rows where `alive`
    is False keep nothing), update the drafter. Returns (n (B,), kept (B, k + 1), on the host
    [n, kept...] per row: the cycle's one copy). The latency profile times this very function
    at batch B (`latency.measure.batch_steps`)."""
    lap = clock.lap if clock is not None else (lambda name: None)
    if isinstance(shape, TokenTree):
        from dreams_nas.supernet.decoding.batch_tree import batch_tree_cycle

        return batch_tree_cycle(rows, drafter, last, shape, sampling, generator, alive, lap)
    if drafter is not None:
        proposal = drafter.propose(last, shape, sampling, generator)
        lap("draft")
        drafts = proposal.tokens.to(last.device)
        logits, hidden = rows.chain(torch.cat((last, drafts), dim=1))
        n, kept = _accept(drafts, proposal.draft_probs, logits, sampling, generator)
    else:
        logits, hidden = rows.chain(last)
        kept = choose(logits[:, 0], sampling, generator)
        n = torch.zeros_like(kept[:, 0])
    n = torch.where(alive, n, -1)
    table = torch.cat((n[:, None], kept), dim=1).tolist()  # the cycle's one wait
    rows.keep(n, kept.shape[1], [row[0] for row in table])
    lap("verify")
    if drafter is not None:
        drafter.update(kept, n, hidden)
        lap("draft")
    return n, kept, table


def _shrink(book: _Rows, rows: RowSteps, drafter: Any | None, last: Tensor) -> Tensor | None:
    """Drop finished rows once the rows left fit a smaller batch; None when none is left."""
    live = book.live()
    if not live:
        return None
    size = _bucket(len(live), rows.compiled)
    if size >= len(book.order):
        return last
    dead = [row for row in range(len(book.order)) if row not in live]
    chosen = live + dead[:size - len(live)]
    rows.select(chosen)
    if drafter is not None:
        drafter.select(chosen)
    book.order = [book.order[row] for row in chosen]
    return last[torch.tensor(chosen, device=last.device)]


def _result(book: _Rows, steps: list[int], clock: _Clock, drafted: bool) -> BatchResult:
    times, total = clock.phase_seconds(drafted)
    stats = BatchStats(
        batch=len(book.out), new_tokens=sum(len(o) for o in book.out), steps=tuple(steps),
        cycle_lengths=tuple(book.cycles), total_s=total, **times)
    tokens = [torch.tensor(o, dtype=torch.long, device="cpu") for o in book.out]
    return BatchResult(tokens, stats)
