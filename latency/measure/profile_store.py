"""The profile store: ``latency/<hardware-id>/profile.csv``, append-only, one row per measurement.

A row is appended (under a lock, flushed whole) as soon as its step is timed, so a killed run
loses at most the row in flight. A rerun reads the keys already there -- (kind, spec_id,
context_len, k) -- and times only the rest; the append re-checks the keys under a lock so two
processes timing the same hardware id (two identical GPUs) never write a key twice. A file that
holds a key twice (two profiles concatenated, an edit) is refused on reading, naming both lines:
its second measurement would silently weigh in the fit.

A file of another header (another dreams-nas version's columns) is refused, read or appended
to, in one line naming the columns it lacks or adds and `dreams-nas profile`, which times it
anew: its rows are never read with defaults.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from dreams_nas.latency.kinds import DRAFT_KINDS, KINDS
from dreams_nas.latency.measure.hardware import HardwareInfo
from dreams_nas.latency.measure.plan import StepKey
from dreams_nas.latency.measure.timing import Timing
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.io import append_csv_rows, check_header, locked
from dreams_nas.supernet.core.spec import SIZE_DEFAULTS

PROFILE_COLUMNS: tuple[str, ...] = (
    "hardware_id", "kind", "spec_id", "heads", "visual_keep", "inject_layer", "draft_len",
    "depth", "mlp", "draft_vocab", "context_len", "k", "median_ms", "p10_ms", "p90_ms",
    "n_samples", "throttled", "status", "timestamp", "device", "dtype", "threads", "clock",
    "clock_mhz", "torch", "error", "samples_ms",
)
# The draft size columns (SubnetSpec.depth, .mlp and .draft_vocab): empty on target rows.
SIZE_COLUMNS: tuple[str, ...] = tuple(SIZE_DEFAULTS)
STATUSES = ("ok", "oom", "failed")
_INT_COLUMNS = ("context_len", "k", "n_samples", "throttled")
_FLOAT_COLUMNS = ("median_ms", "p10_ms", "p90_ms")


def make_row(
    hw: HardwareInfo,
    key: StepKey,
    timing: Timing | None,
    *,
    status: str = "ok",
    error: str = "",
    clock: str = "wall",
) -> dict[str, Any]:
    """One profile.csv row for `key` timed on `hw` (`timing` None for a failed step)."""
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {STATUSES}")
    spec = key.spec
    row: dict[str, Any] = {
        "hardware_id": hw.hardware_id, "kind": key.kind, "spec_id": key.spec_id,
        "heads": "" if spec is None else spec.heads,
        "visual_keep": "" if spec is None else f"{spec.visual_keep:g}",
        "inject_layer": "" if spec is None else spec.inject_layer,
        "draft_len": "" if spec is None else spec.draft_len,
        "depth": "" if spec is None else spec.depth,
        "mlp": "" if spec is None else f"{spec.mlp:g}",
        "draft_vocab": "" if spec is None else f"{spec.draft_vocab:g}",
        "context_len": key.context_len, "k": key.k,
        "median_ms": "", "p10_ms": "", "p90_ms": "", "n_samples": 0, "throttled": 0,
        "status": status, "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": hw.device, "dtype": hw.dtype, "threads": hw.threads or "",
        "clock": "cuda-events" if hw.kind == "cuda" else clock, "clock_mhz": "", "torch": hw.torch,
        "error": " ".join(error.split())[:300],
        "samples_ms": "",
    }
    if timing is not None:
        row.update(
            median_ms=f"{timing.median_ms:.6g}", p10_ms=f"{timing.p10_ms:.6g}",
            p90_ms=f"{timing.p90_ms:.6g}", n_samples=timing.n_samples,
            throttled=int(timing.throttled),
            clock_mhz=min(timing.clock_mhz) if timing.clock_mhz else "",
            samples_ms=" ".join(f"{s:.5g}" for s in timing.samples_ms),
        )
    return row


class ProfileStore:
    """Reads and appends one hardware id's profile.csv."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"ProfileStore({str(self.path)!r})"

    def exists(self) -> bool:
        return self.path.is_file() and self.path.stat().st_size > 0

    def read(self) -> pd.DataFrame:
        """Every complete row, validated; a corrupt line raises an error naming file and line.

        A last line without its newline is a row cut by a kill and is skipped (the next append
        removes it).
        """
        if not self.exists():
            return pd.DataFrame(columns=list(PROFILE_COLUMNS))
        raw = self.path.read_bytes()
        torn = not raw.endswith(b"\n")
        text = raw.decode("utf-8", errors="replace")
        lines = text.splitlines()
        if torn:
            lines = lines[:-1]
        reader = csv.reader(lines)
        header = next(reader, None)
        if header is None:
            return pd.DataFrame(columns=list(PROFILE_COLUMNS))
        self._check_header(header)
        records = []
        lines: dict[tuple[str, str, int, int], int] = {}  # key -> the line that recorded it
        for values in reader:
            line = reader.line_num
            if not values:
                continue
            if len(values) != len(header):
                self._corrupt(line, f"has {len(values)} fields where the header has {len(header)}")
            record = self._parse(dict(zip(header, values, strict=True)), line)
            key = (record["kind"], record["spec_id"], record["context_len"], record["k"])
            if key in lines:
                self._corrupt(line, f"key {list(key)} (kind, spec_id, context_len, k) was "
                                    f"recorded already on line {lines[key]}, and a key is timed "
                                    "once")
            lines[key] = line
            records.append(record)
        return pd.DataFrame.from_records(records, columns=list(PROFILE_COLUMNS))

    def _check_header(self, header: list[str]) -> None:
        check_header(self.path, header, PROFILE_COLUMNS,
                     "run `dreams-nas profile` to time the steps again")

    def _corrupt(self, line: int, problem: str) -> None:
        raise InputError(
            f"{self.path}, line {line}: {problem}; the profile is corrupt there: delete that line "
            "(rerunning `dreams-nas profile` re-measures it) or move the file aside"
        )

    def _parse(self, record: dict[str, Any], line: int) -> dict[str, Any]:
        if record["kind"] not in KINDS:
            self._corrupt(line, f"kind {record['kind']!r} is not one of {list(KINDS)}")
        if record["status"] not in STATUSES:
            self._corrupt(line, f"status {record['status']!r} is not one of {list(STATUSES)}")
        for name in _INT_COLUMNS:
            try:
                record[name] = int(record[name] or 0)
            except ValueError:
                self._corrupt(line, f"{name}={record[name]!r} is not a whole number")
        for name in _FLOAT_COLUMNS:
            text = record[name]
            if text == "" and record["status"] != "ok":
                record[name] = math.nan
                continue
            try:
                value = float(text)
            except ValueError:
                self._corrupt(line, f"{name}={text!r} is not a number")
            if not (math.isfinite(value) and value > 0):
                self._corrupt(line, f"{name}={text!r} must be a positive time in ms")
            record[name] = value
        drafted = record["kind"] in DRAFT_KINDS
        if drafted:
            try:
                record["heads"] = int(record["heads"])
                record["visual_keep"] = float(record["visual_keep"])
            except ValueError:
                self._corrupt(line, "a draft row needs whole-number heads and a numeric "
                                    "visual_keep")
            for name in SIZE_COLUMNS:
                record[name] = self._size(record[name], name, line)
        return record

    def _size(self, text: str, name: str, line: int) -> int | float:
        """A draft row's depth (a whole number >= 1), mlp or draft_vocab (a share in (0, 1])."""
        try:
            value: float = int(text) if name == "depth" else float(text)
        except ValueError:
            value = math.nan
        if name == "depth" and not value >= 1:  # NaN fails too
            self._corrupt(line, f"depth={text!r} of a draft row is not a whole number >= 1")
        if name != "depth" and not 0.0 < value <= 1.0:
            self._corrupt(line, f"{name}={text!r} of a draft row is not a share in (0, 1]")
        return value

    def done_keys(self) -> set[tuple[str, str, int, int]]:
        """Resume keys (kind, spec_id, context_len, k) of every recorded row, failed ones too."""
        frame = self.read()
        return {
            (str(r.kind), str(r.spec_id), int(r.context_len), int(r.k))
            for r in frame.itertuples(index=False)
        }

    def append(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Append rows whose key is not recorded yet; returns how many were written."""
        rows = list(rows)
        with locked(self.path.with_name(self.path.name + ".keys")):
            done = self.done_keys()
            fresh = []
            for row in rows:
                key = (str(row["kind"]), str(row["spec_id"]), int(row["context_len"]),
                       int(row["k"]))
                if key not in done:
                    done.add(key)
                    fresh.append(row)
            return append_csv_rows(self.path, fresh, PROFILE_COLUMNS)

    def ok_rows(self) -> pd.DataFrame:
        """The successful measurements (what the predictor fits)."""
        frame = self.read()
        return frame[frame["status"] == "ok"].reset_index(drop=True)
