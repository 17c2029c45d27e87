"""Files that never lose data: atomic writes (temp file + rename), locked CSV appends, file hashes
and the cache folder."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dreams_nas.supernet.core.errors import InputError
from filelock import FileLock

CACHE_ENV = "DREAMS_NAS_CACHE"


def default_cache_dir() -> Path:
    """Where built targets and rendered data are cached: ``$DREAMS_NAS_CACHE`` or
    ``~/.cache/dreams-nas``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "dreams-nas").expanduser()


def file_sha256(path: str | Path) -> str:
    """The hex sha256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` so that readers see the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | Path) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON (line {exc.lineno}): {exc.msg}") from None


@contextmanager
def locked(path: str | Path, timeout: float = 600.0) -> Iterator[None]:
    """Hold an inter-process lock tied to `path` (a sibling ``.lock`` file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock", timeout=timeout):
        yield


def append_csv_rows(
    path: str | Path, rows: Iterable[Mapping[str, Any]], fieldnames: Sequence[str]
) -> int:
    """Append rows under a lock; writes the header when the file is new.

    Each row is written and flushed whole, so a kill loses at most the row in flight and a
    reader skips a torn last line (see `read_csv_rows`). Returns the number of rows written.
    """
    path = Path(path)
    rows = list(rows)
    with locked(path):
        exists = path.exists() and path.stat().st_size > 0
        if exists:
            with path.open(newline="", encoding="utf-8") as handle:
                header = next(csv.reader(handle), [])
            if list(header) != list(fieldnames):
                raise InputError(
                    f"{path} has columns {header}, not {list(fieldnames)}; it was written by "
                    "another version: move it aside to start a new file"
                )
            _repair_torn_tail(path)
        with path.open("a", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(fieldnames), extrasaction="raise")
            if not exists:
                writer.writeheader()
            for row in rows:
                writer.writerow(row)
                handle.flush()
            os.fsync(handle.fileno())
    return len(rows)


def _repair_torn_tail(path: Path) -> None:
    """Drop a last line cut by a kill (no trailing newline) before appending after it."""
    with path.open("rb+") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        if size == 0:
            return
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return
        data = path.read_bytes()
        handle.truncate(data.rfind(b"\n") + 1)
