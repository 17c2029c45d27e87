"""Acceptance rows and their cache, `acceptance/<dataset-id>.csv` (schema in SCHEMAS.md).

A row is one subnet's measured acceptance on one dataset with one trained supernet. The file
is appended under a lock as rows are scored, so a killed scoring run resumes where it
stopped. Rows are keyed by (supernet hash, dataset id, spec, temperature, dtype,
max_new_tokens): everything the measured acceptance depends on, so a row scored under other
settings is never reused. A file that holds another supernet's rows is refused, never mixed
in; so is a file of another header (another dreams-nas version's columns), in one line naming
the columns it lacks or adds and `dreams-nas score`, which writes it anew.

Every row is checked when it is made and when it is read (`AcceptanceRow.__post_init__`): a
row that is impossible (tau outside [1, draft_len + 1], a rate outside [0, 1], ...) would win the
search at a speedup that does not exist, so the file holding one is refused, naming the line.
Only a last line torn by a kill (no line end) is skipped: it is scored again.
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
from dreams_nas.supernet.core.io import append_csv_rows, check_header
from dreams_nas.supernet.core.spec import SubnetSpec

MAX_POSITIONS = 7  # accept_rate_1 .. accept_rate_7
_RATE_COLUMNS = tuple(f"accept_rate_{i}" for i in range(1, MAX_POSITIONS + 1))
ACCEPTANCE_COLUMNS: tuple[str, ...] = (
    "supernet_hash", "dataset_id", "spec_id", "heads", "visual_keep", "inject_layer",
    "draft_len", "tree", "depth", "mlp", "draft_vocab", "temperature", "dtype", "max_new_tokens",
    "method", "tau", "tau_lo", "tau_hi", "n_prompts", "n_tokens", *_RATE_COLUMNS, "context_len",
)
# The columns every row has a cell in (the accept rates stop at the row's draft_len).
_CELL_COLUMNS = tuple(c for c in ACCEPTANCE_COLUMNS if c not in _RATE_COLUMNS)
TAU_METHODS = ("teacher-forced", "sampled", "expected")
# Slack on the bounds of tau: it is a ratio of token counts, exact up to float rounding.
TAU_TOLERANCE = 1e-6


def _check_dtype(dtype: str, owner: str) -> None:
    if dtype not in DTYPES:
        raise InputError(f"dtype {dtype!r} of {owner} is not one of {list(DTYPES)}")


def _check_max_new_tokens(max_new_tokens: int, owner: str) -> None:
    if max_new_tokens < 0:
        raise InputError(f"max_new_tokens={max_new_tokens} of {owner} must be >= 0")


def _check_tau(spec: SubnetSpec, tau: float, tau_lo: float, tau_hi: float) -> None:
    """tau, tokens per target forward with the bonus token, lies in [1, draft_len + 1] (no draft
    token accepted .. all draft_len accepted), inside its finite interval [tau_lo, tau_hi]."""
    owner = f"the acceptance row of {spec.id}"
    top = spec.draft_len + 1
    if not math.isfinite(tau) or not 1 - TAU_TOLERANCE <= tau <= top + TAU_TOLERANCE:
        raise InputError(
            f"tau={tau} of {owner} is not in [1, {top}]: a target forward yields 1 to "
            f"draft_len + 1 = {top} tokens")
    for name, value in (("tau_lo", tau_lo), ("tau_hi", tau_hi)):
        if not math.isfinite(value):
            raise InputError(f"{name}={value} of {owner} must be a finite number")
    if not tau_lo - TAU_TOLERANCE <= tau <= tau_hi + TAU_TOLERANCE:
        raise InputError(
            f"tau={tau} of {owner} is outside its interval [tau_lo={tau_lo}, tau_hi={tau_hi}]")


def _check_rates(spec: SubnetSpec, rates: tuple[float, ...]) -> None:
    """One rate per drafted position at most, each a fraction in [0, 1]; NaN where no cycle
    proposed that position (e.g. every answer ended first)."""
    owner = f"the acceptance row of {spec.id}"
    if len(rates) > spec.draft_len:
        raise InputError(f"{owner} has {len(rates)} accept rates, more than its draft_len "
                         f"{spec.draft_len} positions")
    for i, rate in enumerate(rates, start=1):
        if not math.isnan(rate) and not 0.0 <= rate <= 1.0:
            raise InputError(f"accept_rate_{i}={rate} of {owner} is not a fraction in [0, 1] "
                             "(or nan: no cycle proposed that position)")


def _check_counts(spec: SubnetSpec, counts: Mapping[str, int]) -> None:
    for name, value in counts.items():
        if value < 0:
            raise InputError(f"{name}={value} of the acceptance row of {spec.id} must be >= 0")


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
        if self.method not in TAU_METHODS:
            raise InputError(f"acceptance method {self.method!r} is not one of {list(TAU_METHODS)}")
        for name in ("tau", "tau_lo", "tau_hi", "temperature"):
            object.__setattr__(self, name, float(getattr(self, name)))
        _check_tau(self.spec, self.tau, self.tau_lo, self.tau_hi)
        _check_dtype(self.dtype, f"the acceptance row of {self.spec.id}")
        _check_max_new_tokens(self.max_new_tokens, f"the acceptance row of {self.spec.id}")
        object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))
        object.__setattr__(self, "accept_rates", tuple(float(r) for r in self.accept_rates))
        _check_rates(self.spec, self.accept_rates)
        _check_counts(self.spec, {"n_prompts": self.n_prompts, "n_tokens": self.n_tokens,
                                  "context_len": self.context_len})

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
        """The row of one record (`tree` empty for a chain); a record without one of this
        version's columns (another version wrote it) is one InputError naming them."""
        missing = [c for c in _CELL_COLUMNS if c not in row]
        if missing:
            raise InputError(
                f"the acceptance row of {row.get('spec_id') or '?'} lacks {missing}: another "
                "dreams-nas version wrote it; score it again with `dreams-nas score`")
        spec = SubnetSpec(
            heads=int(row["heads"]), visual_keep=float(row["visual_keep"]),
            inject_layer=int(row["inject_layer"]), draft_len=int(row["draft_len"]),
            tree=row["tree"] or (), depth=int(row["depth"]), mlp=float(row["mlp"]),
            draft_vocab=float(row["draft_vocab"]),
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


def _text(path: Path) -> str:
    """The file's text; bytes that are not UTF-8 (damage: the writer writes UTF-8) are one
    line naming the file, the offset and the fix."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                         f"{exc.start}): the file is damaged; move it aside and rerun "
                         "`dreams-nas score`") from None


def _read_header(path: Path) -> list[str] | None:
    """The first CSV record of `path`, or None when the file is absent or empty."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    return next(csv.reader(io.StringIO(_text(path), newline="")), [])


def _complete_records(path: Path) -> list[tuple[int, dict[str, str]]]:
    """(line number, cells) of each record of `path` after the header, a torn last one left out.

    The writer ends every row with a line end, so a last line without one was cut by a kill
    (`append_csv_rows` drops it before appending). Any other record with too few or too many
    cells is damage, refused naming its line.
    """
    text = _text(path)
    records: list[tuple[int, dict[str, str]]] = []
    reader = csv.DictReader(io.StringIO(text))
    for raw in reader:
        records.append((reader.line_num, raw))
    if records and not text.endswith("\n"):
        records.pop()  # torn by a kill mid-append
    for line, raw in records:
        if None in raw or any(v is None for v in raw.values()):
            extra = raw.pop(None, None) or []
            cells = sum(v is not None for v in raw.values()) + len(extra)
            raise InputError(
                f"{path} line {line} has {cells} cells, not the header's "
                f"{len(reader.fieldnames or [])}: the file is damaged; move it aside and rerun "
                "`dreams-nas score`"
            )
    return records


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

    def _check_header(self) -> None:
        """Refuse, in one line, a file whose header is not this version's (ACCEPTANCE_COLUMNS):
        the columns it lacks and adds, and the command that writes it anew."""
        header = _read_header(self.path)
        if header is not None:
            check_header(self.path, header, ACCEPTANCE_COLUMNS,
                         "run `dreams-nas score` to score the subnets again")

    def _is_mine(self, row: AcceptanceRow) -> bool:
        return (row.temperature == self.temperature and row.dtype == self.dtype
                and row.max_new_tokens == self.max_new_tokens)

    def load(self) -> dict[SubnetSpec, AcceptanceRow]:
        """This table's rows already scored, by spec (the last row wins if a spec was appended
        twice). Rows of other temperatures, dtypes or budgets are not this table's: they are
        skipped, and stay in the file.

        Every row is checked (`AcceptanceRow`), this table's or not: one that is damaged or
        impossible is an InputError naming the file and line, never used and never skipped. A
        last line torn by a kill (the file does not end with a line end) is skipped: its spec
        is scored again."""
        self._check_header()
        if not self.path.exists():
            return {}
        out: dict[SubnetSpec, AcceptanceRow] = {}
        for line, raw in _complete_records(self.path):
            if raw["supernet_hash"] != self.supernet_hash:
                raise InputError(
                    f"{self.path} line {line} was scored with supernet "
                    f"{raw['supernet_hash']}, not this run's supernet {self.supernet_hash}; "
                    "acceptance of different supernets cannot be mixed: move the file "
                    "aside and rerun `dreams-nas score`"
                )
            row = self._parse(line, raw)
            if row.dataset_id == self.dataset_id and self._is_mine(row):
                out[row.spec] = row
        return out

    def _parse(self, line: int, raw: Mapping[str, str]) -> AcceptanceRow:
        """The row of one complete record; a damaged or impossible one is refused, naming the
        file, the line, the spec and what is wrong."""
        try:
            return AcceptanceRow.from_csv_row(raw)
        except (KeyError, ValueError, TypeError) as exc:
            why = str(exc) if isinstance(exc, InputError) else f"a cell does not parse ({exc})"
            raise InputError(
                f"{self.path} line {line} (spec {raw.get('spec_id') or '?'}) is not a valid "
                f"acceptance row: {why}; move the file aside and rerun `dreams-nas score` "
                "to measure it again"
            ) from None

    def append(self, rows: Iterable[AcceptanceRow]) -> int:
        """Append rows of this table's supernet, dataset, dtype and budget (another's are
        refused), to a file of this version's header. Returns the number of rows written."""
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
        self._check_header()
        return append_csv_rows(self.path, (r.to_csv_row() for r in rows), ACCEPTANCE_COLUMNS)
