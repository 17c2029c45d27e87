"""The scored subnets of a search: one `Subnet` per trials.csv row, or all of them as numpy
columns (`SubnetTable`) that read as a sequence of `Subnet`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np


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
