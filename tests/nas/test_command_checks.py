"""`score` and `search` read and check their `--data` file before anything else: a bad file
fails in a second with one line, not after the target and the supernet have loaded."""

from __future__ import annotations

import pytest
from dreams_nas.nas.cli import main


@pytest.fixture
def latin1_jsonl(tmp_path):
    (tmp_path / "a.png").write_bytes(b"")
    path = tmp_path / "eval.jsonl"
    path.write_bytes(b'{"id": "caf\xe9", "image": "a.png", "conversations": []}\n')
    return path


@pytest.mark.parametrize("command", ["score", "search"])
def test_a_bad_data_file_is_refused_before_the_run_is_read(command, latin1_jsonl, tmp_path,
                                                           capsys):
    # The run folder is empty: without the check the error would be the missing supernet or
    # latency profile, and with them the data file would be read only after the models load.
    code = main([command, "--run", str(tmp_path / "run"), "--data", str(latin1_jsonl)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"{latin1_jsonl}:1: byte 11 (0xe9) is not UTF-8" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("budget", ["-3", "lots", "2.5"])
def test_a_bad_profile_budget_is_refused_before_the_target_loads(budget, tmp_path, capsys,
                                                                 monkeypatch):
    from dreams_nas.supernet.target.adapter import TargetAdapter

    def never(*args, **kwargs):
        raise AssertionError("the target was loaded before --budget was checked")

    monkeypatch.setattr(TargetAdapter, "load", never)
    monkeypatch.setattr("dreams_nas.supernet.builtin.resolve.resolve_target", never)
    code = main(["profile", "--run", str(tmp_path / "run"), "--device", "cpu", "--budget",
                 budget])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"--budget {budget!r}" in err
