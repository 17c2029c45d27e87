from __future__ import annotations

import hashlib
import json
import os

import pytest
from dreams_nas.supernet.core import digests


@pytest.fixture
def hashed(tmp_path, monkeypatch) -> list[str]:
    """The files the digests module actually reads, in a cache of its own."""
    monkeypatch.setenv("DREAMS_NAS_CACHE", str(tmp_path / "cache"))
    digests.forget()
    calls: list[str] = []
    real = digests.file_sha256

    def counting(path):
        calls.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(digests, "file_sha256", counting)
    yield calls
    digests.forget()


def _old_file(path, data: bytes, age_s: float = 60.0):
    path.write_bytes(data)
    stamp = os.stat(path).st_mtime - age_s
    os.utime(path, (stamp, stamp))
    return path


def test_a_file_is_hashed_once_and_remembered_across_processes(tmp_path, hashed) -> None:
    image = _old_file(tmp_path / "a.png", b"pixels")
    assert digests.content_sha256(image) == hashlib.sha256(b"pixels").hexdigest()
    assert digests.content_sha256(image) == hashlib.sha256(b"pixels").hexdigest()
    assert hashed == ["a.png"]
    digests.forget()  # a new process reads the memo on disk
    assert digests.content_sha256(image) == hashlib.sha256(b"pixels").hexdigest()
    assert hashed == ["a.png"]


def test_a_changed_file_of_the_same_size_is_hashed_again(tmp_path, hashed) -> None:
    image = _old_file(tmp_path / "a.png", b"pixels")
    first = digests.content_sha256(image)
    _old_file(image, b"PIXELS", age_s=30.0)  # same size, another mtime
    digests.forget()
    assert digests.content_sha256(image) == hashlib.sha256(b"PIXELS").hexdigest() != first
    assert hashed == ["a.png", "a.png"]


def test_a_file_written_just_now_is_not_remembered_on_disk(tmp_path, hashed) -> None:
    fresh = tmp_path / "b.png"
    fresh.write_bytes(b"new")  # within the racy window: its mtime may not move on a rewrite
    digests.content_sha256(fresh)
    digests.forget()
    digests.content_sha256(fresh)
    assert hashed == ["b.png", "b.png"]


def test_a_damaged_memo_costs_a_rehash_never_a_wrong_digest(tmp_path, hashed) -> None:
    image = _old_file(tmp_path / "a.png", b"pixels")
    digests.content_sha256(image)
    memo = tmp_path / "cache" / digests.MEMO_NAME
    line = json.loads(memo.read_text().splitlines()[0])
    memo.write_text('{"path": \n' + json.dumps({**line, "sha256": "0" * 63}) + "\n")
    digests.forget()
    assert digests.content_sha256(image) == hashlib.sha256(b"pixels").hexdigest()
    assert hashed == ["a.png", "a.png"]


def test_a_data_digest_covers_every_image_in_order(tmp_path, hashed) -> None:
    jsonl = _old_file(tmp_path / "d.jsonl", b"{}")
    a, b = _old_file(tmp_path / "a.png", b"A"), _old_file(tmp_path / "b.png", b"B")
    assert digests.data_digest(jsonl, [a, b]) != digests.data_digest(jsonl, [b, a])
    assert digests.data_digest(jsonl, [a, b]) != digests.data_digest(jsonl, [a])
    assert sorted(set(hashed)) == ["a.png", "b.png", "d.jsonl"] and len(hashed) == 3
