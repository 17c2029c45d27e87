"""Reading the run folder's JSON and CSV files, and their cells, the way every loader does.

Errors name the file and say which command rewrites it; cells that are empty, missing or not
numbers read as None, so a loader decides what an absent value means.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

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


def csv_header(path: Path) -> list[str]:
    """The column names of a CSV file (empty for an empty file)."""
    with path.open(newline="", encoding="utf-8") as handle:
        return next(csv.reader(handle), [])


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
