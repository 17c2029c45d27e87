"""The order a profile times its keys in: shuffled, with each context's target steps side by side.

The speedup a profile predicts is a ratio of its rows: the target's one-token step over the
cycle's draft steps, verify and overhead. On a shared machine a step's cost moves by tens of
percent from minute to minute, and in a grid shuffled key by key the decode step of a context is
timed in other seconds than that context's verify steps: the profile's verify / decode ratio
then moved between profiles of one run far more than the decoding loop's did, and with it the
predicted speedup (BENCHMARKS.md, 'Predicted vs measured speedup of the pick'). So the keys of
the target's kinds (decode, verify, verify_tree, cycle, cycle_tree) of one context are one
*unit*: the units and the draft keys are shuffled (a slow drift still spreads over the grid as
noise, not along one of its axes), and a unit's keys are timed one after another, the decode
step in the middle, the chain verify steps next to it, then the cycle steps, the trees at the
ends; an interleaved pass visits a unit's keys together (the odd passes backwards, keeping the
decode in the middle).

`blocks` cuts the order into the profile's blocks without splitting a unit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from dreams_nas.latency.kinds import DRAFT_KINDS
from dreams_nas.latency.measure.plan import StepKey

# The target kinds of a unit, nearest to the decode step first.
_NEAR_DECODE = ("verify", "cycle", "verify_tree", "cycle_tree")


def target_unit(keys: Sequence[StepKey]) -> list[StepKey]:
    """One context's target keys in their timing order: the decode in the middle, every other
    kind on both sides of it, the kinds in `_NEAR_DECODE` order outwards (each kind's keys
    alternate left and right by k, so a verify over k and over k + 1 sit on either side)."""
    decode = [key for key in keys if key.kind == "decode"]
    rest = sorted((key for key in keys if key.kind != "decode"),
                  key=lambda key: (_rank(key.kind), key.k))
    left: list[StepKey] = []
    right: list[StepKey] = []
    for i, key in enumerate(rest):
        (left if i % 2 == 0 else right).append(key)
    return left[::-1] + decode + right


def timing_order(keys: Sequence[StepKey], seed: int | None = 0) -> list[list[StepKey]]:
    """The keys as timing units in order: each draft key alone, each context's target keys
    together (`target_unit`); the units shuffled by `seed` (None: in the order their first key
    is given)."""
    units: list[list[StepKey]] = []
    by_context: dict[int, list[StepKey]] = {}
    for key in keys:
        if key.kind in DRAFT_KINDS:
            units.append([key])
        elif key.context_len in by_context:
            by_context[key.context_len].append(key)
        else:
            by_context[key.context_len] = [key]
            units.append(by_context[key.context_len])  # filled in place as its keys come
    units = [target_unit(unit) if unit[0].kind not in DRAFT_KINDS else unit for unit in units]
    if seed is not None:
        order = np.random.default_rng(seed).permutation(len(units))
        units = [units[i] for i in order]
    return units


def blocks(units: Sequence[Sequence[StepKey]], size: int) -> list[list[StepKey]]:
    """The units cut into blocks of at least `size` keys (the last may hold fewer), a unit never
    split: a block closes at the first unit end at or past `size` keys."""
    out: list[list[StepKey]] = []
    block: list[StepKey] = []
    for unit in units:
        block.extend(unit)
        if len(block) >= size:
            out.append(block)
            block = []
    if block:
        out.append(block)
    return out


def _rank(kind: str) -> int:
    return _NEAR_DECODE.index(kind) if kind in _NEAR_DECODE else len(_NEAR_DECODE)
