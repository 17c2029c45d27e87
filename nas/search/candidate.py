"""What a search evaluates (`Candidate`) and the two things it needs to evaluate one.

The search is written against two small protocols so it runs with the real acceptance
scorer and latency predictor as well as with deterministic ones in tests:

* `AcceptanceScorer.score(specs) -> [AcceptanceRow]`: tau of each subnet (the expensive part;
  hardware independent).
* `LatencyModel.predict_ms(kind, spec, context_len, k) -> ms` for kind "draft" (one draft
  step of `spec`), "draft_first" (the cycle's first draft step, right after the target's
  verify), "verify" (one target pass over k positions) or "decode" (one plain target step);
  `spec` is None for the target's kinds. `dreams_nas.latency.LatencyPredictor` is the real one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from dreams_nas.nas.search.speedup import expected_speedup
from dreams_nas.supernet.acceptance.table import AcceptanceRow
from dreams_nas.supernet.core.space import SubnetSpec


@runtime_checkable
class AcceptanceScorer(Protocol):
    def score(self, specs: Sequence[SubnetSpec]) -> list[AcceptanceRow]:
        """One row per spec, in the order given."""
        ...


@runtime_checkable
class LatencyModel(Protocol):
    def predict_ms(self, kind: str, spec: SubnetSpec | None, context_len: int, k: int) -> float:
        ...


DraftParams = Callable[[SubnetSpec], int]


@dataclass(frozen=True)
class Candidate:
    """One evaluated subnet: measured tau, predicted latencies, expected speedup."""

    spec: SubnetSpec
    tau: float
    tau_ci: tuple[float, float]
    draft_ms: float  # one draft step (hot: the cycle's 2nd..gamma-th)
    first_draft_ms: float  # the cycle's first draft step (right after the verify)
    verify_ms: float  # one target pass over draft_len + 1 positions
    decode_ms: float  # one plain target step
    speedup: float
    draft_params: int
    feasible: bool  # meets the constraints (--max-draft-ms)
    number: int = -1  # evaluation order: Optuna trial number or enumeration index

    @property
    def cycle_draft_ms(self) -> float:
        """Draft time per cycle: the first step after the verify and draft_len - 1 hot ones."""
        return self.first_draft_ms + (self.spec.draft_len - 1) * self.draft_ms

    @property
    def spec_id(self) -> str:
        return self.spec.id

    def to_attrs(self) -> dict[str, Any]:
        """The figures an Optuna trial keeps as user attributes (`from_attrs` reads them)."""
        return {"spec_id": self.spec.id, "tau": self.tau, "tau_lo": self.tau_ci[0],
                "tau_hi": self.tau_ci[1], "draft_ms": self.draft_ms,
                "first_draft_ms": self.first_draft_ms, "verify_ms": self.verify_ms,
                "decode_ms": self.decode_ms, "speedup": self.speedup,
                "draft_params": self.draft_params, "feasible": self.feasible}

    @classmethod
    def from_attrs(cls, spec: SubnetSpec, attrs: Mapping[str, Any], number: int) -> Candidate:
        """The candidate a trial's user attributes describe (see `to_attrs`)."""
        return cls(
            spec=spec, tau=float(attrs["tau"]),
            tau_ci=(float(attrs["tau_lo"]), float(attrs["tau_hi"])),
            draft_ms=float(attrs["draft_ms"]), first_draft_ms=float(attrs["first_draft_ms"]),
            verify_ms=float(attrs["verify_ms"]), decode_ms=float(attrs["decode_ms"]),
            speedup=float(attrs["speedup"]), draft_params=int(attrs["draft_params"]),
            feasible=bool(attrs["feasible"]), number=number)

    def to_row(self) -> dict[str, Any]:
        """The SCHEMAS.md trials.csv columns this candidate fills."""
        return {
            "number": self.number, "spec_id": self.spec.id, **self.spec.to_fields(),
            "tau": self.tau, "tau_lo": self.tau_ci[0], "tau_hi": self.tau_ci[1],
            "draft_ms": self.draft_ms, "first_draft_ms": self.first_draft_ms,
            "verify_ms": self.verify_ms, "decode_ms": self.decode_ms,
            "speedup": self.speedup, "draft_params": self.draft_params,
            "feasible": int(self.feasible),
        }


class LatencyCache:
    """Memoises predictions: a draft step depends on (heads, visual_keep, inject_layer) only,
    a verify pass on k only, so a whole space needs few predictor calls."""

    def __init__(self, predictor: LatencyModel, context_len: int) -> None:
        self.predictor = predictor
        self.context_len = int(context_len)
        self._memo: dict[tuple[Any, ...], float] = {}

    def _get(self, kind: str, spec: SubnetSpec | None, k: int) -> float:
        key = (kind, None if spec is None else spec.replace(draft_len=1), k)
        if key not in self._memo:
            self._memo[key] = float(self.predictor.predict_ms(kind, spec, self.context_len, k))
        return self._memo[key]

    def draft(self, spec: SubnetSpec) -> float:
        return self._get("draft", spec.replace(draft_len=1), 1)

    def first_draft(self, spec: SubnetSpec) -> float:
        return self._get("draft_first", spec.replace(draft_len=1), 1)

    def verify(self, draft_len: int) -> float:
        return self._get("verify", None, draft_len + 1)

    def decode(self) -> float:
        return self._get("decode", None, 1)


def evaluate(
    rows: Sequence[AcceptanceRow],
    latency: LatencyCache,
    draft_params: DraftParams,
    *,
    max_draft_ms: float | None = None,
    numbers: Sequence[int] | None = None,
) -> list[Candidate]:
    """Candidates for acceptance rows, vectorised over the rows."""
    if not rows:
        return []
    tau = np.array([r.tau for r in rows], dtype=np.float64)  # (n,)
    gamma = np.array([r.spec.draft_len for r in rows], dtype=np.float64)  # (n,)
    draft = np.array([latency.draft(r.spec) for r in rows], dtype=np.float64)  # (n,)
    first = np.array([latency.first_draft(r.spec) for r in rows], dtype=np.float64)  # (n,)
    verify = np.array([latency.verify(r.spec.draft_len) for r in rows], dtype=np.float64)
    decode = latency.decode()
    speedup = expected_speedup(tau, gamma, draft, verify, decode, first_draft_ms=first)  # (n,)
    feasible = np.ones(len(rows), dtype=bool) if max_draft_ms is None else draft <= max_draft_ms
    numbers = list(numbers) if numbers is not None else list(range(len(rows)))
    return [
        Candidate(
            spec=r.spec, tau=float(r.tau), tau_ci=(float(r.tau_lo), float(r.tau_hi)),
            draft_ms=float(draft[i]), first_draft_ms=float(first[i]),
            verify_ms=float(verify[i]), decode_ms=float(decode),
            speedup=float(speedup[i]), draft_params=int(draft_params(r.spec)),
            feasible=bool(feasible[i]), number=int(numbers[i]),
        )
        for i, r in enumerate(rows)
    ]
