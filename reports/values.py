"""The values of the report: what the figures and the page show, as frozen dataclasses.

`build_report_data` (data.py) fills them from a run folder; the figure modules and html.py only
draw them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, overload

import numpy as np


class ReportError(ValueError):
    """A run folder or an option the report cannot be built from; the message says the fix."""


class MissingResultsError(ReportError, FileNotFoundError):
    """The run has no search results yet (or lacks another file the report cannot do without)."""


# --- the values ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Subnet:
    """One evaluated subnet (a row of search/<hardware-id>/trials.csv)."""

    spec_id: str
    heads: int
    visual_keep: float
    inject_layer: int
    draft_len: int
    tau: float
    tau_lo: float | None
    tau_hi: float | None
    draft_ms: float
    first_draft_ms: float
    verify_ms: float | None
    decode_ms: float | None
    speedup: float
    draft_params: int | None
    feasible: bool
    on_front: bool
    number: int | None = None
    draft_bytes: int | None = None  # the draft's memory at the search's context (trials.csv)
    tree: str = ""  # a token tree's shape (``4x2x1``); empty: a chain of draft_len
    recorded_cycle_ms: float | None = None  # trials.csv `cycle_ms` (None: not written)
    depth: int = 1  # decoder layers on each side of the cross-attention (trials.csv; 1 before)
    mlp: float = 1.0  # share of the MLP's channels kept (trials.csv; 1.0 before)
    draft_vocab: float = 1.0  # share of the target's vocabulary drafted (trials.csv; 1.0 before)

    @property
    def shape(self) -> str:
        """``chain γ=5`` or ``tree 4x2x1``: what one cycle drafts."""
        return f"tree {self.tree}" if self.tree else f"chain γ={self.draft_len}"

    @property
    def cycle_draft_ms(self) -> float:
        """Draft time per speculative cycle: the first step (right after the verify) and the
        hot ones, as the expected speedup counts them (a chain's draft_len - 1; a tree's, one
        per level at its width, from the recorded cycle)."""
        if self.recorded_cycle_ms is not None and self.verify_ms is not None:
            return self.recorded_cycle_ms - self.verify_ms
        return self.first_draft_ms + (self.draft_len - 1) * self.draft_ms

    @property
    def cycle_ms(self) -> float | None:
        """One speculative cycle: its draft steps and the target's verify (None: verify
        unknown)."""
        return None if self.verify_ms is None else self.cycle_draft_ms + self.verify_ms


_OPTIONAL = frozenset({"tau_lo", "tau_hi", "verify_ms", "decode_ms",
                       "recorded_cycle_ms"})  # NaN: None
_WHOLE = frozenset({"draft_params", "number", "draft_bytes"})  # whole numbers as floats; NaN: None


def _known(value: float) -> float | None:
    return None if value != value else value  # NaN: an empty or unreadable cell


def _whole(value: float) -> int | None:
    return None if value != value else int(value)


@dataclass(frozen=True, eq=False)
class SubnetTable(Sequence[Subnet]):
    """Every scored subnet of a search as numpy columns, one row per subnet: what the report
    reads a large search into, so 10^6 subnets never exist as 10^6 objects.

    It is also a read-only sequence of `Subnet` (each one built when read); `take` builds a few
    at once. NaN stands for an empty cell (None on a `Subnet`).
    """

    spec_id: np.ndarray  # (n,) str
    heads: np.ndarray  # (n,) int64
    visual_keep: np.ndarray  # (n,) float64
    inject_layer: np.ndarray  # (n,) int64
    draft_len: np.ndarray  # (n,) int64
    tau: np.ndarray  # (n,) float64
    tau_lo: np.ndarray  # (n,) float64, NaN: unknown
    tau_hi: np.ndarray  # (n,) float64, NaN: unknown
    draft_ms: np.ndarray  # (n,) float64
    first_draft_ms: np.ndarray  # (n,) float64
    verify_ms: np.ndarray  # (n,) float64, NaN: unknown
    decode_ms: np.ndarray  # (n,) float64, NaN: unknown
    speedup: np.ndarray  # (n,) float64
    draft_params: np.ndarray  # (n,) float64 holding whole numbers, NaN: unknown
    feasible: np.ndarray  # (n,) bool
    on_front: np.ndarray  # (n,) bool
    number: np.ndarray  # (n,) float64 holding whole numbers, NaN: unknown
    draft_bytes: np.ndarray  # (n,) float64 holding whole numbers, NaN: unknown
    tree: np.ndarray  # (n,) str, "" a chain
    recorded_cycle_ms: np.ndarray  # (n,) float64, NaN: not written (the chain formula)
    depth: np.ndarray  # (n,) int64, 1 where trials.csv has no depth
    mlp: np.ndarray  # (n,) float64, 1.0 where trials.csv has no mlp
    draft_vocab: np.ndarray  # (n,) float64, 1.0 where trials.csv has no draft_vocab

    COLUMNS = ("spec_id", "heads", "visual_keep", "inject_layer", "draft_len", "tau", "tau_lo",
               "tau_hi", "draft_ms", "first_draft_ms", "verify_ms", "decode_ms", "speedup",
               "draft_params", "feasible", "on_front", "number", "draft_bytes", "tree",
               "recorded_cycle_ms", "depth", "mlp", "draft_vocab")

    @classmethod
    def of(cls, subnets: Sequence[Subnet]) -> SubnetTable:
        """The columns of `subnets` (a table is returned as it is)."""
        if isinstance(subnets, SubnetTable):
            return subnets

        def column(name: str, dtype: Any) -> np.ndarray:
            values = [getattr(s, name) for s in subnets]
            if dtype is np.float64:
                values = [np.nan if v is None else v for v in values]
            return np.array(values, dtype=dtype)

        types = {"spec_id": str, "tree": str, "heads": np.int64, "inject_layer": np.int64,
                 "draft_len": np.int64, "depth": np.int64, "feasible": bool, "on_front": bool}
        return cls(**{name: column(name, types.get(name, np.float64)) for name in cls.COLUMNS})

    def __len__(self) -> int:
        return len(self.speedup)

    @overload
    def __getitem__(self, index: int) -> Subnet: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Subnet, ...]: ...

    def __getitem__(self, index: int | slice) -> Subnet | tuple[Subnet, ...]:
        if isinstance(index, slice):
            return self.take(np.arange(len(self))[index])
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"subnet {index} of a table of {n}")
        return self.take([index % n])[0]

    def __iter__(self) -> Iterator[Subnet]:
        for start in range(0, len(self), 4096):
            yield from self.take(np.arange(start, min(start + 4096, len(self))))

    def rows(self, index: Any) -> SubnetTable:
        """The table of the rows `index` selects (a boolean mask or indices)."""
        return SubnetTable(**{name: getattr(self, name)[index] for name in self.COLUMNS})

    def take(self, index: Any) -> tuple[Subnet, ...]:
        """The rows `index` selects (a boolean mask or indices) as `Subnet` objects."""
        part = self.rows(index)
        columns = []
        for name in self.COLUMNS:
            values = getattr(part, name).tolist()
            if name in _OPTIONAL:
                values = [_known(v) for v in values]
            elif name in _WHOLE:
                values = [_whole(v) for v in values]
            columns.append(values)
        return tuple(Subnet(**dict(zip(self.COLUMNS, row, strict=True)))
                     for row in zip(*columns, strict=True))

    def index_of(self, spec_id: str) -> int | None:
        """The row of `spec_id` (None when the search did not score it)."""
        hits = np.flatnonzero(self.spec_id == spec_id)
        return int(hits[0]) if hits.size else None

    @property
    def cycle_draft_ms(self) -> np.ndarray:
        """(n,) draft time per cycle, as `Subnet.cycle_draft_ms`."""
        chain = self.first_draft_ms + (self.draft_len - 1) * self.draft_ms
        recorded = self.recorded_cycle_ms - self.verify_ms
        return np.where(np.isnan(recorded), chain, recorded)

    @property
    def is_tree(self) -> np.ndarray:
        """(n,) bool: the subnet drafts a token tree."""
        return self.tree != ""

    @property
    def is_elastic_size(self) -> bool:
        """Whether any subnet has another depth or MLP width than the paper's draft (1, 1.0):
        the report then shows both fields."""
        return bool(len(self) and ((self.depth != 1).any() or (self.mlp != 1.0).any()))

    @property
    def is_draft_vocab(self) -> bool:
        """Whether any subnet drafts over less than the target's whole vocabulary
        (`draft_vocab` below 1): the report then shows that field."""
        return bool(len(self) and (self.draft_vocab != 1.0).any())

    @property
    def cycle_ms(self) -> np.ndarray:
        """(n,) one speculative cycle, as `Subnet.cycle_ms` (NaN: verify unknown)."""
        return self.cycle_draft_ms + self.verify_ms


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
