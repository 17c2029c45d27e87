"""supernet.core.io: strict JSON out, one-line errors in, and the permissions of new files."""

from __future__ import annotations

import json
import math
import os
import stat

import numpy as np
import pytest
from dreams_nas.nas import cli
from dreams_nas.supernet.core.errors import InputError, MissingArtefactError
from dreams_nas.supernet.core.io import (
    append_csv_rows,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    finite_or_null,
    read_json,
)


def _strict_loads(text: str):
    """json.loads that refuses NaN/Infinity, as every JSON parser but Python's does."""
    def refuse(token: str):
        raise ValueError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_are_written_as_null(tmp_path) -> None:
    path = tmp_path / "best.json"
    atomic_write_json(path, {
        "tau_ci": (math.nan, 2.5), "metrics": {"kendall_tau": math.nan, "rmse": 0.25},
        "nested": [[math.inf, -math.inf], {"x": np.float64("nan")}],
        "numpy": [np.float32(0.5), np.float32("inf"), np.int64(3)], "flag": True, "n": 4,
    })
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert _strict_loads(text) == {
        "tau_ci": [None, 2.5], "metrics": {"kendall_tau": None, "rmse": 0.25},
        "nested": [[None, None], {"x": None}], "numpy": [0.5, None, 3], "flag": True, "n": 4,
    }
    assert finite_or_null({"a": (1, math.nan)}) == {"a": [1, None]}


def test_the_writer_never_writes_a_bare_nan(tmp_path, monkeypatch) -> None:
    """Whatever slips past the conversion is refused by json.dumps, not written as NaN."""
    monkeypatch.setattr("dreams_nas.supernet.core.io.finite_or_null", lambda value: value)
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        atomic_write_json(tmp_path / "x.json", {"a": math.nan})
    assert not (tmp_path / "x.json").exists()
    assert list(tmp_path.iterdir()) == []  # nor a temporary file


def test_a_non_utf8_json_file_is_one_line_naming_it(tmp_path) -> None:
    path = tmp_path / "run.json"
    path.write_bytes(b'{"target": "\xff"}')
    with pytest.raises(InputError, match=r"run\.json is not UTF-8 text \(byte 0xff at offset "
                                         r"12\): it is damaged; move it aside") as err:
        read_json(path)
    assert "\n" not in str(err.value)


def test_an_unreadable_or_missing_json_file_is_an_input_error(tmp_path) -> None:
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(InputError, match=r"dir\.json cannot be read \(Is a directory\)"):
        read_json(tmp_path / "dir.json")
    with pytest.raises(MissingArtefactError, match=r"gone\.json does not exist"):
        read_json(tmp_path / "gone.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(InputError, match=r"bad\.json is not valid JSON \(line 1\): .*move it "
                                         r"aside"):
        read_json(tmp_path / "bad.json")


def test_a_non_utf8_run_json_ends_the_cli_with_exit_2(tmp_path, capsys) -> None:
    run = tmp_path / "dreams-run"
    run.mkdir()
    (run / "run.json").write_bytes(b'{"dtype": "\xfffloat32"}')
    code = cli.main(["profile", "--run", str(run), "--fit-only", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("dreams-nas profile: error: ") and err.count("\n") == 1
    assert "run.json is not UTF-8 text (byte 0xff" in err


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask():
    """Set the process umask for one test (restored after it)."""
    saved = os.umask(0o022)
    yield os.umask
    os.umask(saved)


def test_atomic_writes_get_the_permissions_of_a_plain_open(tmp_path, umask) -> None:
    umask(0o022)
    with open(tmp_path / "plain.txt", "w"):
        pass
    atomic_write_text(tmp_path / "a.txt", "one")
    atomic_write_json(tmp_path / "a.json", {"a": 1})
    atomic_write_bytes(tmp_path / "a.bin", b"\x00")
    append_csv_rows(tmp_path / "a.csv", [{"a": 1}], ["a"])
    assert _mode(tmp_path / "plain.txt") == 0o644  # what the files should match
    for name in ("a.txt", "a.json", "a.bin", "a.csv"):
        assert _mode(tmp_path / name) == 0o644, name  # mkstemp made the atomic ones 0600
    umask(0o002)  # a group-shared run folder
    atomic_write_text(tmp_path / "a.txt", "two")
    assert _mode(tmp_path / "a.txt") == 0o664 and (tmp_path / "a.txt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.bin", "a.csv", "a.csv.lock", "a.json", "a.txt", "plain.txt"]


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_saved_weights_obey_the_umask_as_every_other_file(tmp_path, umask, mask) -> None:
    """safetensors writes 0600 whatever the umask: a group-shared run folder could not be read."""
    import torch
    from dreams_nas.supernet.draft.saving import save_weights_and_config

    umask(mask)
    save_weights_and_config(torch.nn.Linear(2, 2), tmp_path, "w.safetensors", "c.json", {})
    assert _mode(tmp_path / "w.safetensors") == _mode(tmp_path / "c.json") == 0o666 & ~mask


def test_a_full_disk_while_writing_names_the_file(tmp_path, monkeypatch) -> None:
    import errno
    import os

    from dreams_nas.supernet.core.io import atomic_write_bytes

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    target = tmp_path / "best.json"
    with pytest.raises(OSError) as err:
        atomic_write_bytes(target, b"{}")
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(target)
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind
