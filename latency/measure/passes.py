"""The samples of each (step, pass) of a profile block in flight, kept beside profile.csv.

A profile times its steps in blocks whose repeats are interleaved over several passes
(`profiler.run_profile`), and a block's rows are pooled and appended when its last pass ends.
Without a journal a kill lost the whole block in flight (256 steps by default, the whole grid
with ``--chunk 0``); with it a kill loses at most the step in flight: every (step, pass) timing
is appended to ``profile.csv.passes.jsonl`` as it is measured, a rerun with the same timing
settings takes them back and times only what is missing, and the journal is removed once the
profile's rows are all written. A last line torn by a kill is skipped; lines of other settings
are ignored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dreams_nas.latency.measure.timing import Timing

Ident = tuple[str, str, int, int]


def journal_path(profile_csv: str | Path) -> Path:
    path = Path(profile_csv)
    return path.with_name(path.name + ".passes.jsonl")


class PassJournal:
    """Per-pass timings of one profile under one set of timing settings (`signature`)."""

    def __init__(self, path: str | Path, signature: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.signature = dict(signature)
        self._kept: dict[tuple[Ident, int], Timing] = {}

    def load(self) -> int:
        """Read the journal's timings of this signature; returns how many."""
        self._kept.clear()
        if not self.path.is_file():
            return 0
        raw = self.path.read_bytes().decode("utf-8", errors="replace")
        lines = raw.split("\n")
        lines = lines[:-1]  # the text after the last line end: empty, or torn by a kill
        for line in lines:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # damaged: that pass is timed again
            if not isinstance(entry, dict) or entry.get("settings") != self.signature:
                continue
            try:
                ident = _ident(entry["key"])
                timing = Timing(samples_ms=tuple(float(s) for s in entry["samples_ms"]),
                                warmup=int(entry["warmup"]), throttled=bool(entry["throttled"]),
                                clock_mhz=tuple(int(c) for c in entry.get("clock_mhz", ())))
                self._kept[(ident, int(entry["pass"]))] = timing
            except (KeyError, TypeError, ValueError):
                continue
        return len(self._kept)

    def get(self, ident: Ident, index: int) -> Timing | None:
        return self._kept.get((ident, index))

    def add(self, ident: Ident, index: int, timing: Timing) -> None:
        """Append one (step, pass) timing; flushed to the OS before returning."""
        self._kept[(ident, index)] = timing
        line = json.dumps({"settings": self.signature, "key": list(ident), "pass": index,
                           "samples_ms": list(timing.samples_ms), "warmup": timing.warmup,
                           "throttled": timing.throttled, "clock_mhz": list(timing.clock_mhz)})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab") as handle:
            if handle.tell() and not _ends_with_newline(self.path):
                handle.write(b"\n")  # a line torn by a kill: end it, the reader skips it
            handle.write(line.encode("utf-8") + b"\n")
            handle.flush()
            os.fsync(handle.fileno())

    def close(self) -> None:
        """Remove the journal (every row it fed is in profile.csv)."""
        self._kept.clear()
        self.path.unlink(missing_ok=True)


def _ident(cells: Any) -> Ident:
    kind, spec_id, context_len, k = cells
    return (str(kind), str(spec_id), int(context_len), int(k))


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"
