from __future__ import annotations

import csv
import multiprocessing as mp

import pytest
from dreams_nas.supernet.core.errors import InputError, MissingArtefactError
from dreams_nas.supernet.core.io import append_csv_rows, atomic_write_text
from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.core.space import SearchSpace


def test_paths_follow_the_layout(run_dir: RunFolder) -> None:
    root = run_dir.root
    assert run_dir.run_json == root / "run.json"
    assert run_dir.profile_csv("cpu-x-2t") == root / "latency/cpu-x-2t/profile.csv"
    assert run_dir.predictor_skops("gpu") == root / "latency/gpu/predictor.skops"
    assert run_dir.acceptance_csv("synth-eval") == root / "acceptance/synth-eval.csv"
    assert run_dir.study_db("gpu") == root / "search/gpu/study.db"
    assert run_dir.best_json("gpu") == root / "search/gpu/best.json"
    assert run_dir.spec_dir("h4-v0.50-l12-g5") == root / "specs/h4-v0.50-l12-g5"
    assert run_dir.report_html == root / "report.html"


def test_bad_slug_is_refused(run_dir: RunFolder) -> None:
    with pytest.raises(InputError, match=r"hardware id '../etc' is not a valid folder name"):
        run_dir.latency_dir("../etc")


def test_run_json_update_and_space(run_dir: RunFolder) -> None:
    assert run_dir.read_run() == {}
    space = SearchSpace(heads=(1, 2), visual_keep=(1.0,), inject_layer=(2,), draft_len=(1, 3))
    run_dir.update_run(target="builtin")
    run_dir.save_space(space)
    data = run_dir.read_run()
    assert data["target"] == "builtin"
    assert data["versions"]["torch"] != ""
    assert run_dir.space() == space


def test_missing_artefact_names_the_command(run_dir: RunFolder) -> None:
    with pytest.raises(MissingArtefactError,
                       match=r"no trained supernet in .*dreams-run/supernet/model.safetensors; "
                             r"run `dreams-nas train` or `dreams-nas demo` first"):
        run_dir.require_supernet()
    with pytest.raises(MissingArtefactError, match=r"no search space in .*run.json"):
        run_dir.space()


def test_corrupt_run_json_is_a_clear_error(run_dir: RunFolder) -> None:
    atomic_write_text(run_dir.run_json, "{not json")
    with pytest.raises(InputError, match=r"run.json is not valid JSON \(line 1\)"):
        run_dir.read_run()


def test_a_run_json_of_another_schema_is_refused_in_one_line(run_dir: RunFolder) -> None:
    """No reading with defaults: a run.json another version stamped names both schemas and
    the command that starts the run again; updating it is refused too."""
    for version, shown in (("1", "1"), (None, "None")):  # 1: before this schema; None: none
        text = '{"dtype": "float32"' + (f', "schema_version": {version}' if version else "") + "}"
        atomic_write_text(run_dir.run_json, text)
        message = (rf"run.json has schema_version {shown}; this dreams-nas reads schema 2: run "
                   r"`dreams-nas train` \(or `dreams-nas demo`\) into a new --run folder$")
        with pytest.raises(InputError, match=message):
            run_dir.read_run()
        with pytest.raises(InputError, match=message):
            run_dir.update_run(dtype="float32")


def test_atomic_write_leaves_no_temp_files(tmp_path) -> None:
    target = tmp_path / "a" / "f.txt"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in target.parent.iterdir()] == ["f.txt"]


def test_append_rows_header_once_and_checked(tmp_path) -> None:
    path = tmp_path / "p.csv"
    append_csv_rows(path, [{"a": 1, "b": 2}], ["a", "b"])
    append_csv_rows(path, [{"a": 3, "b": 4}], ["a", "b"])
    with path.open() as handle:
        assert list(csv.DictReader(handle)) == [{"a": "1", "b": "2"}, {"a": "3", "b": "4"}]
    with pytest.raises(InputError, match=r"p.csv has columns \['a', 'b'\], not \['a', 'c'\]"):
        append_csv_rows(path, [{"a": 1, "c": 2}], ["a", "c"])


def test_append_repairs_a_torn_last_line(tmp_path) -> None:
    path = tmp_path / "p.csv"
    append_csv_rows(path, [{"a": 1, "b": 2}], ["a", "b"])
    with path.open("a") as handle:
        handle.write("9,")  # a row cut by a kill
    append_csv_rows(path, [{"a": 3, "b": 4}], ["a", "b"])
    assert path.read_text().splitlines() == ["a,b", "1,2", "3,4"]


def _append_many(path: str, worker: int) -> None:
    for i in range(50):
        append_csv_rows(path, [{"worker": worker, "i": i, "pad": "x" * 200}],
                        ["worker", "i", "pad"])


def test_concurrent_appends_do_not_interleave(tmp_path) -> None:
    path = tmp_path / "shared.csv"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(path), w)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 150
    expected = {(str(w), str(i)) for w in range(3) for i in range(50)}
    assert {(r["worker"], r["i"]) for r in rows} == expected


def test_one_dtype_per_run(run_dir: RunFolder) -> None:
    # before any command recorded one: --dtype, else auto (float32 on the CPU)
    assert run_dir.dtype(None, "cpu") == "float32"
    assert run_dir.dtype("bfloat16", "cpu") == "bfloat16"
    assert run_dir.record_dtype("bfloat16") == "bfloat16"
    assert run_dir.read_run()["dtype"] == "bfloat16"
    # after: the run's, for no --dtype and for auto alike; another is refused naming both
    assert run_dir.dtype(None, "cpu") == run_dir.dtype("auto", "cpu") == "bfloat16"
    assert run_dir.dtype("bfloat16", "cpu") == "bfloat16"
    with pytest.raises(InputError, match="--dtype float16 differs from this run's dtype "
                                         "bfloat16") as err:
        run_dir.dtype("float16", "cpu")
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="computes in bfloat16"):
        run_dir.record_dtype("float32")
    with pytest.raises(InputError, match="not supported"):
        RunFolder(run_dir.root / "other").dtype("float64", "cpu")
