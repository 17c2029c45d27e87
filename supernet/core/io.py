"""Files that never lose data: atomic writes (temp file + rename), locked CSV appends, file hashes
and the cache folder.

JSON is written strictly (RFC 8259): a non-finite float (NaN, ±inf), which Python would write as
the bare tokens ``NaN``/``Infinity`` that no other JSON parser reads, is written as ``null``.
Files are created with the permissions a plain ``open(path, "w")`` gives (0666 less the umask),
so a run folder shared through a group stays readable to the group.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import numbers
import os
import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dreams_nas.supernet.core.errors import InputError, MissingArtefactError
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


_TEMP_ATTEMPTS = 100


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new temporary sibling of `path` (``.<name>.<random>.tmp``), open for writing.

    Created with mode 0666 so the umask (and a default ACL) apply as for any new file;
    `tempfile.mkstemp` would create it 0600, and the rename would carry that onto `path`.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_TEMP_ATTEMPTS):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name next to {path} after {_TEMP_ATTEMPTS} tries")


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` so that readers see the old file or the new one, never half.

    The new file has the permissions of a freshly created one (0666 less the umask), whatever
    the old file had."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.filename is None:  # a full disk while writing names no file: name it
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def finite_or_null(value: Any) -> Any:
    """`value` with every non-finite float (NaN, ±inf) replaced by None, through nested dicts,
    lists and tuples (tuples become lists, as JSON writes them). NumPy numbers count as Python
    ones (json would otherwise write them as strings)."""
    if isinstance(value, Mapping):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(item) for item in value]
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    return value


def json_text(data: Any) -> str:
    """`data` as strict JSON, indented with sorted keys: non-finite floats become null
    (`finite_or_null`) and anything JSON has no type for is written as its str()."""
    return json.dumps(finite_or_null(data), indent=2, sort_keys=True, default=str,
                      allow_nan=False) + "\n"


def atomic_write_json(path: str | Path, data: Any) -> Path:
    """Write `data` as strict JSON (`json_text`: an unknown or non-finite number is null)."""
    return atomic_write_text(path, json_text(data))


def read_json(path: str | Path) -> Any:
    """The JSON document in `path`; a missing, unreadable, non-UTF-8 or malformed file is an
    InputError (MissingArtefactError when it is missing) naming the file."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise MissingArtefactError(f"{path} does not exist; rerun the command that writes it"
                                   ) from None
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
            f"{exc.start}): it is damaged; move it aside and rerun the command that wrote it"
        ) from None
    except OSError as exc:
        raise InputError(f"{path} cannot be read ({exc.strerror or exc}); give the path of a "
                         "readable JSON file") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON (line {exc.lineno}): {exc.msg}; move it "
                         "aside and rerun the command that wrote it") from None


def check_header(path: str | Path, header: Sequence[str], expected: Sequence[str],
                 fix: str) -> None:
    """Refuse, in one line, a CSV whose header is not this version's `expected`: the columns it
    lacks and adds, and `fix` (the command that writes the file anew)."""
    if list(header) == list(expected):
        return
    missing = [c for c in expected if c not in header]
    unknown = [c for c in header if c not in expected]
    if len(missing) == len(expected):
        raise InputError(f"{path} has none of the columns a dreams-nas file of its kind has "
                         f"(header {list(header)[:6]}); move it aside and {fix}")
    found = (f"lacks {missing} and adds {unknown}" if missing and unknown
             else f"lacks {missing}" if missing else f"adds {unknown}" if unknown
             else "has them in another order")
    raise InputError(f"{path} has the header of another dreams-nas version: it {found} against "
                     f"this version's {len(expected)} columns; move it aside and {fix}")


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
