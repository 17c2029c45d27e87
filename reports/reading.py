"""Reading the run folder's JSON and CSV files, and their cells, the way every loader does.

Errors name the file and say which command rewrites it; cells that are empty, missing or not
numbers read as None, so a loader decides what an absent value means.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

import numpy as np
from dreams_nas.reports.errors import ReportError
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.io import read_json


def json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None when there is no such file."""
    if not path.is_file():
        return None
    try:
        data = read_json(path)
    except InputError as exc:  # malformed, not UTF-8, unreadable: the report cannot use it
        raise ReportError(str(exc)) from None
    if not isinstance(data, dict):
        raise ReportError(f"{path} must hold a JSON object; rerun the command that wrote it")
    return data


def read_csv(path: Path) -> list[dict[str, str]]:
    """Rows of a CSV file; a torn last line (a kill mid-append) is skipped."""
    text = path.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    return [dict(row) for row in csv.DictReader(text.splitlines())]


def whole_csv(path: Path, rewrite: str) -> bytes:
    """The bytes of a CSV file its command rewrites whole (atomically), so that no row of it is
    ever cut short: a last line without its newline, or a line of more or fewer fields than the
    header (a blank one included), is refused in one line naming the file, the line and
    `rewrite` (what writes it again)."""
    data = path.read_bytes()
    if not data:
        return data
    if not data.endswith(b"\n"):
        raise ReportError(f"{path} ends mid-row (its last line has no newline): it was cut "
                          f"short; {rewrite}")
    if b'"' in data:  # quoted cells may hold separators: the csv module counts the fields
        reader = csv.reader(io.StringIO(data.decode("utf-8", errors="replace"), newline=""))
        counts, lines = [], []
        for row in reader:
            counts.append(len(row))
            lines.append(reader.line_num)
    else:  # the bytes' separators before each line end (~1 s for 10^6 rows)
        buf = np.frombuffer(data, dtype=np.uint8)
        ends = np.flatnonzero(buf == ord("\n"))
        before = np.searchsorted(np.flatnonzero(buf == ord(",")), ends)
        counts = np.diff(before, prepend=0) + 1
        lines = np.arange(1, len(counts) + 1)
    bad = np.flatnonzero(np.asarray(counts) != counts[0])
    if bad.size:
        at = int(bad[0])
        raise ReportError(f"{path}, line {int(lines[at])}: {int(counts[at])} field(s) where the "
                          f"header has {int(counts[0])}; the file is damaged: {rewrite}")
    return data


def csv_header(path: Path) -> list[str]:
    """The column names of a CSV file (empty for an empty file); a byte that is not UTF-8
    reads as U+FFFD (the reader of the rows refuses the file)."""
    with path.open("rb") as handle:
        first = handle.readline().decode("utf-8", errors="replace")
    return next(csv.reader([first]), [])


def num(value: Any) -> float | None:
    """A float, or None for empty / missing / non-numeric / NaN cells."""
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def integer(value: Any) -> int | None:
    out = num(value)
    return None if out is None or math.isinf(out) else int(round(out))
