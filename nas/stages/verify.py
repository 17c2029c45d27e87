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

Lossless is checked on every prompt. In float32 the speculative output must equal plain greedy
decoding token for token; a difference is a bug. In bfloat16/float16 a verify over gamma + 1
positions and a one-token decode run different kernels, so where the target's top two logits
are nearly tied the two can pick different tokens: that is the target's own numerics. There the
first divergence of each prompt is recorded with the target's top-2 logit margin at it, and only
a divergence at a margin above `near_tie_tolerance` (a few units in the last place of the
logit's magnitude in that dtype) is an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dreams_nas.nas.search.candidate import Candidate
from dreams_nas.supernet.core.space import SubnetSpec

GAP_WARN = 0.15
# A divergence is a near tie when the target's top-2 logit margin there is at most this many
# units in the last place of the top logit in the run's dtype.
NEAR_TIE_ULPS = 8
_EPS = {"bfloat16": 2.0**-7, "float16": 2.0**-10}  # unit roundoff of the 16-bit dtypes


@dataclass(frozen=True)
class Divergence:
    """Where a prompt's speculative output first left plain greedy decoding."""

    spec_id: str
    prompt: int
    position: int  # index of the first differing generated token
    margin: float  # the target's top-1 minus top-2 logit there (plain decoding's context)
    tolerance: float


def near_tie_tolerance(dtype: str, top_logit: float) -> float:
    """The largest top-2 margin a divergence may have in `dtype` (0 in float32: none may)."""
    eps = _EPS.get(dtype)
    return 0.0 if eps is None else NEAR_TIE_ULPS * eps * max(1.0, abs(top_logit))


def first_divergence(spec_tokens: Sequence[int], plain_tokens: Sequence[int]) -> int | None:
    """Index of the first generated token where the two outputs differ (None: identical)."""
    for i, (a, b) in enumerate(zip(spec_tokens, plain_tokens, strict=False)):
        if a != b:
            return i
    return None if len(spec_tokens) == len(plain_tokens) else min(len(spec_tokens),
                                                                  len(plain_tokens))


def _top2(target: Any, prompt: Mapping[str, Any], prefix: Sequence[int]) -> tuple[float, float]:
    """The target's top logit and top-2 margin after `prompt` + `prefix` (one prefill)."""
    import torch

    inputs = dict(prompt)
    if prefix:
        tokens = torch.tensor([list(prefix)], dtype=torch.long, device="cpu")
        inputs = target.extend_inputs(inputs, tokens)
    logits = target.prefill(inputs).logits.reshape(-1, target.vocab_size)[-1].float()
    top = torch.topk(logits, 2).values.tolist()
    return float(top[0]), float(top[0] - top[1])


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
    prompts: int = 0  # prompts decoded
    identical_prompts: int = 0  # of them, those whose output equals plain greedy decoding
    divergences: tuple[Divergence, ...] = ()  # the others: near ties of a 16-bit target

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
                       show_progress: bool | None = None) -> list[Measured]:
    """Tokens/s of each spec's extracted draft and of plain decoding, prompt by prompt.
    `show_progress`: a bar over the prompts on stderr (None: when stderr is a terminal; the
    verification decodes every prompt 1 + len(specs) times, minutes on a CPU)."""
    from dreams_nas.supernet.core.progress import progress
    from dreams_nas.supernet.decoding.dream import DreamDrafter
    from dreams_nas.supernet.decoding.loop import generate, plain_generate
    from dreams_nas.supernet.draft.extract import extract

    drafts = {spec: extract(supernet, spec) for spec in specs}
    first = dict(prompts[0])  # warm-up: first-call allocations are not decoding speed
    plain_generate(target, first, max_new_tokens=4)
    for spec, draft in drafts.items():
        generate(target, first, DreamDrafter(draft, spec), gamma=spec.draft_len, max_new_tokens=4,
                 tree=spec.shape)
    base_tokens, base_s = 0, 0.0
    base_prefill_s = 0.0
    prefill_s = dict.fromkeys(specs, 0.0)
    decode_s, decode_steps = 0.0, 0
    tokens = dict.fromkeys(specs, 0)
    seconds = dict.fromkeys(specs, 0.0)
    parts = {s: {"draft": 0.0, "verify": 0.0, "other": 0.0, "steps": 0} for s in specs}
    cycles: dict[SubnetSpec, list[int]] = {s: [] for s in specs}
    divergences: dict[SubnetSpec, list[Divergence]] = {s: [] for s in specs}
    bar = progress(enumerate(prompts), total=len(prompts), desc="verifying end to end",
                   unit="prompt", disable=None if show_progress is None else not show_progress)
    for index, prompt in bar:
        plain = plain_generate(target, dict(prompt), max_new_tokens=max_new_tokens, timed=True)
        base_tokens += plain.stats.new_tokens
        base_s += plain.stats.total_s
        base_prefill_s += plain.stats.prefill_s
        decode_s += plain.stats.verify_s
        decode_steps += max(0, plain.stats.new_tokens - 1)
        for spec, draft in drafts.items():
            out = generate(target, dict(prompt), DreamDrafter(draft, spec), gamma=spec.draft_len,
                           max_new_tokens=max_new_tokens, timed=True, tree=spec.shape)
            at = first_divergence(out.tokens.tolist(), plain.tokens.tolist())
            if at is not None:
                divergences[spec].append(_check_divergence(target, spec, index, prompt,
                                                           plain.tokens.tolist(), at))
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
            decode_ms=1000 * decode_s / max(1, decode_steps),
            prompts=n, identical_prompts=n - len(divergences[s]),
            divergences=tuple(divergences[s])))
    return out_rows


def _check_divergence(target: Any, spec: SubnetSpec, index: int, prompt: Mapping[str, Any],
                      plain_tokens: Sequence[int], at: int) -> Divergence:
    """The divergence of prompt `index` at generated token `at`; an error unless it is a near
    tie of the target's own logits in a 16-bit dtype."""
    dtype = str(target.dtype).removeprefix("torch.")
    top, margin = _top2(target, prompt, plain_tokens[:at])
    tolerance = near_tie_tolerance(dtype, top)
    if margin > tolerance:
        raise RuntimeError(
            f"speculative output of {spec.id} differs from plain greedy decoding on prompt "
            f"{index} at token {at}, where the target's top-2 logit margin is {margin:.4g} "
            f"(tolerated in {dtype}: {tolerance:.4g}): the loop is not lossless here; please "
            "report it")
    return Divergence(spec.id, index, at, margin, tolerance)


def speedup_gap(predicted: Candidate, measured: Measured) -> dict[str, float]:
    """Predicted vs measured decode-phase speedup and their gap, (measured - predicted) /
    predicted in percent (negative: the subnet ran slower than predicted)."""
    gap = (measured.speedup - predicted.speedup) / predicted.speedup * 100.0
    return {"predicted_speedup": float(predicted.speedup),
            "measured_speedup": float(measured.speedup), "gap_pct": float(gap)}


def gap_line(predicted: Candidate, measured: Measured) -> str:
    """The one log line stating the gap of `speedup_gap`."""
    gap = speedup_gap(predicted, measured)
    return (f"{predicted.spec.id}: decode-phase speedup predicted {gap['predicted_speedup']:.2f}x, "
            f"measured {gap['measured_speedup']:.2f}x ({gap['gap_pct']:+.1f}%)")


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
    cycle = p.cycle_draft_ms + p.verify_ms + p.cycle_overhead_ms
    step_ms = p.cycle_draft_ms / gamma  # predicted mean step: the first (after the verify) + hot
    effects = {  # relative change of the speedup each part explains
        "draft": gamma * (m.draft_ms - step_ms) / cycle,
        "verify": (m.verify_ms - p.verify_ms) / cycle,
        "overhead": (m.other_ms - p.cycle_overhead_ms) / cycle,
        "decode": (p.decode_ms - m.decode_ms) / p.decode_ms,
    }
    worst = max(effects, key=lambda k: abs(effects[k]))
    if worst == "overhead" and not p.cycle_overhead_ms:
        return (f"the speculative loop's own work ({m.other_ms:.2f} ms per cycle: acceptance, "
                "bookkeeping, Python) is not in the speedup formula (the latency profile has no "
                "`cycle` rows: rerun `dreams-nas profile` to time them); it weighs when a target "
                f"step is as short as {m.decode_ms:.2f} ms")
    if worst == "overhead":
        return (f"the speculative loop's own work took {m.other_ms:.2f} ms per cycle here vs "
                f"{p.cycle_overhead_ms:.2f} ms profiled (the `cycle` rows): the latency profile "
                "does not match this machine now; re-run `dreams-nas profile` on a quiet machine")
    names = {"draft": ("a draft step (mean over the cycle, the first one after the verify "
                       "included)", m.draft_ms, step_ms),
             "verify": ("a verify pass", m.verify_ms, p.verify_ms),
             "decode": ("a plain decoding step", m.decode_ms, p.decode_ms)}
    what, got, want = names[worst]
    return (f"{what} took {got:.2f} ms here vs {want:.2f} ms predicted: the latency profile does "
            "not match this machine now (other load, clocks or threads); re-run "
            "`dreams-nas profile` on a quiet machine")
