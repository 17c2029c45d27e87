from __future__ import annotations

import csv
import io
import math
import re

import pytest
from dreams_nas.supernet.acceptance.table import (
    ACCEPTANCE_COLUMNS,
    AcceptanceRow,
    AcceptanceTable,
)
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.io import append_csv_rows
from dreams_nas.supernet.core.spec import SubnetSpec


def _row(spec, tau=None, supernet="abc", dataset="builtin", temperature=0.0, dtype="float32",
         max_new_tokens=64):
    """A possible row: tau in [1, draft_len + 1] (by default halfway)."""
    tau = 1 + 0.5 * spec.draft_len if tau is None else tau
    return AcceptanceRow(spec=spec, tau=tau, tau_lo=tau - 0.2, tau_hi=tau + 0.2,
                         supernet_hash=supernet, dataset_id=dataset, temperature=temperature,
                         dtype=dtype, max_new_tokens=max_new_tokens,
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
    with pytest.raises(InputError, match="dtype 'float64'"):
        _row(SubnetSpec(1, 1.0, 1, 1), dtype="float64")
    with pytest.raises(InputError, match="max_new_tokens=-1"):
        _row(SubnetSpec(1, 1.0, 1, 1), max_new_tokens=-1)
    with pytest.raises(InputError, match="dtype 'fp16'"):
        AcceptanceTable("unused.csv", "abc", "builtin", dtype="fp16")


def test_a_bad_dtype_cell_is_refused_when_read_as_a_row() -> None:
    fields = _row(SubnetSpec(2, 0.5, 1, 2)).to_csv_row()
    fields = {k: str(v) for k, v in fields.items()}
    assert AcceptanceRow.from_csv_row(fields).dtype == "float32"
    with pytest.raises(InputError, match="dtype 'half'"):
        AcceptanceRow.from_csv_row({**fields, "dtype": "half"})


def test_other_dtypes_and_budgets_are_kept_apart(tmp_path) -> None:
    path = tmp_path / "a.csv"
    spec = SubnetSpec(2, 0.5, 1, 2)
    AcceptanceTable(path, "abc", "builtin", dtype="float16").append(
        [_row(spec, tau=1.5, dtype="float16")])
    AcceptanceTable(path, "abc", "builtin", max_new_tokens=32).append(
        [_row(spec, tau=1.8, max_new_tokens=32)])
    table = AcceptanceTable(path, "abc", "builtin")  # float32, 64 tokens
    assert table.load() == {}
    table.append([_row(spec, tau=2.2)])
    assert [r.tau for r in table.load().values()] == [2.2]
    assert [r.tau for r in AcceptanceTable(path, "abc", "builtin",
                                           dtype="float16").load().values()] == [1.5]
    assert [r.tau for r in AcceptanceTable(path, "abc", "builtin",
                                           max_new_tokens=32).load().values()] == [1.8]
    with path.open(newline="") as handle:
        kept = [(r["dtype"], r["max_new_tokens"]) for r in csv.DictReader(handle)]
    assert kept == [("float16", "64"), ("float32", "32"), ("float32", "64")]


def test_append_refuses_rows_of_another_dtype_or_budget(tmp_path) -> None:
    table = AcceptanceTable(tmp_path / "a.csv", "abc", "builtin", dtype="bfloat16")
    with pytest.raises(InputError, match=r"scored in float32 .* not this table's bfloat16"):
        table.append([_row(SubnetSpec(1, 1.0, 1, 1))])
    with pytest.raises(InputError, match="max_new_tokens=8, not this table's"):
        table.append([_row(SubnetSpec(1, 1.0, 1, 1), dtype="bfloat16", max_new_tokens=8)])
    assert not (tmp_path / "a.csv").exists()


# Headers of earlier versions: before the draft vocabulary, elastic sizes, trees, and before
# dtype and max_new_tokens were part of a row's key.
_EARLIER = {
    "draft_vocab": ("draft_vocab",),
    "sizes": ("depth", "mlp", "draft_vocab"),
    "trees": ("tree", "depth", "mlp", "draft_vocab"),
    "dtype": ("tree", "depth", "mlp", "draft_vocab", "dtype", "max_new_tokens"),
}


@pytest.mark.parametrize("dropped", _EARLIER.values(), ids=_EARLIER)
def test_a_file_of_an_earlier_header_is_refused_in_one_line(tmp_path, dropped) -> None:
    """No migration: the file is left as it is and `load`/`append` name the columns it lacks,
    this version's column count and `dreams-nas score`."""
    path = tmp_path / "a.csv"
    columns = [c for c in ACCEPTANCE_COLUMNS if c not in dropped]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerow(_row(SubnetSpec(1, 1.0, 1, 1)).to_csv_row())
    before = path.read_bytes()
    table = AcceptanceTable(path, "abc", "builtin")
    message = (rf"^{re.escape(str(path))} has the header of another dreams-nas version: it lacks "
               rf"{re.escape(str(list(dropped)))} against this version's "
               rf"{len(ACCEPTANCE_COLUMNS)} columns; move it aside and run `dreams-nas score`")
    with pytest.raises(InputError, match=message) as caught:
        table.load()
    assert "\n" not in str(caught.value)
    with pytest.raises(InputError, match=message):
        table.append([_row(SubnetSpec(2, 1.0, 1, 1))])
    assert path.read_bytes() == before


def test_a_file_that_is_no_acceptance_file_is_refused(tmp_path) -> None:
    other = tmp_path / "b.csv"
    other.write_text("spec_id,tau,extra\nh1-v1.00-l1-g1,2.0,x\n")
    with pytest.raises(InputError, match=r"has the header of another dreams-nas version: it lacks "
                                         r"\[.*\] and adds \['extra'\].*`dreams-nas score`"):
        AcceptanceTable(other, "abc", "builtin").load()


def test_a_shared_row_of_an_earlier_version_is_one_line() -> None:
    """A row stored by another version (a shared storage's JSON cells) lacks columns: refused,
    naming them, not read with defaults."""
    cells = _row(SubnetSpec(2, 0.5, 1, 1)).to_csv_row()
    del cells["depth"], cells["mlp"], cells["draft_vocab"]
    with pytest.raises(InputError, match=r"^the acceptance row of h2-v0.50-l1-g1 lacks \['depth', "
                                         r"'mlp', 'draft_vocab'\]: another dreams-nas version "
                                         r"wrote it; score it again with `dreams-nas score`$"):
        AcceptanceRow.from_csv_row(cells)


def _write_cells(path, *rows: dict) -> None:
    """Rows written as cells, past `AcceptanceRow`'s checks: as an old version, a hand edit or
    damage would leave them."""
    append_csv_rows(path, rows, ACCEPTANCE_COLUMNS)


def test_an_impossible_tau_is_refused_on_read_naming_the_line(tmp_path) -> None:
    """tau = 50 for draft_len = 7 once loaded and won the search at a predicted 6.35x."""
    path = tmp_path / "a.csv"
    good, bad = _row(SubnetSpec(2, 0.5, 1, 2)), _row(SubnetSpec(4, 0.5, 12, 7))
    _write_cells(path, good.to_csv_row(), {**bad.to_csv_row(), "tau": "50.0", "tau_hi": "51.0"})
    with pytest.raises(InputError) as err:
        AcceptanceTable(path, "abc", "builtin").load()
    message = str(err.value)
    assert re.search(r"a\.csv line 3 \(spec h4-v0\.50-l12-g7\) is not a valid acceptance row: "
                     r"tau=50\.0 .* is not in \[1, 8\].*move the file aside and rerun "
                     r"`dreams-nas score`", message), message
    assert "\n" not in message
    with pytest.raises(InputError, match=r"tau=50\.0 of the acceptance row of h4-v0.50-l12-g7 is "
                                         r"not in \[1, 8\]"):
        _row(SubnetSpec(4, 0.5, 12, 7), tau=50)


@pytest.mark.parametrize(("cells", "match"), [
    ({"tau": "0.5", "tau_lo": "0.4"}, r"tau=0\.5 .* not in \[1, 4\]"),
    ({"tau_lo": "2.7"}, r"tau=2\.5 .* outside its interval \[tau_lo=2\.7, tau_hi=2\.7\]"),
    ({"tau_hi": "inf"}, r"tau_hi=inf .* must be a finite number"),
    ({"tau_lo": "nan"}, r"tau_lo=nan .* must be a finite number"),
    ({"accept_rate_2": "1.5"}, r"accept_rate_2=1\.5 .* not a fraction in \[0, 1\]"),
    ({"accept_rate_1": "-0.1"}, r"accept_rate_1=-0\.1 .* not a fraction"),
    ({"accept_rate_4": "0.2"}, r"has 4 accept rates, more than its draft_len 3"),
    ({"n_prompts": "-1"}, r"n_prompts=-1 .* must be >= 0"),
    ({"n_tokens": "-5"}, r"n_tokens=-5 .* must be >= 0"),
    ({"tau": "many"}, r"a cell does not parse \(could not convert string to float: 'many'\)"),
    ({"dtype": "half"}, r"dtype 'half'"),
])
def test_every_value_is_checked_on_read(tmp_path, cells, match) -> None:
    path = tmp_path / "a.csv"
    row = _row(SubnetSpec(4, 0.5, 12, 3))  # tau 2.5 in [2.3, 2.7], rates 0.9 0.7 0.5
    _write_cells(path, {**row.to_csv_row(), **cells})
    with pytest.raises(InputError, match=r"a\.csv line 2 \(spec h4-v0\.50-l12-g3\) is not a "
                                         r"valid acceptance row: .*" + match) as err:
        AcceptanceTable(path, "abc", "builtin").load()
    assert "rerun `dreams-nas score`" in str(err.value) and "\n" not in str(err.value)


def test_a_row_of_another_table_is_checked_too(tmp_path) -> None:
    path = tmp_path / "a.csv"
    other = _row(SubnetSpec(1, 1.0, 1, 1), temperature=0.7).to_csv_row()
    _write_cells(path, {**other, "tau": "9.0", "tau_hi": "9.0"})
    with pytest.raises(InputError, match=r"line 2 .* tau=9\.0"):
        AcceptanceTable(path, "abc", "builtin").load()


def test_nan_rates_of_positions_no_cycle_reached_are_legal(tmp_path) -> None:
    path = tmp_path / "a.csv"
    spec = SubnetSpec(2, 0.5, 1, 3)
    row = AcceptanceRow(spec=spec, tau=1.5, tau_lo=1.5, tau_hi=1.5, supernet_hash="abc",
                        dataset_id="builtin", max_new_tokens=64, n_prompts=1, n_tokens=2,
                        accept_rates=(0.5, math.nan, math.nan))
    AcceptanceTable(path, "abc", "builtin").append([row])
    loaded = AcceptanceTable(path, "abc", "builtin").load()[spec]
    assert loaded.accept_rates[0] == 0.5 and all(math.isnan(r) for r in loaded.accept_rates[1:])
    # tau exactly at its bounds, up to float rounding
    _row(SubnetSpec(1, 1.0, 1, 1), tau=2.0 + 1e-12)
    _row(SubnetSpec(1, 1.0, 1, 1), tau=1.0 - 1e-12)


def test_a_damaged_line_is_refused_but_a_torn_last_line_is_skipped(tmp_path) -> None:
    path = tmp_path / "a.csv"
    first, second = _row(SubnetSpec(1, 1.0, 1, 2)), _row(SubnetSpec(2, 1.0, 1, 2), tau=1.9)
    AcceptanceTable(path, "abc", "builtin").append([first])
    text = io.StringIO()
    csv.DictWriter(text, fieldnames=list(ACCEPTANCE_COLUMNS)).writerow(second.to_csv_row())
    line = text.getvalue().rstrip("\r\n")
    assert line.endswith(",30")  # context_len, the last cell
    with path.open("a", newline="") as handle:
        handle.write(line[:-1])  # a kill inside the last cell: every cell there, no line end
    assert AcceptanceTable(path, "abc", "builtin").load() == {first.spec: first}
    with path.open("a", newline="") as handle:  # a line cut short in the middle: damage
        handle.write("0\r\nabc,builtin,h2-v1.00-l1-g2,2\r\n" + line + "\r\n")
    with pytest.raises(InputError, match=r"a\.csv line 4 has 4 cells, not the header's 28: the "
                                         r"file is damaged; move it aside"):
        AcceptanceTable(path, "abc", "builtin").load()


def test_bytes_that_are_not_utf8_are_one_line_naming_the_file(tmp_path) -> None:
    path = tmp_path / "acc.csv"
    table = AcceptanceTable(path, "abc", "builtin", dtype="float32", max_new_tokens=64)
    table.append([_row(SubnetSpec(1, 1.0, 1, 1), 1.5)])
    data = path.read_bytes()
    path.write_bytes(data[:40] + b"\x80\xff" + data[42:])
    with pytest.raises(InputError, match=r"acc.csv is not UTF-8 text \(byte 0x80 at offset 40\)"):
        table.load()
