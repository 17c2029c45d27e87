"""Content digests of data files (a data set's JSONL and its images), hashed once and remembered
by path, size, inode and mtime, so that keying a cache on the content stays cheap.

Every cache keyed on a data set (its acceptance rows, the target's answers, the feature store,
the study) hashes what the data set *is*, not what it is called: another picture under the same
name is another data set. The digests are remembered in this process and in
``<cache>/file-digests.jsonl`` (append-only, one JSON object per line; a damaged line is skipped
and rewritten by the next compaction). A remembered digest is trusted while the file's path,
size, device, inode and mtime (nanoseconds) are unchanged; a file modified less than
`RACY_S` seconds before it was hashed is not remembered on disk (a write within the same clock
tick would keep its mtime: git's "racy" rule), only for this process.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable
from pathlib import Path

from dreams_nas.supernet.core.io import (
    atomic_write_text,
    default_cache_dir,
    file_sha256,
    locked,
)

RACY_S = 2.0
MEMO_NAME = "file-digests.jsonl"
_COMPACT_LINES = 50_000  # rewrite the memo (one line per path) once it grows past this

_memory: dict[tuple, str] = {}
_loaded: set[Path] = set()


def _stamp(path: Path) -> tuple:
    st = path.stat()
    return (str(path), st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns)


def _memo_file() -> Path:
    return default_cache_dir() / MEMO_NAME


def _load(memo: Path) -> None:
    """Read the on-disk memo into this process's (once per memo file)."""
    if memo in _loaded:
        return
    _loaded.add(memo)
    try:
        lines = memo.read_text(encoding="utf-8").splitlines()
    except (FileNotFoundError, UnicodeDecodeError):
        return
    for line in lines:
        try:
            item = json.loads(line)
            key = (str(item["path"]), int(item["size"]), int(item["dev"]), int(item["ino"]),
                   int(item["mtime_ns"]))
            value = str(item["sha256"])
        except (ValueError, KeyError, TypeError):
            continue  # a torn or foreign line: hashed again when asked
        if len(value) == 64:
            _memory[key] = value


def _remember(memo: Path, items: list[tuple[tuple, str]]) -> None:
    """Append `items` to the on-disk memo (locked); compact it when it has grown long."""
    if not items:
        return
    lines = [json.dumps({"path": k[0], "size": k[1], "dev": k[2], "ino": k[3],
                         "mtime_ns": k[4], "sha256": v}) for k, v in items]
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        with locked(memo):
            with open(memo, "a", encoding="utf-8") as handle:
                handle.write("\n".join(lines) + "\n")
            if memo.stat().st_size > _COMPACT_LINES * 200:
                _compact(memo)
    except OSError:
        pass  # an unwritable cache costs a re-hash next time, never a wrong digest


def _compact(memo: Path) -> None:
    latest: dict[str, str] = {}
    for line in memo.read_text(encoding="utf-8").splitlines():
        try:
            latest[str(json.loads(line)["path"])] = line
        except (ValueError, KeyError, TypeError):
            continue
    atomic_write_text(memo, "".join(f"{line}\n" for line in latest.values()))


def content_sha256(path: str | Path) -> str:
    """The hex sha256 of the file's bytes, hashed once per (path, size, inode, mtime)."""
    return files_sha256([path])[0]


def files_sha256(paths: Iterable[str | Path]) -> list[str]:
    """The hex sha256 of each file's bytes, in order (each hashed at most once)."""
    memo = _memo_file()
    _load(memo)
    out, fresh = [], []
    for path in paths:
        resolved = Path(path).resolve()
        key = _stamp(resolved)
        digest = _memory.get(key)
        if digest is None:
            now = time.time()
            digest = _memory[key] = file_sha256(resolved)
            if now - key[4] / 1e9 >= RACY_S:
                fresh.append((key, digest))
        out.append(digest)
    _remember(memo, fresh)
    return out


def data_digest(jsonl: str | Path, images: Iterable[str | Path]) -> str:
    """The hex sha256 of a data set: its JSONL's bytes and, in order, every image's bytes (one
    image listed twice counts twice)."""
    digest = hashlib.sha256(content_sha256(jsonl).encode())
    for image in files_sha256(images):
        digest.update(image.encode())
    return digest.hexdigest()


def forget() -> None:
    """Drop this process's memory of digests (the on-disk memo stays; tests use this)."""
    _memory.clear()
    _loaded.clear()


