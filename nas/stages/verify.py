"""Trust but verify: measure the chosen subnets end to end against plain decoding.

A search ranks subnets by a *predicted* speedup (measured tau x predicted latencies). Before a
result is trusted, the best subnet and the top of the front are extracted (the deployable
compact draft) and decoded for real on the evaluation prompts, interleaved with plain
decoding of the same prompts on the same target, and the measured speedup is recorded next
to the prediction. A gap over `GAP_WARN` is reported with its likely cause.

Two measured speedups are kept. `speedup` is the decode phase, the quantity the formula
tau * T_decode / ((draft_len - 1) * T_draft + T_draft_first + T_verify) predicts: tokens after the
first over the time after the prefill, for both the speculative run and plain decoding. The
prefill phase is the prompt's processing: the target's prompt pass, and in the speculative run
also the drafter's (its KV cache and cross-attention memory over the prompt, once per request).
`speedup_end_to_end` is tokens over the whole call, prefill included: the prefill is the same
work for both, so it dilutes the ratio the more, the shorter the answers.

Lossless is checked on every prompt (`lossless.check_lossless`): in float32 the speculative
output must equal plain greedy decoding token for token; in 16 bits every divergence must be a
near tie that both runs' own logits show as one, within a few ulps of the dtype.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dreams_nas.nas.search.candidate import Candidate
from dreams_nas.nas.stages.lossless import Divergence, check_lossless, observe_plain
from dreams_nas.supernet.core.spec import SubnetSpec

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
    prompts: int = 0  # prompts decoded
    identical_prompts: int = 0  # of them, those whose output equals plain greedy decoding
    divergences: tuple[Divergence, ...] = ()  # the others: near ties of a 16-bit target
    drift_ulps: float = 0.0  # the two runs' logits in the same context, at most this far apart
    # Per repeat (each a pass over every prompt, interleaved with the others), the decode-phase
    # and the whole-call speedups; with several, the speedups are their medians.
    repeat_speedups: tuple[float, ...] = ()
    repeat_speedups_end_to_end: tuple[float, ...] = ()

    @property
    def speedup(self) -> float:
        """Decode phase (what the expected-speedup formula predicts); end to end when the
        decode-phase rates were not recorded. The median over the repeats when there were
        several."""
        if len(self.repeat_speedups) > 1:
            return statistics.median(self.repeat_speedups)
        if self.decode_tokens_per_s != self.decode_tokens_per_s:  # nan
            return self.speedup_end_to_end
        return self.decode_tokens_per_s / self.baseline_decode_tokens_per_s

    @property
    def speedup_end_to_end(self) -> float:
        """Whole calls, the prefill (the same for both) included."""
        if len(self.repeat_speedups_end_to_end) > 1:
            return statistics.median(self.repeat_speedups_end_to_end)
        return self.tokens_per_s / self.baseline_tokens_per_s

    @property
    def speedup_range(self) -> tuple[float, float]:
        """The lowest and highest decode-phase speedup of the repeats."""
        values = self.repeat_speedups or (self.speedup,)
        return min(values), max(values)


@dataclass
class _Totals:
    """Seconds and counts of one decoder (plain or a subnet) summed over prompts."""

    tokens: int = 0
    total_s: float = 0.0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    draft_steps: int = 0
    decode_steps: int = 0
    cycles: list[int] = field(default_factory=list)

    def add(self, stats: Any, *, plain: bool) -> None:
        self.tokens += stats.new_tokens
        self.total_s += stats.total_s
        if plain:
            self.prefill_s += stats.prefill_s
            self.verify_s += stats.verify_s  # a plain decoding step is a one-token verify
            self.decode_steps += max(0, stats.new_tokens - 1)
            return
        self.prefill_s += stats.prefill_s + stats.draft_prefill_s
        self.draft_s += stats.draft_s
        self.verify_s += stats.verify_s
        self.other_s += stats.other_s
        self.draft_steps += sum(stats.proposed)
        self.cycles += list(stats.cycle_lengths)

    def rates(self, prompts: int) -> tuple[float, float]:
        """Tokens per second of whole calls, and after the prefill (the first token of each
        prompt comes from the prefill)."""
        return (self.tokens / self.total_s,
                (self.tokens - prompts) / (self.total_s - self.prefill_s))


def measure_end_to_end(target: Any, supernet: Any, specs: Sequence[SubnetSpec],
                       prompts: Sequence[Mapping[str, Any]], *, max_new_tokens: int = 64,
                       repeats: int = 1, show_progress: bool | None = None,
                       between: Callable[[int], None] | None = None) -> list[Measured]:
    """Tokens/s of each spec's extracted draft and of plain decoding, prompt by prompt.

    Each prompt is decoded plainly, then by every spec, before the next prompt, so a change of
    the machine's speed falls on all of them alike. `repeats` passes over the prompts (each a
    repeat) give each speedup as the median of the repeats' speedups, with their range; the
    times per step are pooled over the repeats. Lossless is checked on the first repeat (the
    outputs are a function of the prompt; later repeats must reproduce them).
    `show_progress`: a bar over the prompts on stderr (None: when stderr is a terminal; the
    verification decodes every prompt (1 + len(specs)) x repeats times, minutes on a CPU).
    `between(i)`: called before the i-th prompt decoded (counting over the repeats) and once
    after the last (i = len(prompts) x repeats), e.g. to time the steps again among the
    prompts, under the same changes of the machine's speed (`retime`)."""
    from dreams_nas.supernet.core.progress import progress
    from dreams_nas.supernet.draft.extract import extract

    session = _Session(target, {spec: extract(supernet, spec) for spec in specs},
                       max_new_tokens)
    # Warm-up: one whole decode of the first prompt by each decoder, so first-call work (a
    # GPU's kernel selection and allocator growth for every context length and verify width
    # the decode meets) is not counted as decoding speed.
    session.decode_all(dict(prompts[0]), timed=False)
    repeats, n = max(1, repeats), len(prompts)
    bar = progress(total=n * repeats, desc="verifying end to end", unit="prompt",
                   disable=None if show_progress is None else not show_progress)
    for repeat in range(repeats):
        session.start_repeat()
        for index, prompt in enumerate(prompts):
            if between is not None:
                between(repeat * n + index)
            session.prompt(repeat, index, prompt)
            bar.update(1)
        session.end_repeat(n)
    bar.close()
    if between is not None:
        between(repeats * n)
    return session.measured(n, repeats)


class _Session:
    """One verification: plain decoding and each spec's draft over the same prompts, their
    totals per repeat and over all repeats, the first repeat's outputs and divergences."""

    def __init__(self, target: Any, drafts: dict[SubnetSpec, Any], max_new_tokens: int) -> None:
        self.target, self.drafts, self.max_new_tokens = target, drafts, max_new_tokens
        self.base_all, self.all_totals = _Totals(), {s: _Totals() for s in drafts}
        self.per_repeat: dict[SubnetSpec, list[tuple[float, float]]] = {s: [] for s in drafts}
        self.divergences: dict[SubnetSpec, list[Divergence]] = {s: [] for s in drafts}
        self.drift: dict[SubnetSpec, float] = {s: 0.0 for s in drafts}
        self.outputs: dict[tuple[Any, int], list[int]] = {}  # (spec or None, prompt) -> tokens
        self.base, self.totals = _Totals(), {s: _Totals() for s in drafts}

    def _drafter(self, spec: SubnetSpec) -> Callable[[], Any]:
        from dreams_nas.supernet.decoding.dream import DreamDrafter

        return lambda: DreamDrafter(self.drafts[spec], spec)

    def decode_all(self, prompt: Mapping[str, Any], timed: bool) -> list[Any]:
        """Plain decoding then each spec's draft on `prompt`: [plain, *per spec] results."""
        from dreams_nas.supernet.decoding.dream import DreamDrafter
        from dreams_nas.supernet.decoding.loop import generate, plain_generate

        out = [plain_generate(self.target, dict(prompt), max_new_tokens=self.max_new_tokens,
                              timed=timed)]
        for spec, draft in self.drafts.items():
            out.append(generate(self.target, dict(prompt), DreamDrafter(draft, spec),
                                shape=spec.shape, max_new_tokens=self.max_new_tokens,
                                timed=timed))
        return out

    def start_repeat(self) -> None:
        self.base, self.totals = _Totals(), {s: _Totals() for s in self.drafts}

    def prompt(self, repeat: int, index: int, prompt: Mapping[str, Any]) -> None:
        """Decode prompt `index` plainly and by every spec, one after another, then check the
        outputs (lossless on the first repeat, from untimed runs after the timed decodes, one
        plain run for every spec; reproduced on later repeats) and add the times."""
        plain, *drafted = self.decode_all(prompt, timed=True)
        plain_tokens = _same_output(self.outputs, None, index, plain.tokens.tolist())
        self.base.add(plain.stats, plain=True)
        self.base_all.add(plain.stats, plain=True)
        observed = None if repeat else observe_plain(self.target, prompt, self.max_new_tokens,
                                                     expect=plain_tokens)
        for spec, out in zip(self.drafts, drafted, strict=True):
            tokens = _same_output(self.outputs, spec, index, out.tokens.tolist())
            if observed is not None:
                checked = check_lossless(
                    self.target, prompt, self._drafter(spec), spec.shape,
                    max_new_tokens=self.max_new_tokens, outputs=(tokens, observed),
                    where=(spec.id, index))
                self.divergences[spec] += checked.divergences
                self.drift[spec] = max(self.drift[spec], checked.drift_ulps)
            self.totals[spec].add(out.stats, plain=False)
            self.all_totals[spec].add(out.stats, plain=False)

    def end_repeat(self, n: int) -> None:
        base_rates = self.base.rates(n)
        for spec in self.drafts:
            rates = self.totals[spec].rates(n)
            self.per_repeat[spec].append((rates[1] / base_rates[1], rates[0] / base_rates[0]))

    def measured(self, n: int, repeats: int) -> list[Measured]:
        baseline, baseline_decode = self.base_all.rates(n * repeats)
        rows = []
        for s in self.drafts:
            t = self.all_totals[s]
            n_cycles = max(1, len(t.cycles))
            whole, decode = t.rates(n * repeats)
            rows.append(Measured(
                spec=s, tau=sum(t.cycles) / n_cycles, tokens_per_s=whole,
                baseline_tokens_per_s=baseline, decode_tokens_per_s=decode,
                baseline_decode_tokens_per_s=baseline_decode,
                draft_ms=1000 * t.draft_s / max(1, t.draft_steps),
                verify_ms=1000 * t.verify_s / n_cycles,
                other_ms=1000 * t.other_s / n_cycles,
                decode_ms=1000 * self.base_all.verify_s / max(1, self.base_all.decode_steps),
                prompts=n, identical_prompts=n - len({d.prompt for d in self.divergences[s]}),
                divergences=tuple(self.divergences[s]), drift_ulps=self.drift[s],
                repeat_speedups=tuple(r[0] for r in self.per_repeat[s]),
                repeat_speedups_end_to_end=tuple(r[1] for r in self.per_repeat[s])))
        return rows


def _same_output(outputs: dict[tuple[Any, int], list[int]], spec: SubnetSpec | None, index: int,
                 tokens: list[int]) -> list[int]:
    """Record the first repeat's output of (`spec`, prompt `index`); a later repeat must decode
    the same tokens (greedy decoding is a function of the prompt)."""
    first = outputs.setdefault((spec, index), tokens)
    if first != tokens:
        name = "plain decoding" if spec is None else spec.id
        raise RuntimeError(f"{name} decoded prompt {index} differently on a repeat of the "
                           "verification: decoding is not deterministic here; please report it")
    return first


def speedup_gap(predicted: Candidate, measured: Measured) -> dict[str, float]:
    """Predicted vs measured decode-phase speedup and their gap, (measured - predicted) /
    predicted in percent (negative: the subnet ran slower than predicted)."""
    gap = (measured.speedup - predicted.speedup) / predicted.speedup * 100.0
    return {"predicted_speedup": float(predicted.speedup),
            "measured_speedup": float(measured.speedup), "gap_pct": float(gap)}


def gap_line(predicted: Candidate, measured: Measured) -> str:
    """The one log line stating the gap of `speedup_gap`."""
    gap = speedup_gap(predicted, measured)
    repeats = len(measured.repeat_speedups)
    low, high = measured.speedup_range
    spread = f" (median of {repeats}: {low:.2f}-{high:.2f}x)" if repeats > 1 else ""
    return (f"{predicted.spec.id}: decode-phase speedup predicted {gap['predicted_speedup']:.2f}x, "
            f"measured {gap['measured_speedup']:.2f}x{spread} ({gap['gap_pct']:+.1f}%)")


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
    draft_len = p.spec.draft_len
    if not all(map(lambda x: x == x, (m.draft_ms, m.verify_ms, m.other_ms, m.decode_ms))):
        return ("tau agrees, so the gap is in the latencies: the latency predictor does not "
                "match this machine now (profiled under other load, clocks or threads); re-run "
                "`dreams-nas profile` on a quiet machine")
    cycle = p.cycle_draft_ms + p.verify_ms + p.cycle_overhead_ms
    # predicted mean step: the first (after the verify) and the hot ones
    step_ms = p.cycle_draft_ms / draft_len
    effects = {  # relative change of the speedup each part explains
        "draft": draft_len * (m.draft_ms - step_ms) / cycle,
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
