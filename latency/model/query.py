"""The one question a search asks of a latency model: what each step costs, many at a time.

`LatencyModel` is that interface. `LatencyPredictor` (fitted on a profile) answers it, and so
do the tables a test or a replay records (`ScalarLatency`, one step at a time). A search asks
for every distinct step a table of subnets needs in one call per kind -- a draft step's cost
depends only on the spec fields the model names in `draft_fields`, a target step's on k -- so
evaluating 10^6 subnets costs a handful of calls. `MemoizedLatency` is the same interface
again, remembering what it was told: an Optuna study asks for one subnet per trial, and most
of their steps were asked before.

Kinds (`latency.kinds`): ``draft`` and ``draft_first`` of specs (`draft_ms`, a hot step over
`k` nodes: a token tree's level); ``decode`` (k = 1), ``verify`` (k = draft_len + 1),
``verify_tree`` (a tree's nodes + 1), ``cycle`` and ``cycle_tree`` (the cycle's own work) of
k positions (`target_ms`). `prices(kind)` says whether a model prices a kind at all: a model
without the cycle kinds prices a cycle's own work at 0 ms (the search says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from dreams_nas.latency.kinds import DRAFT_KINDS, KINDS, TARGET_KINDS
from dreams_nas.supernet.core.spec import ARCH_FIELDS, SubnetSpec


@runtime_checkable
class LatencyModel(Protocol):
    """Milliseconds of the steps of a speculative cycle on one device (module docstring)."""

    draft_fields: tuple[str, ...]  # the spec fields one draft step's cost depends on

    def draft_ms(self, specs: Sequence[SubnetSpec], context_len: int, kind: str = "draft",
                 k: int = 1) -> np.ndarray:
        """(len(specs),) ms of one `kind` draft step of each spec over `k` nodes."""
        ...

    def target_ms(self, kind: str, ks: Sequence[int], context_len: int) -> np.ndarray:
        """(len(ks),) ms of one `kind` target step (or cycle) over each k positions."""
        ...

    def prices(self, kind: str) -> bool:
        """Whether the model prices `kind` (a cycle kind may be missing)."""
        ...


class ScalarLatency:
    """A `LatencyModel` from one step at a time: subclasses implement `step_ms` (and may narrow
    `draft_fields`); every kind but the cycle's own work is priced (a subclass that prices the
    cycle kinds says so in `prices`)."""

    draft_fields: tuple[str, ...] = ARCH_FIELDS

    def step_ms(self, kind: str, spec: SubnetSpec | None, context_len: int, k: int) -> float:
        raise NotImplementedError

    def draft_ms(self, specs: Sequence[SubnetSpec], context_len: int, kind: str = "draft",
                 k: int = 1) -> np.ndarray:
        return np.array([self.step_ms(kind, s, context_len, k) for s in specs], dtype=float)

    def target_ms(self, kind: str, ks: Sequence[int], context_len: int) -> np.ndarray:
        return np.array([self.step_ms(kind, None, context_len, int(k)) for k in ks],
                        dtype=float)

    def prices(self, kind: str) -> bool:
        return kind in KINDS and not kind.startswith("cycle")


class MemoizedLatency:
    """`model` with every answer remembered by what it depends on: (kind, context, k, the
    spec's `draft_fields`) for a draft step, (kind, context, k) for a target step. Missing
    answers are asked in one call; `n_calls` counts the calls made (tests and benchmarks)."""

    def __init__(self, model: LatencyModel) -> None:
        self.model = model
        self.draft_fields = tuple(model.draft_fields)
        self.n_calls = 0
        self._memo: dict[tuple[Any, ...], float] = {}

    def draft_ms(self, specs: Sequence[SubnetSpec], context_len: int, kind: str = "draft",
                 k: int = 1) -> np.ndarray:
        if kind not in DRAFT_KINDS:
            raise ValueError(f"draft kind {kind!r} is not one of {', '.join(DRAFT_KINDS)}")
        keys = [(kind, int(context_len), int(k), *(getattr(s, f) for f in self.draft_fields))
                for s in specs]
        missing = {key: s for key, s in zip(keys, specs, strict=True) if key not in self._memo}
        if missing:
            self.n_calls += 1
            values = self.model.draft_ms(list(missing.values()), context_len, kind=kind, k=k)
            self._memo.update(zip(missing, _floats(values, len(missing), kind), strict=True))
        return np.array([self._memo[key] for key in keys], dtype=float)

    def target_ms(self, kind: str, ks: Sequence[int], context_len: int) -> np.ndarray:
        if kind not in TARGET_KINDS:
            raise ValueError(f"target kind {kind!r} is not one of {', '.join(TARGET_KINDS)}")
        keys = [(kind, int(context_len), int(k)) for k in ks]
        missing = list(dict.fromkeys(key for key in keys if key not in self._memo))
        if missing:
            self.n_calls += 1
            values = self.model.target_ms(kind, [key[2] for key in missing], context_len)
            self._memo.update(zip(missing, _floats(values, len(missing), kind), strict=True))
        return np.array([self._memo[key] for key in keys], dtype=float)

    def prices(self, kind: str) -> bool:
        return self.model.prices(kind)


def _floats(values: Any, n: int, kind: str) -> list[float]:
    out = np.atleast_1d(np.asarray(values, dtype=np.float64))
    if out.shape != (n,):
        raise ValueError(f"the latency model returned {out.shape} {kind} predictions for {n} "
                         "steps; it must return one per step asked")
    return out.tolist()
