"""Trust but verify: measure the chosen subnets end to end against plain decoding.

A search ranks subnets by a *predicted* speedup (measured tau x predicted latencies). Before a
result is trusted, the best subnet and the top of the front are extracted (the deployable
compact draft) and decoded for real on the evaluation prompts, interleaved with plain
decoding of the same prompts on the same target, and the measured speedup is recorded next
to the prediction. A gap over `GAP_WARN` is reported with its likely cause.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dreams_nas.supernet.space import SubnetSpec

from .candidate import Candidate

GAP_WARN = 0.15


@dataclass(frozen=True)
class Measured:
    spec: SubnetSpec
    tau: float
    tokens_per_s: float
    baseline_tokens_per_s: float

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.baseline_tokens_per_s


def measure_end_to_end(target: Any, supernet: Any, specs: Sequence[SubnetSpec],
                       prompts: Sequence[Mapping[str, Any]], *, max_new_tokens: int = 64,
                       ) -> list[Measured]:
    """Tokens/s of each spec's extracted draft and of plain decoding, prompt by prompt."""
    from dreams_nas.supernet.decoding import generate, plain_generate
    from dreams_nas.supernet.dream_drafter import DreamDrafter
    from dreams_nas.supernet.extract import extract

    drafts = {spec: extract(supernet, spec) for spec in specs}
    first = dict(prompts[0])  # warm-up: first-call allocations are not decoding speed
    plain_generate(target, first, max_new_tokens=4)
    for spec, draft in drafts.items():
        generate(target, first, DreamDrafter(draft, spec), gamma=spec.draft_len, max_new_tokens=4)
    base_tokens, base_s = 0, 0.0
    tokens = dict.fromkeys(specs, 0)
    seconds = dict.fromkeys(specs, 0.0)
    cycles: dict[SubnetSpec, list[int]] = {s: [] for s in specs}
    for prompt in prompts:
        plain = plain_generate(target, dict(prompt), max_new_tokens=max_new_tokens)
        base_tokens += plain.stats.new_tokens
        base_s += plain.stats.total_s
        for spec, draft in drafts.items():
            out = generate(target, dict(prompt), DreamDrafter(draft, spec), gamma=spec.draft_len,
                           max_new_tokens=max_new_tokens)
            if out.tokens.tolist() != plain.tokens.tolist():
                raise RuntimeError(f"speculative output of {spec.id} differs from plain greedy "
                                   "decoding: the loop is not lossless here; please report it")
            tokens[spec] += out.stats.new_tokens
            seconds[spec] += out.stats.total_s
            cycles[spec] += list(out.stats.cycle_lengths)
    baseline = base_tokens / base_s
    return [Measured(spec=s, tau=sum(cycles[s]) / max(1, len(cycles[s])),
                     tokens_per_s=tokens[s] / seconds[s], baseline_tokens_per_s=baseline)
            for s in specs]


def gap_warning(predicted: Candidate, measured: Measured) -> str | None:
    """A one-line warning with the likely cause when prediction and measurement disagree."""
    gap = abs(measured.speedup - predicted.speedup) / predicted.speedup
    if gap <= GAP_WARN:
        return None
    tau_gap = abs(measured.tau - predicted.tau) / predicted.tau
    if tau_gap > 0.05:
        cause = (f"measured tau {measured.tau:.2f} vs scored {predicted.tau:.2f}: the verification "
                 "prompts or decoding settings differ from the scored ones")
    else:
        cause = ("tau agrees, so the gap is in the latencies: the latency predictor does not "
                 "match this machine now (profiled under other load, clocks or threads); re-run "
                 "`dreams-nas profile` on a quiet machine")
    return (f"{predicted.spec.id}: measured speedup {measured.speedup:.2f}x vs predicted "
            f"{predicted.speedup:.2f}x ({gap:.0%} apart); likely cause: {cause}")
