from __future__ import annotations

import re

import pandas as pd
import pytest
from dreams_nas.latency.measure.hardware import detect_hardware
from dreams_nas.latency.measure.plan import StepKey, canonical_spec
from dreams_nas.latency.measure.profile_store import (
    PROFILE_COLUMNS,
    ProfileStore,
    make_row,
)
from dreams_nas.latency.measure.timing import Timing
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.core.spec import SubnetSpec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SPACE = SearchSpace(heads=(1, 2), visual_keep=(0.5, 1.0), inject_layer=(1, 2), draft_len=(1, 3))


@pytest.fixture
def hw():
    return detect_hardware("cpu", threads=1)


def _row(hw, key, ms=1.0):
    return make_row(hw, key, Timing(samples_ms=(ms, ms * 1.1, ms * 0.9), warmup=1, throttled=False))


def test_rows_follow_the_schema_and_round_trip(tmp_path, hw) -> None:
    store = ProfileStore(tmp_path / "profile.csv")
    draft = StepKey("draft", 64, 1, canonical_spec(SPACE, 2, 0.5))
    verify = StepKey("verify", 64, 4)
    assert store.append([_row(hw, draft, 2.0), _row(hw, verify, 5.0)]) == 2
    frame = store.read()
    assert list(frame.columns) == list(PROFILE_COLUMNS)
    d, v = frame.iloc[0], frame.iloc[1]
    assert (d.kind, d.spec_id, d.heads, d.visual_keep, d.inject_layer, d.context_len, d.k) == (
        "draft", "h2-v0.50-l2-g3", 2, 0.5, "2", 64, 1)
    assert (d.depth, d.mlp) == (1, 1.0)  # the paper's draft size
    assert d.median_ms == pytest.approx(2.0) and d.n_samples == 3 and d.status == "ok"
    assert d.samples_ms.split() == ["2", "2.2", "1.8"]
    assert (v.kind, v.spec_id, v.heads, v.k) == ("verify", "", "", 4)
    assert (v.depth, v.mlp) == ("", "")  # a target row has no draft size
    assert store.done_keys() == {draft.ident, verify.ident}


def test_append_never_duplicates_a_key(tmp_path, hw) -> None:
    store = ProfileStore(tmp_path / "profile.csv")
    key = StepKey("decode", 32)
    assert store.append([_row(hw, key)]) == 1
    assert store.append([_row(hw, key), _row(hw, StepKey("decode", 64))]) == 1
    assert len(store.read()) == 2


def test_failed_rows_are_kept_but_not_fitted(tmp_path, hw) -> None:
    store = ProfileStore(tmp_path / "profile.csv")
    key = StepKey("draft", 64, 1, canonical_spec(SPACE, 2, 1.0))
    store.append([make_row(hw, key, None, status="oom", error="CUDA out of memory.\nTried")])
    store.append([_row(hw, StepKey("decode", 64))])
    frame = store.read()
    assert list(frame.status) == ["oom", "ok"] and frame.error[0] == "CUDA out of memory. Tried"
    assert list(store.ok_rows().kind) == ["decode"]
    assert key.ident in store.done_keys()


def test_a_torn_last_line_is_skipped_and_repaired(tmp_path, hw) -> None:
    store = ProfileStore(tmp_path / "profile.csv")
    store.append([_row(hw, StepKey("decode", 32))])
    with store.path.open("a") as handle:
        handle.write("cpu-x,verify,,,,,,32,3,1.2")  # killed mid-row: no newline
    assert len(store.read()) == 1
    store.append([_row(hw, StepKey("decode", 64))])
    assert list(store.read().context_len) == [32, 64]


def _set(cells: list[str], column: str, value: str) -> list[str]:
    """The row's cells with `column`'s replaced by `value`."""
    at = PROFILE_COLUMNS.index(column)
    return [*cells[:at], value, *cells[at + 1:]]


@pytest.mark.parametrize(("damage", "message"), [
    (lambda cells: cells[:5], r"line 3: has 5 fields where the header has 27"),
    (lambda cells: _set(cells, "median_ms", "fast"), r"line 3: median_ms='fast' is not a number"),
    (lambda cells: _set(cells, "kind", "prefill"), r"line 3: kind 'prefill' is not one of"),
    (lambda cells: _set(cells, "context_len", "x"),
     r"line 3: context_len='x' is not a whole number"),
])
def test_corrupt_csv_names_the_file_and_line(tmp_path, hw, damage, message) -> None:
    store = ProfileStore(tmp_path / "profile.csv")
    store.append([_row(hw, StepKey("decode", c)) for c in (32, 64, 96)])
    lines = store.path.read_text().splitlines()
    lines[2] = ",".join(damage(lines[2].split(",")))
    store.path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=rf"{store.path}, {message}"):
        store.read()
    with pytest.raises(InputError, match="profile.csv, line 3"):
        store.done_keys()


def _append_many(path, start, hw_dict):
    from dreams_nas.latency.measure.hardware import HardwareInfo

    hw = HardwareInfo.from_dict(hw_dict)
    store = ProfileStore(path)
    for c in range(start, start + 30):  # overlapping ranges: half the keys are written by both
        store.append([_row(hw, StepKey("decode", c + 1))])


def test_two_processes_appending_never_tear_or_duplicate(tmp_path, hw) -> None:
    import multiprocessing

    path = tmp_path / "profile.csv"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(path, s, hw.to_dict())) for s in (0, 15)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    frame = ProfileStore(path).read()
    assert sorted(frame.context_len) == list(range(1, 46))  # every key once, none torn


# --- elastic depth and MLP width ------------------------------------------------------------
def test_a_draft_rows_depth_and_mlp_round_trip(tmp_path, hw) -> None:
    store = ProfileStore(tmp_path / "profile.csv")
    spec = SubnetSpec(2, 0.5, 2, 3, depth=2, mlp=0.5)
    key = StepKey("draft_first", 64, 1, spec)
    assert store.append([_row(hw, key, 3.0)]) == 1
    assert "h2-v0.50-l2-d2-m0.50-g3,2,0.5,2,3,2,0.5,1,64,1," in store.path.read_text()
    row = store.read().iloc[0]
    assert (row.spec_id, row.depth, row.mlp) == ("h2-v0.50-l2-d2-m0.50-g3", 2, 0.5)
    assert SubnetSpec.from_id(row.spec_id) == spec
    assert store.done_keys() == {key.ident}


# Headers of earlier versions: before the draft vocabulary, before elastic depth and MLP width.
_EARLIER = {"draft_vocab": ("draft_vocab",), "sizes": ("depth", "mlp", "draft_vocab")}


def _earlier_file(store, hw, keys, dropped) -> list[str]:
    """`store`'s file as a version without the columns `dropped` wrote it."""
    columns = [c for c in PROFILE_COLUMNS if c not in dropped]
    lines = [",".join(columns)]
    for key in keys:
        row = _row(hw, key)
        lines.append(",".join(str(row[c]) for c in columns))
    store.path.write_text("\r\n".join(lines) + "\r\n", newline="")
    return columns


@pytest.mark.parametrize("dropped", _EARLIER.values(), ids=_EARLIER)
def test_a_file_of_an_earlier_header_is_refused_in_one_line(tmp_path, hw, dropped) -> None:
    """No migration and no defaults: read, resume and append name the columns the file lacks,
    this version's column count and `dreams-nas profile`, and leave the file as it is."""
    store = ProfileStore(tmp_path / "profile.csv")
    _earlier_file(store, hw, [StepKey("draft", 64, 1, canonical_spec(SPACE, 2, 0.5)),
                              StepKey("verify", 64, 4)], dropped)
    before = store.path.read_bytes()
    message = (rf"^{re.escape(str(store.path))} has the header of another dreams-nas version: "
               rf"it lacks {re.escape(str(list(dropped)))} against this version's "
               rf"{len(PROFILE_COLUMNS)} columns; move it aside and run `dreams-nas profile`")
    for call in (store.read, store.done_keys,
                 lambda: store.append([_row(hw, StepKey("decode", 64))])):
        with pytest.raises(InputError, match=message) as caught:
            call()
        assert "\n" not in str(caught.value)
    assert store.path.read_bytes() == before


def test_a_file_of_another_header_is_refused(tmp_path, hw) -> None:
    store = ProfileStore(tmp_path / "profile.csv")
    store.path.write_text("hardware_id,kind,spec_id,context_len,k,median_ms,status,extra\n")
    with pytest.raises(InputError, match=r"has the header of another dreams-nas version: it lacks "
                                         r"\[.*\] and adds \['extra'\]"):
        store.append([_row(hw, StepKey("decode", 64))])
    moved = [c for c in PROFILE_COLUMNS if c != "mlp"] + ["mlp"]
    store.path.write_text(",".join(moved) + "\n")
    with pytest.raises(InputError, match=r"it has them in another order against this version's"):
        store.read()


@pytest.mark.parametrize(("cell", "value", "message"), [
    ("depth", "0", r"depth='0' of a draft row is not a whole number >= 1"),
    ("depth", "", r"depth='' of a draft row is not a whole number >= 1"),
    ("mlp", "1.5", r"mlp='1.5' of a draft row is not a share in \(0, 1\]"),
    ("mlp", "wide", r"mlp='wide' of a draft row is not a share in \(0, 1\]"),
])
def test_a_bad_draft_size_names_the_line(tmp_path, hw, cell, value, message) -> None:
    store = ProfileStore(tmp_path / "profile.csv")
    key = StepKey("draft", 64, 1, canonical_spec(SPACE, 2, 0.5, 2, 0.5))
    store.append([_row(hw, StepKey("decode", 64)), _row(hw, key)])
    lines = store.path.read_text().splitlines()
    lines[2] = ",".join(_set(lines[2].split(","), cell, value))
    store.path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=rf"line 3: {message}; the profile is corrupt"):
        store.read()


# --- the draft vocabulary ---------------------------------------------------------------------
def test_a_draft_rows_vocabulary_share_round_trips(tmp_path, hw) -> None:
    store = ProfileStore(tmp_path / "profile.csv")
    spec = SubnetSpec(2, 0.5, 2, 3, depth=2, mlp=0.5, draft_vocab=0.25)
    key = StepKey("draft", 64, 1, spec)
    assert store.append([_row(hw, key, 3.0), _row(hw, StepKey("decode", 64))]) == 2
    assert "h2-v0.50-l2-d2-m0.50-n0.25-g3,2,0.5,2,3,2,0.5,0.25,64,1," in store.path.read_text()
    draft, decode = store.read().iloc[0], store.read().iloc[1]
    assert (draft.spec_id, draft.draft_vocab) == ("h2-v0.50-l2-d2-m0.50-n0.25-g3", 0.25)
    assert decode.draft_vocab == ""  # a target row has no draft size
    assert SubnetSpec.from_id(draft.spec_id) == spec


@pytest.mark.parametrize("value", ["0", "1.5", "all"])
def test_a_bad_draft_vocabulary_names_the_line(tmp_path, hw, value) -> None:
    store = ProfileStore(tmp_path / "profile.csv")
    key = StepKey("draft", 64, 1, canonical_spec(SPACE, 2, 0.5, draft_vocab=0.25))
    store.append([_row(hw, StepKey("decode", 64)), _row(hw, key)])
    lines = store.path.read_text().splitlines()
    lines[2] = ",".join(_set(lines[2].split(","), "draft_vocab", value))
    store.path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=rf"line 3: draft_vocab={value!r} of a draft row is not "
                                         r"a share in \(0, 1\]; the profile is corrupt"):
        store.read()


# --- a key is timed once (issue #48) ----------------------------------------------------------
def test_a_key_recorded_twice_is_refused_naming_both_lines(tmp_path, hw) -> None:
    """A duplicated key was read, its second timing weighing in the fit (it moved the
    prediction). The profiler never writes a key twice: such a file is concatenated or edited."""
    store = ProfileStore(tmp_path / "profile.csv")
    store.append([_row(hw, StepKey("verify", 64, k), 1.0 + 0.1 * k) for k in (2, 3, 4)])
    clean = store.path.read_text()
    lines = clean.splitlines(keepends=True)
    slower = _row(hw, StepKey("verify", 64, 3), 3.9)
    for again in (lines[2], ",".join(str(slower[c]) for c in PROFILE_COLUMNS) + "\n"):
        store.path.write_text(clean + again)
        with pytest.raises(InputError, match=re.escape(
                f"{store.path}, line 5: key ['verify', '', 64, 3] (kind, spec_id, context_len, "
                "k) was recorded already on line 3, and a key is timed once; the profile is "
                "corrupt there: delete that line")) as err:
            store.ok_rows()
        assert "\n" not in str(err.value)
        with pytest.raises(InputError, match="line 5: key"):
            store.append([_row(hw, StepKey("verify", 64, 5))])  # nothing appended to it
        assert store.path.read_text() == clean + again
    # a key of another kind, spec or context is another key
    store.path.write_text(clean)
    assert store.append([_row(hw, StepKey("verify", 96, 3)), _row(hw, StepKey("decode", 64))]) == 2
    assert len(store.ok_rows()) == 5


def _profile(tmp_path, hw) -> ProfileStore:
    """A profile of draft and target rows, one failed."""
    store = ProfileStore(tmp_path / "profile.csv")
    rows = [_row(hw, StepKey(kind, ctx, 1, canonical_spec(SPACE, heads, keep)), 0.5 + heads)
            for kind in ("draft", "draft_first") for ctx in (32, 64)
            for heads, keep in ((1, 0.5), (2, 1.0))]
    rows += [_row(hw, StepKey("verify", ctx, k), 2.0 + k) for ctx in (32, 64) for k in (2, 3)]
    rows.append(make_row(hw, StepKey("decode", 64), None, status="failed", error="boom"))
    store.append(rows)
    return store


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(copies=st.lists(st.tuples(st.floats(0.0, 0.999), st.floats(0.0, 1.0),
                                 st.sampled_from([1.0, 0.5, 3.0])), min_size=1, max_size=3))
def test_profile_rows_repeated_anywhere_are_refused_never_fitted(tmp_path, hw, copies) -> None:
    """Fuzzing profile.csv with repeated rows (hypothesis): copies of any rows, timed the same or
    otherwise, put anywhere after the header, give the undamaged rows or one line naming the
    file, the key and the fix -- never rows a key holds twice (what the fit would average)."""
    folder = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    store = _profile(folder, hw)
    clean = store.ok_rows()
    lines = store.path.read_text().splitlines(keepends=True)
    for which, where, scale in copies:
        cells = lines[1 + int(which * (len(lines) - 1))].rstrip("\n").split(",")
        at = PROFILE_COLUMNS.index("median_ms")
        if cells[at] and scale != 1.0:  # the same key timed otherwise
            cells[at] = f"{float(cells[at]) * scale:.6g}"
        lines.insert(1 + int(where * (len(lines) - 1)), ",".join(cells) + "\n")
    store.path.write_text("".join(lines))
    try:
        rows = store.ok_rows()
    except InputError as exc:
        assert "\n" not in str(exc) and f"{store.path}, line " in str(exc)
        assert "was recorded already on line" in str(exc) and "delete that line" in str(exc)
    else:  # pragma: no cover - every copy repeats a key
        pd.testing.assert_frame_equal(rows, clean)
