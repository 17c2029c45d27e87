"""Fuzzing the search's files as the report reads them (hypothesis): a damaged copy of
trials.csv or pareto.csv -- cut at any byte, a line dropped or repeated, a cell of a row
overwritten with text -- gives the undamaged run's answer or one line (`ReportError`, which
`dreams-nas report` turns into exit 2: test_command.py). Never another exception, never a
report of other subnets or another front with no word.

The answer: the best subnet, the front (each of its subnets whole) and every subnet's figures.
The names of subnets off the front are not compared: a CSV has no checksum, and checking every
row's id against its fields would cost more than reading a 10^6-subnet search (the front's and
the best subnet's are checked).
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from dreams_nas.reports import ReportError, build_report_data
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from .fixtures import CPU, Space, make_run

SMALL = Space(heads=(2, 4, 8), visual_keep=(0.5, 1.0), inject_layer=(8, 12), draft_len=(3, 5))
# text that is never a digit, a separator, a quote or a line end: an overwritten number cannot
# become another valid number of the file (a CSV has no checksum to tell)
GARBAGE = st.binary(min_size=1, max_size=8).map(
    lambda b: bytes(c for c in b if chr(c) not in "0123456789.,-+eE\"\n\r") or b"\xff")


def _answer(run: Path) -> tuple:
    data = build_report_data(run)
    figures = sorted(repr(replace(s, spec_id="", tree="")) for s in data.subnets)
    return data.best.spec_id, repr(data.front), figures


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> dict:
    run = make_run(tmp_path_factory.mktemp("fuzz") / "run", space=SMALL, optuna=True,
                   aifd=False, predictor=False, acceptance=False)
    return {"run": run, "answer": _answer(run)}


def _damage(data: bytes, how: str, where: float, column: float, garbage: bytes) -> bytes:
    lines = data.splitlines(keepends=True)
    at = min(int(where * len(lines)), len(lines) - 1)
    if how == "cut":
        return data[: int(where * len(data))]
    if how == "drop":
        return b"".join(lines[:at] + lines[at + 1:])
    if how == "repeat":
        return b"".join(lines[: at + 1] + lines[at:])
    at = max(at, 1)  # a cell of a row (the header's names are a newer writer's to extend)
    cells = lines[at].rstrip(b"\r\n").split(b",")
    j = min(int(column * len(cells)), len(cells) - 1)
    end = lines[at][len(lines[at].rstrip(b"\r\n")):]
    lines[at] = b",".join([*cells[:j], garbage, *cells[j + 1:]]) + end
    return b"".join(lines)


FUZZ = settings(max_examples=24, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("name", ["trials.csv", "pareto.csv"])
@FUZZ
@given(how=st.sampled_from(["cut", "drop", "repeat", "cell"]), where=st.floats(0.0, 0.999),
       column=st.floats(0.0, 0.999), garbage=GARBAGE)
def test_a_damaged_search_file_never_changes_the_report_silently(clean, tmp_path, name, how,
                                                                 where, column,
                                                                 garbage) -> None:
    copy = tmp_path / f"copy-{len(list(tmp_path.iterdir()))}"
    shutil.copytree(clean["run"], copy)
    path = copy / "search" / CPU.hardware_id / name
    path.write_bytes(_damage(path.read_bytes(), how, where, column, garbage))
    try:
        answer = _answer(copy)
    except ReportError as exc:
        event(f"{name} {how}: refused")
        assert "\n" not in str(exc) and name in str(exc), exc
        assert "dreams-nas search" in str(exc), exc
    else:
        event(f"{name} {how}: the same answer")
        assert answer == clean["answer"], (name, how)
    shutil.rmtree(copy)
