"""Acceptance rows and their cache, `acceptance/<dataset-id>.csv` (schema in SCHEMAS.md).

A row is one subnet's measured acceptance on one dataset with one trained supernet. The file
is appended under a lock as rows are scored, so a killed scoring run resumes where it
stopped. Rows are keyed by (supernet hash, dataset id, spec, temperature, dtype,
max_new_tokens): everything the measured acceptance depends on, so a row scored under other
settings is never reused. A file that holds another supernet's rows is refused, never mixed
in. A file written before `dtype` and `max_new_tokens` were recorded is migrated once (its
rows kept with those cells empty: they match no table and are scored again).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dreams_nas.supernet.core.device import DTYPES
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.io import append_csv_rows, atomic_write_text, locked
from dreams_nas.supernet.core.space import SubnetSpec

MAX_POSITIONS = 7  # accept_rate_1 .. accept_rate_7
_RATE_COLUMNS = tuple(f"accept_rate_{i}" for i in range(1, MAX_POSITIONS + 1))
ACCEPTANCE_COLUMNS: tuple[str, ...] = (
    "supernet_hash", "dataset_id", "spec_id", "heads", "visual_keep", "inject_layer",
    "draft_len", "temperature", "dtype", "max_new_tokens", "method", "tau", "tau_lo", "tau_hi",
    "n_prompts", "n_tokens", *_RATE_COLUMNS, "context_len",
)
# The header of files written before dtype and max_new_tokens were part of the key.
LEGACY_COLUMNS: tuple[str, ...] = tuple(
    c for c in ACCEPTANCE_COLUMNS if c not in ("dtype", "max_new_tokens")
)
METHODS = ("teacher-forced", "sampled", "expected")


def _check_dtype(dtype: str, owner: str) -> None:
    if dtype not in DTYPES:
        raise InputError(f"dtype {dtype!r} of {owner} is not one of {list(DTYPES)}")


def _check_max_new_tokens(max_new_tokens: int, owner: str) -> None:
    if max_new_tokens < 0:
        raise InputError(f"max_new_tokens={max_new_tokens} of {owner} must be >= 0")


@dataclass(frozen=True)
class AcceptanceRow:
    """tau (tokens per target forward, bonus included) of one subnet on one dataset.

    accept_rates[i]: over the cycles that proposed a draft token at position i+1, the
    fraction in which it was accepted (as the engine's `GenerationStats.accept_rates`).
    dtype: the dtype the target and draft ran in; max_new_tokens: the budget of the greedy
    answers scored (both change acceptance, so both are part of the row's key).
    """

    spec: SubnetSpec
    tau: float
    tau_lo: float
    tau_hi: float
    supernet_hash: str
    dataset_id: str
    temperature: float = 0.0
    dtype: str = "float32"
    max_new_tokens: int = 0
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
        _check_dtype(self.dtype, f"the acceptance row of {self.spec.id}")
        _check_max_new_tokens(self.max_new_tokens, f"the acceptance row of {self.spec.id}")
        object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))
        object.__setattr__(self, "accept_rates", tuple(float(r) for r in self.accept_rates))

    @property
    def tau_ci(self) -> tuple[float, float]:
        return (self.tau_lo, self.tau_hi)

    def to_csv_row(self) -> dict[str, Any]:
        rates = list(self.accept_rates[:MAX_POSITIONS])
        row: dict[str, Any] = {
            "supernet_hash": self.supernet_hash, "dataset_id": self.dataset_id,
            "spec_id": self.spec.id, **self.spec.to_fields(),
            "temperature": self.temperature, "dtype": self.dtype,
            "max_new_tokens": self.max_new_tokens, "method": self.method,
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
            dtype=row["dtype"], max_new_tokens=int(row["max_new_tokens"]),
            method=row["method"], n_prompts=int(row["n_prompts"] or 0),
            n_tokens=int(row["n_tokens"] or 0), context_len=int(row["context_len"] or 0),
            accept_rates=tuple(rates),
        )


def _read_header(path: Path) -> list[str] | None:
    """The first CSV record of `path`, or None when the file is absent or empty."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    with path.open(newline="", encoding="utf-8") as handle:
        return next(csv.reader(handle), [])


def _migrate_legacy(path: Path) -> None:
    """Rewrite a file of the old header (no `dtype`, `max_new_tokens`) with the current one.

    Every complete old row is kept, its `dtype` and `max_new_tokens` cells empty (the settings
    it was scored under were not recorded, so it matches no table and is scored again); a line
    torn by a kill is dropped, as `load` would skip it. Done under the file's lock, atomically,
    and only if the header is still the old one once the lock is held (another process may
    have migrated it meanwhile). Must not be called with the lock held: it is not reentrant.
    """
    with locked(path):
        if _read_header(path) != list(LEGACY_COLUMNS):
            return
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(ACCEPTANCE_COLUMNS), restval="")
        writer.writeheader()
        with path.open(newline="", encoding="utf-8") as handle:
            for raw in csv.DictReader(handle):
                if None in raw or any(v is None for v in raw.values()):
                    continue  # torn by a kill
                writer.writerow(raw)
        atomic_write_text(path, out.getvalue())


class AcceptanceTable:
    """The cached rows of one (supernet, dataset, temperature, dtype, max_new_tokens) in one
    CSV file; the file may hold rows of other temperatures, dtypes and budgets too."""

    def __init__(self, path: str | Path, supernet_hash: str, dataset_id: str,
                 temperature: float = 0.0, *, dtype: str = "float32",
                 max_new_tokens: int = 64) -> None:
        _check_dtype(dtype, "the acceptance table")
        _check_max_new_tokens(int(max_new_tokens), "the acceptance table")
        self.path = Path(path)
        self.supernet_hash = supernet_hash
        self.dataset_id = dataset_id
        self.temperature = float(temperature)
        self.dtype = dtype
        self.max_new_tokens = int(max_new_tokens)

    def _ensure_current_header(self) -> None:
        """Migrate an old-header file once; refuse a file that is no acceptance file at all."""
        header = _read_header(self.path)
        if header is None or header == list(ACCEPTANCE_COLUMNS):
            return
        if header == list(LEGACY_COLUMNS):
            _migrate_legacy(self.path)
            return
        missing = [c for c in ACCEPTANCE_COLUMNS if c not in header]
        unknown = [c for c in header if c not in ACCEPTANCE_COLUMNS]
        raise InputError(
            f"{self.path} is not an acceptance file of this version (missing column(s) "
            f"{missing}, unknown {unknown}); move it aside and run `dreams-nas score`"
        )

    def _is_mine(self, row: AcceptanceRow) -> bool:
        return (row.temperature == self.temperature and row.dtype == self.dtype
                and row.max_new_tokens == self.max_new_tokens)

    def load(self) -> dict[SubnetSpec, AcceptanceRow]:
        """This table's rows already scored, by spec (the last row wins if a spec was appended
        twice). Rows of other temperatures, dtypes or budgets, and migrated rows whose dtype is
        empty, are not this table's: they are skipped, and stay in the file."""
        self._ensure_current_header()
        if not self.path.exists():
            return {}
        out: dict[SubnetSpec, AcceptanceRow] = {}
        with self.path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
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
                if raw["dataset_id"] != self.dataset_id or raw["dtype"] != self.dtype:
                    continue  # another dataset, dtype, or a migrated row (empty dtype)
                try:
                    row = AcceptanceRow.from_csv_row(raw)
                except (KeyError, ValueError):
                    continue  # torn last line
                if self._is_mine(row):
                    out[row.spec] = row
        return out

    def append(self, rows: Iterable[AcceptanceRow]) -> int:
        """Append rows of this table's supernet, dataset, dtype and budget (another's are
        refused); migrates an old-header file first. Returns the number of rows written."""
        rows = list(rows)
        for row in rows:
            if row.supernet_hash != self.supernet_hash or row.dataset_id != self.dataset_id:
                raise InputError(
                    f"acceptance row of {row.spec.id} belongs to supernet {row.supernet_hash} / "
                    f"dataset {row.dataset_id}, not {self.supernet_hash} / {self.dataset_id}"
                )
            if row.dtype != self.dtype or row.max_new_tokens != self.max_new_tokens:
                raise InputError(
                    f"acceptance row of {row.spec.id} was scored in {row.dtype} with "
                    f"max_new_tokens={row.max_new_tokens}, not this table's {self.dtype} with "
                    f"max_new_tokens={self.max_new_tokens}; score it with the table's settings"
                )
        self._ensure_current_header()
        return append_csv_rows(self.path, (r.to_csv_row() for r in rows), ACCEPTANCE_COLUMNS)
