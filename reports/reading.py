"""Reading the run folder's JSON and CSV files, and their cells, the way every loader does.

Errors name the file and say which command rewrites it; cells that are empty, missing or not
numbers read as None, so a loader decides what an absent value means.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from dreams_nas.reports.values import ReportError


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ReportError(
            f"{path} is not valid JSON (line {exc.lineno}: {exc.msg}); rerun the command that "
            "wrote it"
        ) from None


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None when there is no such file."""
    if not path.is_file():
        return None
    data = read_json(path)
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


def flag(value: Any) -> bool:
    """A 0/1 (or true/false) cell."""
    return str(value).strip().lower() in {"1", "true", "yes", "1.0"}
