"""benchmarks/bench_supernet.py: its option parsing and per-task pooling (no training)."""

from __future__ import annotations

import sys

import bench_supernet
import pytest


def test_set_parses_each_field_as_its_type() -> None:
    got = bench_supernet.train_overrides(["weight_decay=0.1", "warmup_steps=500",
                                          "sort_heads=false"])
    assert got == {"weight_decay": 0.1, "warmup_steps": 500, "sort_heads": False}
    assert isinstance(got["warmup_steps"], int)


@pytest.mark.parametrize("pair, words", [
    ("foo=1", "not FIELD=VALUE"),
    ("lr", "not FIELD=VALUE"),
    ("seed=3", "not FIELD=VALUE"),  # the seed is the benchmark's: --seed-list, --seed-shift
    ("warmup_steps=0.5", "is not a int"),
    ("ema_decay=1.5", "ema_decay=1.5 must be within"),
])
def test_set_refuses_what_is_not_a_train_config(pair: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        bench_supernet.train_overrides([pair])


def test_a_bad_option_is_one_line_and_exit_code_2(monkeypatch, capsys, tmp_path) -> None:
    for argv in (["--set", "lr=x"], ["--n-eval", "0"], ["--depth", "0"], ["--mlp", "0.5"],
                 ["--mlp", "x"]):
        monkeypatch.setattr(sys, "argv", ["bench_supernet.py", *argv, "--out", str(tmp_path)])
        assert bench_supernet.main() == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err
    assert not any(tmp_path.iterdir())  # refused before anything was prepared


def test_the_default_evaluation_keeps_its_file_names() -> None:
    assert bench_supernet.eval_tag(bench_supernet.N_EVAL, 0) == ""
    assert bench_supernet.eval_tag(256, 1) == "-eval-n256-s1"
    assert bench_supernet.eval_tag(bench_supernet.N_EVAL, 1) != ""


def test_by_task_pools_every_fifth_prompt() -> None:
    from dreams_nas.supernet.data.synth import TASKS

    # prompt i is task i mod 5: tokens and cycles per prompt, two prompts per task
    pairs = [(10 + i, 2) for i in range(2 * len(TASKS))]
    got = bench_supernet.by_task(pairs)
    assert list(got) == list(TASKS)
    for k, task in enumerate(TASKS):
        assert got[task] == pytest.approx((10 + k + 10 + k + len(TASKS)) / 4)
