"""Trust but verify: measure the chosen subnets end to end against plain decoding.

A search ranks subnets by a *predicted* speedup (measured tau x predicted latencies). Before a
result is trusted, the best subnet and the top of the front are extracted (the deployable
compact draft) and decoded for real on the evaluation prompts, interleaved with plain
decoding of the same prompts on the same target, and the measured speedup is recorded next
to the prediction. A gap over `GAP_WARN` is reported with its likely cause.

Two measured speedups are kept. `speedup` is the decode phase, the quantity the formula
tau * T_decode / ((gamma - 1) * T_draft + T_draft_first + T_verify) predicts: tokens after the
first over the time after the prefill, for both the speculative run and plain decoding. The
prefill phase is the prompt's processing: the target's prompt pass, and in the speculative run
also the drafter's (its KV cache and cross-attention memory over the prompt, once per request).
`speedup_end_to_end` is tokens over the whole call, prefill included: the prefill is the same
work for both, so it dilutes the ratio the more, the shorter the answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dreams_nas.nas.search.candidate import Candidate
from dreams_nas.supernet.core.space import SubnetSpec

GAP_WARN = 0.15


@dataclass(frozen=True)
class Measured:
    spec: SubnetSpec
    tau: float
    tokens_per_s: float  # whole calls, prefill included
    baseline_tokens_per_s: float
    decode_tokens_per_s: float = float("nan")  # tokens after the first / time after the prefill
    baseline_decode_tokens_per_s: float = float("nan")
    # Where the time went (ms), to explain a gap with the prediction:
    draft_ms: float = float("nan")  # per draft step (drafter's propose/update included)
    verify_ms: float = float("nan")  # per verify pass
    other_ms: float = float("nan")  # per cycle: the loop's own work (accept, EOS, bookkeeping)
    decode_ms: float = float("nan")  # per plain decoding step

    @property
    def speedup(self) -> float:
        """Decode phase (what the expected-speedup formula predicts); end to end when the
        decode-phase rates were not recorded."""
        if self.decode_tokens_per_s != self.decode_tokens_per_s:  # nan
            return self.speedup_end_to_end
        return self.decode_tokens_per_s / self.baseline_decode_tokens_per_s

    @property
    def speedup_end_to_end(self) -> float:
        """Whole calls, the prefill (the same for both) included."""
        return self.tokens_per_s / self.baseline_tokens_per_s


def measure_end_to_end(target: Any, supernet: Any, specs: Sequence[SubnetSpec],
                       prompts: Sequence[Mapping[str, Any]], *, max_new_tokens: int = 64,
                       ) -> list[Measured]:
    """Tokens/s of each spec's extracted draft and of plain decoding, prompt by prompt."""
    from dreams_nas.supernet.decoding.dream import DreamDrafter
    from dreams_nas.supernet.decoding.loop import generate, plain_generate
    from dreams_nas.supernet.draft.extract import extract

    drafts = {spec: extract(supernet, spec) for spec in specs}
    first = dict(prompts[0])  # warm-up: first-call allocations are not decoding speed
    plain_generate(target, first, max_new_tokens=4)
    for spec, draft in drafts.items():
        generate(target, first, DreamDrafter(draft, spec), gamma=spec.draft_len, max_new_tokens=4)
    base_tokens, base_s = 0, 0.0
    base_prefill_s = 0.0
    prefill_s = dict.fromkeys(specs, 0.0)
    decode_s, decode_steps = 0.0, 0
    tokens = dict.fromkeys(specs, 0)
    seconds = dict.fromkeys(specs, 0.0)
    parts = {s: {"draft": 0.0, "verify": 0.0, "other": 0.0, "steps": 0} for s in specs}
    cycles: dict[SubnetSpec, list[int]] = {s: [] for s in specs}
    for prompt in prompts:
        plain = plain_generate(target, dict(prompt), max_new_tokens=max_new_tokens, timed=True)
        base_tokens += plain.stats.new_tokens
        base_s += plain.stats.total_s
        base_prefill_s += plain.stats.prefill_s
        decode_s += plain.stats.verify_s
        decode_steps += max(0, plain.stats.new_tokens - 1)
        for spec, draft in drafts.items():
            out = generate(target, dict(prompt), DreamDrafter(draft, spec), gamma=spec.draft_len,
                           max_new_tokens=max_new_tokens, timed=True)
            if out.tokens.tolist() != plain.tokens.tolist():
                raise RuntimeError(f"speculative output of {spec.id} differs from plain greedy "
                                   "decoding: the loop is not lossless here; please report it")
            tokens[spec] += out.stats.new_tokens
            seconds[spec] += out.stats.total_s
            prefill_s[spec] += out.stats.prefill_s + out.stats.draft_prefill_s
            cycles[spec] += list(out.stats.cycle_lengths)
            part = parts[spec]
            part["draft"] += out.stats.draft_s
            part["verify"] += out.stats.verify_s
            part["other"] += out.stats.other_s
            part["steps"] += sum(out.stats.proposed)
    baseline = base_tokens / base_s
    n = len(prompts)  # the first token of each prompt comes from the prefill
    baseline_decode = (base_tokens - n) / (base_s - base_prefill_s)
    out_rows = []
    for s in specs:
        n_cycles = max(1, len(cycles[s]))
        part = parts[s]
        out_rows.append(Measured(
            spec=s, tau=sum(cycles[s]) / n_cycles, tokens_per_s=tokens[s] / seconds[s],
            baseline_tokens_per_s=baseline,
            decode_tokens_per_s=(tokens[s] - n) / (seconds[s] - prefill_s[s]),
            baseline_decode_tokens_per_s=baseline_decode,
            draft_ms=1000 * part["draft"] / max(1, part["steps"]),
            verify_ms=1000 * part["verify"] / n_cycles,
            other_ms=1000 * part["other"] / n_cycles,
            decode_ms=1000 * decode_s / max(1, decode_steps)))
    return out_rows


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
        cause = _latency_cause(predicted, measured)
    return (f"{predicted.spec.id}: measured speedup {measured.speedup:.2f}x vs predicted "
            f"{predicted.speedup:.2f}x ({gap:.0%} apart); likely cause: {cause}")


def _latency_cause(p: Candidate, m: Measured) -> str:
    """tau agrees, so the time per cycle or per plain step differs: name the biggest part."""
    gamma = p.spec.draft_len
    if not all(map(lambda x: x == x, (m.draft_ms, m.verify_ms, m.other_ms, m.decode_ms))):
        return ("tau agrees, so the gap is in the latencies: the latency predictor does not "
                "match this machine now (profiled under other load, clocks or threads); re-run "
                "`dreams-nas profile` on a quiet machine")
    cycle = p.cycle_draft_ms + p.verify_ms
    step_ms = p.cycle_draft_ms / gamma  # predicted mean step: the first (after the verify) + hot
    effects = {  # relative change of the speedup each part explains
        "draft": gamma * (m.draft_ms - step_ms) / cycle,
        "verify": (m.verify_ms - p.verify_ms) / cycle,
        "overhead": m.other_ms / cycle,
        "decode": (p.decode_ms - m.decode_ms) / p.decode_ms,
    }
    worst = max(effects, key=lambda k: abs(effects[k]))
    if worst == "overhead":
        return (f"the speculative loop's own work ({m.other_ms:.2f} ms per cycle: acceptance, "
                "bookkeeping, Python) is not in the speedup formula; it weighs when a target "
                f"step is as short as {m.decode_ms:.2f} ms")
    names = {"draft": ("a draft step (mean over the cycle, the first one after the verify "
                       "included)", m.draft_ms, step_ms),
             "verify": ("a verify pass", m.verify_ms, p.verify_ms),
             "decode": ("a plain decoding step", m.decode_ms, p.decode_ms)}
    what, got, want = names[worst]
    return (f"{what} took {got:.2f} ms here vs {want:.2f} ms predicted: the latency profile does "
            "not match this machine now (other load, clocks or threads); re-run "
            "`dreams-nas profile` on a quiet machine")
