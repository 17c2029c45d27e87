"""The values of the report besides the subnets (subnets.py): the best subnet, what the other
stages measured, and `ReportData`, everything the figures and the page show.

`build_report_data` (data.py) fills them from a run folder; the figure modules and html.py only
draw them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from dreams_nas.reports.subnets import Subnet, SubnetTable


@dataclass(frozen=True)
class BestSubnet:
    """search/<hardware-id>/best.json, flattened."""

    spec_id: str
    heads: int
    visual_keep: float
    inject_layer: int
    draft_len: int
    objective: str
    method: str
    spec_dir: str
    predicted_speedup: float
    predicted_tau: float | None
    tau_ci: tuple[float, float] | None
    draft_ms: float | None
    verify_ms: float | None
    decode_ms: float | None
    measured_speedup: float | None
    measured_tau: float | None
    tokens_per_s: float | None
    baseline_tokens_per_s: float | None
    created: str | None
    exported: bool
    # whole calls, prefill included (measured_speedup is the decode phase the formula predicts)
    measured_speedup_end_to_end: float | None = None
    measured_range: tuple[float, float] | None = None  # decode phase, over the repeats
    measured_repeats: int | None = None
    tree: str = ""  # a token tree's shape (``4x2x1``); empty: a chain of draft_len
    depth: int = 1  # decoder layers on each side of the cross-attention
    mlp: float = 1.0  # share of the MLP's channels kept
    draft_vocab: float = 1.0  # share of the target's vocabulary drafted

    @property
    def speedup_gap(self) -> float | None:
        """(measured - predicted) / predicted, when the best subnet was measured."""
        if self.measured_speedup is None or not self.predicted_speedup:
            return None
        return (self.measured_speedup - self.predicted_speedup) / self.predicted_speedup


@dataclass(frozen=True)
class Verified:
    """A subnet measured end to end after the search."""

    spec_id: str
    predicted_speedup: float
    measured_speedup: float
    measured_tau: float | None


@dataclass(frozen=True)
class AcceptanceCurve:
    """Per-position acceptance rates of one subnet (positions 1..draft_len)."""

    spec_id: str
    rates: tuple[float, ...]
    tau: float | None


@dataclass(frozen=True)
class HoldoutPoint:
    kind: str
    spec_id: str | None
    measured_ms: float
    predicted_ms: float


@dataclass(frozen=True)
class KindAccuracy:
    """predictor.json's `metrics_by_kind` entry: held-out quality on one kind of step."""

    kind: str
    n: int | None
    mape: float | None
    within_10pct: float | None
    kendall_tau: float | None


@dataclass(frozen=True)
class PredictorInfo:
    """latency/<hardware-id>/predictor.json: the latency predictor's held-out quality."""

    regressor: str
    mape: float | None
    rmse: float | None
    within_10pct: float | None
    kendall_tau: float | None
    n_train: int | None
    n_holdout: int | None
    holdout: tuple[HoldoutPoint, ...]
    # per kind of step (draft, draft_tree, draft_first, decode, verify, verify_tree); empty for
    # a predictor.json written before it recorded them
    by_kind: tuple[KindAccuracy, ...] = ()
    # a transferred predictor: ``transferred from <ids>, <N> steps measured here`` (its
    # accuracy is then the transfer's on those steps, each left out in turn); None: profiled
    transfer: str | None = None


@dataclass(frozen=True)
class AifdInfo:
    """Attention entropy (AE) and its change (ΔAE) per target layer, and the chosen layer(s)."""

    layers: tuple[int, ...]
    ae: tuple[float, ...]
    delta_ae: tuple[float, ...]
    chosen: tuple[int, ...]
    rule: str


@dataclass(frozen=True)
class TrainingCurve:
    """The supernet's training: loss per step, held-out tau per evaluation, the kept step."""

    steps: tuple[int, ...]
    loss: tuple[float, ...]
    eval_steps: tuple[int, ...]
    tau_full: tuple[float, ...]
    tau_smallest: tuple[float | None, ...]  # None in phase 1 (the full draft only)
    warmup_steps: int | None
    best_step: int | None
    best_score: float | None
    stopped: str | None
    draft_len: int | None


@dataclass(frozen=True)
class HistoryPoint:
    number: int
    value: float | None
    best_so_far: float | None


@dataclass(frozen=True)
class CrossHardware:
    """Each hardware's best subnet and its predicted speedup on every searched hardware.

    speedup[i][j] is the speedup of hardware_ids[i]'s best subnet on hardware_ids[j], looked up
    in hardware_ids[j]'s trials.csv; None where that subnet was not evaluated there.
    """

    hardware_ids: tuple[str, ...]
    best_spec_ids: tuple[str, ...]
    speedup: tuple[tuple[float | None, ...], ...]

    def relative(self, i: int, j: int) -> float | None:
        """speedup[i][j] as a fraction of hardware j's own best (1.0 on the diagonal)."""
        value, own = self.speedup[i][j], self.speedup[j][j]
        return None if value is None or not own else value / own


@dataclass(frozen=True, eq=False)
class PairedSpeedups:
    """The subnets scored on this report's hardware and on another: their expected speedup on
    each (the cross-hardware front)."""

    other_id: str
    spec_id: np.ndarray  # (n,) str
    here: np.ndarray  # (n,) float64
    there: np.ndarray  # (n,) float64


@dataclass(frozen=True)
class ReportData:
    """Everything the report shows, for one hardware id of one run.

    `subnets` holds every scored subnet, best predicted speedup first: a tuple of `Subnet` for
    a search of up to `data.OBJECTS_UP_TO` subnets, a `SubnetTable` (numpy columns that read as
    a sequence of `Subnet`) above; `columns` gives the columns either way.
    """

    run_dir: Path
    hardware_id: str
    generated: str
    target: Mapping[str, Any]
    supernet_hash: str | None
    supernet_params: int | None
    hardware: Mapping[str, Any]
    versions: Mapping[str, Any]
    subnets: tuple[Subnet, ...] | SubnetTable
    best: BestSubnet
    verified: tuple[Verified, ...]
    acceptance_dataset: str | None
    acceptance: tuple[AcceptanceCurve, ...]
    predictor: PredictorInfo | None
    aifd: AifdInfo | None
    history: tuple[HistoryPoint, ...]
    cross_hardware: CrossHardware | None
    searched_hardware_ids: tuple[str, ...]
    exported_specs: frozenset[str] = field(default_factory=frozenset)
    paired: PairedSpeedups | None = None  # with a second searched hardware id
    training: TrainingCurve | None = None

    @cached_property
    def columns(self) -> SubnetTable:
        """Every subnet as columns (what the figures of a large search draw from)."""
        return SubnetTable.of(self.subnets)

    @cached_property
    def front(self) -> tuple[Subnet, ...]:
        """The Pareto front, by predicted speedup, best first."""
        on_front = (self.subnets.take(self.subnets.on_front)
                    if isinstance(self.subnets, SubnetTable)
                    else (s for s in self.subnets if s.on_front))
        return tuple(sorted(on_front, key=lambda s: (-s.speedup, s.draft_ms, s.spec_id)))

    @cached_property
    def best_subnet(self) -> Subnet | None:
        """The best subnet's trials row (None if best.json names a subnet missing from trials)."""
        if isinstance(self.subnets, SubnetTable):
            row = self.subnets.index_of(self.best.spec_id)
            return None if row is None else self.subnets[row]
        return next((s for s in self.subnets if s.spec_id == self.best.spec_id), None)

    def summary(self) -> dict[str, Any]:
        """Short JSON-able summary (what `dreams-nas report --json` prints besides the paths)."""
        return {
            "hardware_id": self.hardware_id,
            "best": self.best.spec_id,
            "predicted_speedup": round(self.best.predicted_speedup, 4),
            "measured_speedup": (None if self.best.measured_speedup is None
                                 else round(self.best.measured_speedup, 4)),
            "n_subnets": len(self.subnets),
            "front": [s.spec_id for s in self.front],
            "hardware_ids": list(self.searched_hardware_ids),
        }
