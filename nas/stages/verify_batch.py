"""Verify a search at batch B: each chosen subnet's batched throughput against plain batched
decoding of the same batches (`supernet.decoding.batch_loop`), what the search at B predicts.

The prompts are decoded B at a time, in order: each batch plainly, then by every chosen subnet,
before the next batch, so a change of the machine's speed falls on all of them alike; repeats
give each speedup as the median of the repeats'. The speedups are `verify.Measured`'s: the
decode phase (every token after each request's first, over the time after the prefills) and
whole calls. Every row of a subnet's batch must equal the same row of plain batched decoding:
in float32 a difference is a bug and raises; in 16 bits it is recorded as a divergence (the
order of a batched product's sums can flip a near tie, as between two GPUs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dreams_nas.nas.stages.lossless import Divergence
from dreams_nas.nas.stages.verify import Measured
from dreams_nas.supernet.core.spec import SubnetSpec


@dataclass
class _Totals:
    tokens: int = 0
    firsts: int = 0
    total_s: float = 0.0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    steps: int = 0
    cycles: list[int] = field(default_factory=list)

    def add(self, stats: Any, requests: int) -> None:
        self.tokens += stats.new_tokens
        self.firsts += requests
        self.total_s += stats.total_s
        self.prefill_s += stats.prefill_s + stats.draft_prefill_s
        self.draft_s += stats.draft_s
        self.verify_s += stats.verify_s
        self.other_s += stats.other_s
        self.steps += len(stats.steps)
        self.cycles += list(stats.cycle_lengths)

    def rates(self) -> tuple[float, float]:
        """Tokens per second of whole calls, and after the prefills."""
        return (self.tokens / self.total_s,
                (self.tokens - self.firsts) / (self.total_s - self.prefill_s))


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def measure_batched(target: Any, supernet: Any, specs: Sequence[SubnetSpec],
                    prompts: Sequence[Mapping[str, Any]], *, batch: int,
                    max_new_tokens: int = 64, repeats: int = 1) -> list[Measured]:
    """Batched throughput of each spec's extracted draft and of plain batched decoding at
    `batch` (module docstring); `verify.Measured` per spec."""
    from dreams_nas.supernet.decoding.batch_dream import BatchDreamDrafter
    from dreams_nas.supernet.decoding.batch_loop import generate_batch
    from dreams_nas.supernet.draft.extract import extract

    drafters = {s: BatchDreamDrafter(extract(supernet, s), s) for s in specs}
    chunks = [[dict(p) for p in prompts[i:i + batch]] for i in range(0, len(prompts), batch)]
    exact = str(target.dtype).removeprefix("torch.") == "float32"

    def decode(chunk: list[dict[str, Any]], spec: SubnetSpec | None, timed: bool) -> Any:
        drafter = None if spec is None else drafters[spec]
        return generate_batch(target, chunk, drafter,
                              shape=1 if spec is None else spec.shape,
                              max_new_tokens=max_new_tokens, timed=timed)

    for spec in (None, *specs):  # warm-up: first calls (a GPU's kernels, compilation)
        decode(chunks[0], spec, timed=False)
    base_all, every = _Totals(), {s: _Totals() for s in specs}
    per_repeat: dict[SubnetSpec, list[tuple[float, float]]] = {s: [] for s in specs}
    divergences: dict[SubnetSpec, list[Divergence]] = {s: [] for s in specs}
    for repeat in range(max(1, repeats)):
        base, totals = _Totals(), {s: _Totals() for s in specs}
        for c, chunk in enumerate(chunks):
            plain = decode(chunk, None, timed=True)
            base.add(plain.stats, len(chunk))
            base_all.add(plain.stats, len(chunk))
            for spec in specs:
                out = decode(chunk, spec, timed=True)
                totals[spec].add(out.stats, len(chunk))
                every[spec].add(out.stats, len(chunk))
                if repeat == 0:
                    divergences[spec] += _compare(spec, c * batch, plain, out, exact)
        b_whole, b_decode = base.rates()
        for spec in specs:
            whole, dec = totals[spec].rates()
            per_repeat[spec].append((dec / b_decode, whole / b_whole))
    return [_measured(spec, every[spec], base_all, per_repeat[spec], divergences[spec],
                      len(prompts)) for spec in specs]


def _compare(spec: SubnetSpec, start: int, plain: Any, out: Any, exact: bool
             ) -> list[Divergence]:
    found = []
    for i, (a, b) in enumerate(zip(plain.tokens, out.tokens, strict=True)):
        a, b = a.tolist(), b.tolist()
        if a == b:
            continue
        at = _first_difference(a, b)
        if exact:
            raise RuntimeError(
                f"{spec.id}: request {start + i} of a batch decoded {b[:at + 1]} where plain "
                f"batched decoding gives {a[:at + 1]} (token {at}): batched speculative "
                "decoding is not lossless here; report it with this line")
        nan = float("nan")
        found.append(Divergence(spec.id, start + i, at, nan, nan, nan, nan))
    return found


def _measured(spec: SubnetSpec, t: _Totals, base: _Totals, repeats: list[tuple[float, float]],
              divergences: list[Divergence], prompts: int) -> Measured:
    whole, decode = t.rates()
    b_whole, b_decode = base.rates()
    cycles = max(1, t.steps)
    return Measured(
        spec=spec, tau=sum(t.cycles) / max(1, len(t.cycles)), tokens_per_s=whole,
        baseline_tokens_per_s=b_whole, decode_tokens_per_s=decode,
        baseline_decode_tokens_per_s=b_decode,
        draft_ms=1000 * t.draft_s / (cycles * max(1, spec.draft_len)),
        verify_ms=1000 * t.verify_s / cycles, other_ms=1000 * t.other_s / cycles,
        decode_ms=1000 * base.verify_s / max(1, base.steps), prompts=prompts,
        identical_prompts=prompts - len({d.prompt for d in divergences}),
        divergences=tuple(divergences),
        repeat_speedups=tuple(r[0] for r in repeats),
        repeat_speedups_end_to_end=tuple(r[1] for r in repeats))
