"""Lossless, checked: a speculative output against plain greedy decoding, every divergence judged
by the two runs' own logits.

In float32 the two must agree token for token. In bfloat16/float16 a verify over several
positions and a one-token decode run different kernels, so where the target's top two logits
are nearly tied they can pick different tokens: the target's own numerics, not a bug. A
divergence at generated token j (plain decoding chose a, the speculative run b, their contexts
equal before j) is such a near tie only when **both runs saw it as one**: plain decoding's own
logits there put b within the tolerance of a, and the speculative run's own verify logits put a
within the tolerance of b. A bug that moves the logits (a stray KV row, a RoPE position off by
one in one layer) shows as a divergence whose one side is farther apart than numerics allow.

After a near tie the two answers continue from different contexts, so plain decoding is run
again from the speculative output up to and including token j, and the next divergence is
judged the same way, to the end of the answer: every divergence is checked, not only the first.

The tolerance is `NEAR_TIE_ULPS` units in the last place of the run's dtype at the top logit's
magnitude (at least 1): ulp(x) = 2^floor(log2 |x|) x eps, eps = 2^-7 in bfloat16, 2^-10 in
float16, 2^-23 in float32 (where it admits only the exact ties another kernel breaks the other
way). The logits each run chose its tokens from are recorded by re-running both decodes
untimed (decoding is deterministic; a re-run that decodes other tokens is an error).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

# How far the two runs' logits may be apart, in units in the last place of the dtype: a
# divergence is a near tie when each run's own logits put the other's token within this many at
# the top logit's magnitude, and in a shared context the logits of the tokens both runs rank high
# must agree within it. 16-bit logits are rounded to their dtype, so numerics move them by whole
# ulps; float32 logits keep the rounding of every sum behind them. Measured against injected
# faults (benchmarks/bench_lossless_faults.py, BENCHMARKS.md).
NEAR_TIE_ULPS = {"bfloat16": 8.0, "float16": 8.0, "float32": 256.0, "float64": 256.0}
_TOP = 8  # logits kept per generated token: the runner-up of a near tie is among them
_EPS = {"bfloat16": 2.0**-7, "float16": 2.0**-10, "float32": 2.0**-23, "float64": 2.0**-52}


class NotLossless(RuntimeError):
    """A divergence the target's numerics do not explain: the loop is wrong here."""


@dataclass(frozen=True)
class Divergence:
    """Where a prompt's speculative output left plain greedy decoding at a near tie."""

    spec_id: str
    prompt: int
    position: int  # index of the differing generated token
    margin: float  # plain decoding's own logit of its token minus that of the speculative one
    spec_margin: float  # the speculative run's own logit of its token minus that of plain's
    tolerance: float  # NEAR_TIE_ULPS ulps of the dtype at the top logit there
    ulp: float  # one unit in the last place of the dtype at the top logit there


def ulp(value: float, dtype: str) -> float:
    """One unit in the last place of `dtype` at |value| (at least at 1.0: a logit near 0 is
    compared at the spacing of 1)."""
    eps = _EPS.get(dtype)
    if eps is None:
        raise ValueError(f"no unit roundoff known for dtype {dtype!r}")
    return 2.0 ** math.floor(math.log2(max(1.0, abs(value)))) * eps


class _Rows:
    """The top logits of each row a run chose a token from: ids and values on the host."""

    def __init__(self) -> None:
        self.ids: list[list[int]] = []
        self.values: list[list[float]] = []

    def add(self, logits: Any) -> None:
        top = logits.float().topk(min(_TOP, logits.shape[-1]), dim=-1)
        self.ids += top.indices.tolist()
        self.values += top.values.tolist()

    def gap(self, row: int, other: int) -> float:
        """This row's top logit minus that of token `other` (inf: not among its top)."""
        ids = self.ids[row]
        return self.values[row][0] - self.values[row][ids.index(other)] if other in ids \
            else math.inf


class _ObservedTarget:
    """A target whose every prefill and one-token verify records the logits row it decodes
    from (plain decoding's rows); everything else is the target's."""

    def __init__(self, target: Any, rows: _Rows) -> None:
        self._target, self._rows = target, rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def prefill(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        out = self._target.prefill(inputs, *args, **kwargs)
        self._rows.add(out.logits.reshape(-1, self._target.vocab_size)[-1:])
        return out

    def verify(self, tokens: Any, *args: Any, **kwargs: Any) -> Any:
        out = self._target.verify(tokens, *args, **kwargs)
        self._rows.add(out.logits[0, -1:])
        return out


class _ObservedDrafter:
    """A drafter whose run records the target's logits rows of every kept token: the prefill's
    last row, then the committed rows of each verify (what `update` receives)."""

    def __init__(self, drafter: Any, rows: _Rows) -> None:
        self._drafter, self._rows = drafter, rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._drafter, name)

    def start(self, target: Any, prefill: Any) -> None:
        self._rows.add(prefill.logits.reshape(-1, target.vocab_size)[-1:])
        self._drafter.start(target, prefill)

    def update(self, accepted_tokens: Any, n_accepted: int, verify: Any) -> None:
        self._rows.add(verify.logits[0, : n_accepted + 1])
        self._drafter.update(accepted_tokens, n_accepted, verify)


class Observed(NamedTuple):
    """An untimed run's tokens and the logits rows it chose them from."""

    tokens: list[int]
    rows: _Rows


def observe_plain(target: Any, prompt: Mapping[str, Any], max_new_tokens: int, *,
                  prefix: Sequence[int] = (), expect: Sequence[int] | None = None) -> Observed:
    """Plain greedy decoding after `prompt` + `prefix`, with the rows it chose from; `expect`:
    the tokens a timed run of the same decoded (other tokens now: not deterministic, an error).
    One run serves every subnet checked on the prompt."""
    import torch
    from dreams_nas.supernet.decoding.loop import plain_generate

    inputs = dict(prompt)
    if prefix:
        inputs = target.extend_inputs(inputs, torch.tensor([list(prefix)], dtype=torch.long))
    rows = _Rows()
    out = plain_generate(_ObservedTarget(target, rows), inputs, max_new_tokens=max_new_tokens)
    observed = Observed(out.tokens.tolist(), rows)
    if expect is not None and observed.tokens != list(expect):
        raise NotLossless("plain decoding decoded a prompt differently when run again: decoding "
                          "is not deterministic here; please report it")
    return observed


def _speculative(target: Any, prompt: Mapping[str, Any], make_drafter: Callable[[], Any],
                 shape: Any, max_new_tokens: int) -> tuple[list[int], _Rows]:
    from dreams_nas.supernet.decoding.loop import generate

    rows = _Rows()
    out = generate(target, dict(prompt), _ObservedDrafter(make_drafter(), rows), shape=shape,
                   max_new_tokens=max_new_tokens)
    return out.tokens.tolist(), rows


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class Checked:
    """What the check of one prompt found: its near ties, and how far the two runs' logits of
    the same tokens in the same contexts were apart at most (in ulps of the dtype)."""

    divergences: list[Divergence]
    drift_ulps: float


def check_lossless(target: Any, prompt: Mapping[str, Any], make_drafter: Callable[[], Any],
                   shape: Any, *, max_new_tokens: int,
                   outputs: tuple[Sequence[int], Observed], where: tuple[str, int],
                   ulps: float | None = None) -> Checked:
    """Check `outputs` = (the speculative output, plain greedy decoding's `observe_plain`) of
    `prompt`
    (`where`: the spec id and the prompt's index): wherever the two runs are in
    the same context, each one's logits of the tokens both rank high must agree within `ulps`,
    and every divergence must be a near tie within `ulps` both ways; raises `NotLossless` at
    the first place that is not. `make_drafter`: a fresh drafter of the run. `ulps`: the
    tolerance (default `NEAR_TIE_ULPS` of the target's dtype)."""
    spec_id, index = where
    tokens, (plain, plain_rows) = outputs
    dtype = str(target.dtype).removeprefix("torch.")
    ulps = NEAR_TIE_ULPS[dtype] if ulps is None else ulps
    again, spec_rows = _speculative(target, prompt, make_drafter, shape, max_new_tokens)
    if again != list(tokens):
        raise NotLossless(f"{spec_id} decoded prompt {index} differently when run again: "
                          "decoding is not deterministic here; please report it")
    found, start, drift = [], 0, 0.0  # plain decoding from tokens[:start]: `plain`, its rows
    while True:
        at = _first_difference(tokens[start:], plain)
        same = min(len(plain) if at is None else at, len(tokens) - start, len(plain))
        drift = max(drift, _drift(spec_rows, plain_rows, (start, same),
                                  (spec_id, index, dtype, ulps)))
        if at is None:
            return Checked(found, drift)
        j = start + at
        if j >= len(tokens) or at >= len(plain):
            raise NotLossless(f"{spec_id} ended prompt {index} at token {len(tokens)} where "
                              f"plain decoding did not: the loop is not lossless here; please "
                              "report it")
        found.append(_near_tie(spec_rows, (j, tokens[j]), plain_rows, (at, plain[at]),
                               (spec_id, index, dtype, ulps)))
        drift = max(drift, _drift(spec_rows, plain_rows, (j, 1), (spec_id, index, dtype, ulps),
                                  offset=at))  # the divergence's own row: one context too
        start = j + 1
        if start >= len(tokens) or tokens[j] in target.eos_token_ids:
            return Checked(found, drift)
        plain, plain_rows = observe_plain(target, prompt, max_new_tokens - start,
                                          prefix=tokens[:start])


def _drift(spec: _Rows, plain: _Rows, span: tuple[int, int],
           where: tuple[str, int, str, float], offset: int = 0) -> float:
    """The largest `_apart` over `span` = (first token, count) of one shared context, plain
    decoding's rows from `offset`; raises `NotLossless` above the tolerance."""
    spec_id, index, dtype, ulps = where
    first, count = span
    worst = 0.0
    for i in range(count):
        apart = _apart(spec, first + i, plain, offset + i, dtype)
        if apart > ulps:
            raise NotLossless(
                f"{spec_id}'s verify logits differ from plain decoding's on prompt {index} at "
                f"token {first + i} by {apart:.1f} ulps of {dtype} in the same context "
                f"(numerics allow {ulps:g}): the loop is not lossless here; please report it")
        worst = max(worst, apart)
    return worst


def _apart(spec: _Rows, j: int, plain: _Rows, i: int, dtype: str) -> float:
    """How far the two rows' logits of the tokens both keep are apart, each in ulps of the
    dtype at its own magnitude (inf when they keep no token in common)."""
    values = dict(zip(plain.ids[i], plain.values[i], strict=True))
    gaps = [abs(v - values[t]) / ulp(max(abs(v), abs(values[t])), dtype)
            for t, v in zip(spec.ids[j], spec.values[j], strict=True) if t in values]
    return max(gaps, default=math.inf)


def _near_tie(spec: _Rows, mine: tuple[int, int], plain: _Rows, theirs: tuple[int, int],
              where: tuple[str, int, str, float]) -> Divergence:
    """The divergence at generated token j, (row, token) `mine` of the speculative run and
    `theirs` of plain decoding's, judged."""
    spec_id, index, dtype, ulps = where
    (j, mine), (at, theirs) = mine, theirs
    margin, spec_margin = plain.gap(at, mine), spec.gap(j, theirs)
    unit = ulp(max(abs(plain.values[at][0]), abs(spec.values[j][0])), dtype)
    tolerance = ulps * unit
    if not (margin <= tolerance and spec_margin <= tolerance):
        raise NotLossless(
            f"speculative output of {spec_id} differs from plain greedy decoding on prompt "
            f"{index} at token {j}: plain decoding preferred its token by {margin:.4g}, the "
            f"speculative run its own by {spec_margin:.4g} (a near tie in {dtype} is within "
            f"{tolerance:.4g} both ways, {ulps:g} ulps): the loop is not lossless here; please "
            "report it")
    return Divergence(spec_id, index, j, margin, spec_margin, tolerance, unit)
