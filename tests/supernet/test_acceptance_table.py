from __future__ import annotations

import math

import pytest
from dreams_nas.supernet.acceptance.table import (
    ACCEPTANCE_COLUMNS,
    AcceptanceRow,
    AcceptanceTable,
)
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.space import SubnetSpec


def _row(spec, tau=2.5, supernet="abc", dataset="builtin", temperature=0.0):
    return AcceptanceRow(spec=spec, tau=tau, tau_lo=tau - 0.2, tau_hi=tau + 0.2,
                         supernet_hash=supernet, dataset_id=dataset, temperature=temperature,
                         n_prompts=4, n_tokens=100, context_len=30,
                         accept_rates=(0.9, 0.7, 0.5)[: spec.draft_len])


def test_round_trip_and_schema(tmp_path) -> None:
    table = AcceptanceTable(tmp_path / "builtin.csv", "abc", "builtin")
    rows = [_row(SubnetSpec(4, 0.5, 12, 3)), _row(SubnetSpec(2, 1.0, 8, 1), tau=1.7)]
    table.append(rows)
    assert table.load() == {r.spec: r for r in rows}
    header = (tmp_path / "builtin.csv").read_text().splitlines()[0].split(",")
    assert header == list(ACCEPTANCE_COLUMNS)
    assert "spec_id" in header and "accept_rate_7" in header
    line = (tmp_path / "builtin.csv").read_text().splitlines()[2].split(",")
    assert line[header.index("spec_id")] == "h2-v1.00-l8-g1"
    assert line[header.index("accept_rate_2")] == ""


def test_another_supernets_file_is_refused(tmp_path) -> None:
    AcceptanceTable(tmp_path / "a.csv", "old", "builtin").append([_row(SubnetSpec(1, 1.0, 1, 1),
                                                                       supernet="old")])
    with pytest.raises(InputError, match=r"scored with supernet old, not this run's supernet new"):
        AcceptanceTable(tmp_path / "a.csv", "new", "builtin").load()
    with pytest.raises(InputError, match="belongs to supernet"):
        AcceptanceTable(tmp_path / "a.csv", "new", "builtin").append(
            [_row(SubnetSpec(1, 1.0, 1, 1), supernet="old")])


def test_other_temperatures_are_kept_apart_and_torn_lines_skipped(tmp_path) -> None:
    path = tmp_path / "a.csv"
    AcceptanceTable(path, "abc", "builtin", 0.7).append([_row(SubnetSpec(1, 1.0, 1, 2),
                                                              temperature=0.7)])
    greedy = AcceptanceTable(path, "abc", "builtin")
    greedy.append([_row(SubnetSpec(1, 1.0, 1, 2), tau=3.0)])
    with path.open("a") as handle:
        handle.write("abc,builtin,h1-v1.00-l1-g3,1,1.0")  # a kill mid-row
    assert [r.tau for r in greedy.load().values()] == [3.0]
    greedy.append([_row(SubnetSpec(1, 1.0, 1, 3), tau=2.0)])  # repairs the torn tail first
    assert len(greedy.load()) == 2


def test_row_validation() -> None:
    with pytest.raises(InputError, match="tau=nan"):
        _row(SubnetSpec(1, 1.0, 1, 1), tau=math.nan)
    with pytest.raises(InputError, match="method 'guess'"):
        AcceptanceRow(spec=SubnetSpec(1, 1.0, 1, 1), tau=1.0, tau_lo=1.0, tau_hi=1.0,
                      supernet_hash="a", dataset_id="b", method="guess")
