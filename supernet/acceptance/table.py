"""Acceptance rows and their cache, `acceptance/<dataset-id>.csv` (schema in SCHEMAS.md).

A row is one subnet's measured acceptance on one dataset with one trained supernet. The file
is appended under a lock as rows are scored, so a killed scoring run resumes where it
stopped. Rows are keyed by (supernet hash, dataset id, spec, temperature); a file that holds
another supernet's rows is refused, never mixed in.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.io import append_csv_rows
from dreams_nas.supernet.core.space import SubnetSpec

MAX_POSITIONS = 7  # accept_rate_1 .. accept_rate_7
ACCEPTANCE_COLUMNS: tuple[str, ...] = (
    "supernet_hash", "dataset_id", "spec_id", "heads", "visual_keep", "inject_layer",
    "draft_len", "temperature", "method", "tau", "tau_lo", "tau_hi", "n_prompts", "n_tokens",
    *(f"accept_rate_{i}" for i in range(1, MAX_POSITIONS + 1)), "context_len",
)
METHODS = ("teacher-forced", "sampled", "expected")


@dataclass(frozen=True)
class AcceptanceRow:
    """tau (tokens per target forward, bonus included) of one subnet on one dataset.

    accept_rates[i]: over the cycles that proposed a draft token at position i+1, the
    fraction in which it was accepted (as the engine's `GenerationStats.accept_rates`).
    """

    spec: SubnetSpec
    tau: float
    tau_lo: float
    tau_hi: float
    supernet_hash: str
    dataset_id: str
    temperature: float = 0.0
    method: str = "teacher-forced"
    n_prompts: int = 0
    n_tokens: int = 0
    context_len: int = 0
    accept_rates: tuple[float, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InputError(f"acceptance method {self.method!r} is not one of {list(METHODS)}")
        if not math.isfinite(self.tau) or self.tau < 0:
            raise InputError(f"tau={self.tau} of {self.spec.id} must be a finite number >= 0")
        object.__setattr__(self, "accept_rates", tuple(float(r) for r in self.accept_rates))

    @property
    def tau_ci(self) -> tuple[float, float]:
        return (self.tau_lo, self.tau_hi)

    def to_csv_row(self) -> dict[str, Any]:
        rates = list(self.accept_rates[:MAX_POSITIONS])
        row: dict[str, Any] = {
            "supernet_hash": self.supernet_hash, "dataset_id": self.dataset_id,
            "spec_id": self.spec.id, **self.spec.to_fields(),
            "temperature": self.temperature, "method": self.method,
            "tau": repr(float(self.tau)), "tau_lo": repr(float(self.tau_lo)),
            "tau_hi": repr(float(self.tau_hi)), "n_prompts": self.n_prompts,
            "n_tokens": self.n_tokens, "context_len": self.context_len,
        }
        for i in range(MAX_POSITIONS):
            row[f"accept_rate_{i + 1}"] = repr(rates[i]) if i < len(rates) else ""
        return row

    @classmethod
    def from_csv_row(cls, row: Mapping[str, str]) -> AcceptanceRow:
        spec = SubnetSpec(
            heads=int(row["heads"]), visual_keep=float(row["visual_keep"]),
            inject_layer=int(row["inject_layer"]), draft_len=int(row["draft_len"]),
        )
        rates = []
        for i in range(1, MAX_POSITIONS + 1):
            text = row.get(f"accept_rate_{i}", "")
            if text in ("", None):
                break
            rates.append(float(text))
        return cls(
            spec=spec, tau=float(row["tau"]), tau_lo=float(row["tau_lo"]),
            tau_hi=float(row["tau_hi"]), supernet_hash=row["supernet_hash"],
            dataset_id=row["dataset_id"], temperature=float(row["temperature"]),
            method=row["method"], n_prompts=int(row["n_prompts"] or 0),
            n_tokens=int(row["n_tokens"] or 0), context_len=int(row["context_len"] or 0),
            accept_rates=tuple(rates),
        )


class AcceptanceTable:
    """The cached rows of one (supernet, dataset, temperature) in one CSV file."""

    def __init__(self, path: str | Path, supernet_hash: str, dataset_id: str,
                 temperature: float = 0.0) -> None:
        self.path = Path(path)
        self.supernet_hash = supernet_hash
        self.dataset_id = dataset_id
        self.temperature = float(temperature)

    def load(self) -> dict[SubnetSpec, AcceptanceRow]:
        """Rows already scored, by spec (the last row wins if a spec was appended twice)."""
        if not self.path.exists():
            return {}
        out: dict[SubnetSpec, AcceptanceRow] = {}
        with self.path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in ("supernet_hash", "dataset_id", "tau", "heads")
                       if c not in (reader.fieldnames or [])]
            if missing:
                raise InputError(
                    f"{self.path} is not an acceptance file (no column(s) {missing}); move it "
                    "aside and run `dreams-nas score`"
                )
            for line, raw in enumerate(reader, start=2):
                if None in raw or any(v is None for v in raw.values()):
                    continue  # a line torn by a kill: it is scored again
                if raw["supernet_hash"] != self.supernet_hash:
                    raise InputError(
                        f"{self.path} line {line} was scored with supernet "
                        f"{raw['supernet_hash']}, not this run's supernet {self.supernet_hash}; "
                        "acceptance of different supernets cannot be mixed: move the file "
                        "aside and rerun `dreams-nas score`"
                    )
                if raw["dataset_id"] != self.dataset_id:
                    continue
                try:
                    row = AcceptanceRow.from_csv_row(raw)
                except (KeyError, ValueError):
                    continue  # torn last line
                if row.temperature == self.temperature:
                    out[row.spec] = row
        return out

    def append(self, rows: Iterable[AcceptanceRow]) -> int:
        rows = list(rows)
        for row in rows:
            if row.supernet_hash != self.supernet_hash or row.dataset_id != self.dataset_id:
                raise InputError(
                    f"acceptance row of {row.spec.id} belongs to supernet {row.supernet_hash} / "
                    f"dataset {row.dataset_id}, not {self.supernet_hash} / {self.dataset_id}"
                )
        return append_csv_rows(self.path, (r.to_csv_row() for r in rows), ACCEPTANCE_COLUMNS)
