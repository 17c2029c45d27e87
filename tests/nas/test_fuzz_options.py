"""Fuzzing the CLI's typed options (hypothesis): whatever value a user types, a command ends in
exit 2 with one line naming what is wrong, never a traceback or an internal error (exit 1).

Every command that loads a model is called with ``--device cuda:7``, which this machine does not
have: a value its option accepts goes on to that one-line device error (or to a check that
refuses the value in combination with the others) without loading anything, and a value it
does not accept is refused by the option, naming it.
"""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest
import torch
from dreams_nas.nas import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# The commands that load models: a valid value would start real work, so the fuzzing stops
# them at the device they ask for.
COMMANDS = ("train", "profile", "score", "search", "generate", "demo")


def _typed_options() -> list[tuple[str, str, argparse.Action]]:
    """(command, option, action) of every option with a type (numbers, mostly)."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = []
    for command in COMMANDS:
        for action in sub.choices[command]._actions:
            if action.type is not None and action.option_strings and action.nargs != 0:
                out.append((command, action.option_strings[-1], action))
    return out


OPTIONS = _typed_options()

# What people type: numbers of every size and sign, non-finite ones, and text.
VALUES = st.one_of(
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["0", "-0", "1e309", "nan", "inf", "-inf", "0x10", "1_000", " 3", "", "½"]),
    st.text(max_size=6),
)


def _accepts(action: argparse.Action, value: str) -> bool:
    try:
        parsed = action.type(value)
    except (argparse.ArgumentTypeError, TypeError, ValueError):
        return False
    return action.choices is None or parsed in action.choices


def _run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(argv)
    return code, err.getvalue()


def test_the_fuzzing_covers_the_numeric_options() -> None:
    names = {(command, option) for command, option, _ in OPTIONS}
    assert {("profile", "--repeats"), ("train", "--lr"), ("generate", "--top-p"),
            ("search", "--trials"), ("demo", "--max-new-tokens")} <= names


@pytest.fixture
def no_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(choice=st.sampled_from(OPTIONS), value=VALUES)
def test_any_value_of_any_option_is_one_line_exit_2(no_gpu, choice, value) -> None:
    command, option, action = choice
    extra = ["--image", "missing.png", "--prompt", "hi"] if command == "generate" else []
    code, err = _run([command, f"{option}={value}", "--device", "cuda:7", *extra, "-q"])
    assert code == 2, (command, option, value, err)
    assert err.count("\n") == 1 and err.startswith(f"dreams-nas {command}: error: "), err
    assert "internal error" not in err and "Traceback" not in err
    if not _accepts(action, value):
        assert option in err, err  # a refused value names its option
    assert not (no_gpu / "dreams-run").exists()  # nothing written before the refusal


def test_non_finite_numbers_are_refused_by_every_typed_option() -> None:
    accepted = [(command, option, text) for command, option, action in OPTIONS
                for text in ("nan", "inf", "-inf", "1e309") if _accepts(action, text)]
    assert accepted == []
