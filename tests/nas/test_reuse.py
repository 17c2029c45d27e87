"""What the stages reuse and what they refuse: best.json keyed on every input of the search,
a supernet whose weights run.json does not record, a `--run` that is a file, the demo's
reused supernet and its options' names. No model is loaded: the run folders are hand-made."""

from __future__ import annotations

import json
import logging
import os

import pytest
from _support.search import fit_synthetic_latency
from dreams_nas.nas import cli
from dreams_nas.nas.stages.demo import DemoOptions, finished_search
from dreams_nas.nas.stages.search import SearchOptions, search_inputs
from dreams_nas.nas.stages.train import TrainOptions, ensure_supernet
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.draft.saving import SUPERNET_WEIGHTS, file_hash

HW = "cpu-test-1t"
SPACE = SearchSpace(heads=(2, 4), visual_keep=(0.5, 1.0), inject_layer=(1, 2), draft_len=(1, 3))
TRAINED = {"warmup_steps": 1, "multires_steps": 1, "n_examples": 3, "max_new_tokens": 5}


@pytest.fixture
def logged():
    """The messages the `dreams_nas` loggers emit at INFO and above during the test."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger = logging.getLogger("dreams_nas")
    handler, level = Collect(logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield messages
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture
def env(tmp_path, monkeypatch):
    """The tiny built-in target in an empty cache: a command that wrongly reached a model would
    build it, slowly, instead of failing at once."""
    monkeypatch.setenv("DREAMS_NAS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DREAMS_NAS_DEMO_VARIANT", "tiny")


def _trained_run(root) -> RunFolder:
    """A run folder with (fake) supernet weights recorded in run.json, a space, a target and a
    synthetic latency predictor: what `score` and `search` look at before loading a model."""
    run = RunFolder(root)
    run.supernet_dir.mkdir(parents=True)
    weights = run.supernet_dir / SUPERNET_WEIGHTS
    weights.write_bytes(b"trained weights " * 64)
    (run.supernet_dir / "config.json").write_text("{}")
    run.update_run(target={"id": "builtin", "path": None}, space=SPACE.to_dict(),
                   dtype="float32", supernet={"hash": file_hash(weights), "train": TRAINED})
    fit_synthetic_latency(run, SPACE, HW)
    return run


def _files(run: RunFolder) -> dict[str, tuple[int, int]]:
    """Every artefact with its mtime and size (the stages' lock files aside: each command
    takes its locks, reusing or not)."""
    return {str(p.relative_to(run.root)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in sorted(run.root.rglob("*"))
            if p.is_file() and p.relative_to(run.root).parts[0] != ".locks"}


def _call(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main([*argv, "-q"])
    return code, capsys.readouterr().err


# --- a supernet that run.json does not record -----------------------------------------------
@pytest.mark.parametrize("damage", ["truncated", "replaced", "run.json deleted"])
@pytest.mark.parametrize("command", ["score", "search"])
def test_unrecorded_supernet_weights_are_refused_and_nothing_is_written(
        command, damage, tmp_path, env, capsys) -> None:
    run = _trained_run(tmp_path / "run")
    weights = run.supernet_dir / SUPERNET_WEIGHTS
    recorded = file_hash(weights)
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "replaced":
        weights.write_bytes(b"other weights")
    else:
        run.run_json.unlink()
    before = _files(run)
    code, err = _call(capsys, command, "--run", str(run.root), "--device", "cpu",
                      "--limit", "2")
    assert code == 2 and err.count("\n") == 1, err
    assert f"{weights} has hash {file_hash(weights)}" in err
    assert (f"records supernet.hash {recorded}" in err) == (damage != "run.json deleted")
    assert ("run.json is missing" in err) == (damage == "run.json deleted")
    assert "restore that file" in err and f"`dreams-nas train --run {run.root}`" in err
    assert "scored with supernet" not in err  # not blamed on the acceptance rows
    assert _files(run) == before  # no selfdistill.json, no dtype, no acceptance rows


def test_the_demo_does_not_train_over_unrecorded_weights(tmp_path) -> None:
    run = _trained_run(tmp_path / "run")
    (run.supernet_dir / SUPERNET_WEIGHTS).write_bytes(b"cut")
    before = _files(run)
    with pytest.raises(InputError, match=r"has hash \w+ but .*run.json records supernet.hash"):
        ensure_supernet(run, TrainOptions())
    assert _files(run) == before


def test_no_supernet_at_all_is_still_missing_not_corrupt(tmp_path) -> None:
    from dreams_nas.nas.stages.inputs import checked_supernet, supernet_hash
    from dreams_nas.supernet.core.errors import MissingArtefactError

    run = _trained_run(tmp_path / "run")
    (run.supernet_dir / SUPERNET_WEIGHTS).unlink()
    assert checked_supernet(run) is None  # search and demo train one
    with pytest.raises(MissingArtefactError, match="no trained supernet in"):
        supernet_hash(run)


# --- --run is a file --------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["train", "profile", "score", "search", "demo"])
@pytest.mark.parametrize("inside", [False, True])
def test_a_run_that_is_a_file_is_one_line(command, inside, tmp_path, env, capsys) -> None:
    afile = tmp_path / "notes.txt"
    afile.write_text("not a run folder\n")
    where = afile / "run" if inside else afile
    code, err = _call(capsys, command, "--run", str(where), "--device", "cpu")
    assert code == 2 and err.count("\n") == 1, err
    assert (f"dreams-nas {command}: error: --run {where} is a file, not a run folder" in err
            if not inside else f"--run {where} is a file, not a run folder (it lies inside the "
                               f"file {afile})" in err)
    assert "pass a folder (it is created if missing)" in err
    assert afile.read_text() == "not a run folder\n"
    assert not (tmp_path / "cache").exists()


def test_report_of_a_run_that_is_a_file_is_one_line(tmp_path, env, capsys) -> None:
    afile = tmp_path / "notes.txt"
    afile.write_text("not a run folder\n")
    code, err = _call(capsys, "report", "--run", str(afile))
    assert code == 2 and err.count("\n") == 1, err
    assert f"dreams-nas report: error: --run {afile} is a file, not a run folder" in err


# --- best.json is reused only for the inputs it was computed from ------------------------------
def _searched(run: RunFolder, options: SearchOptions) -> dict:
    """A best.json as `search` writes it for `options`, newer than everything it read."""
    from dreams_nas.nas.stages.inputs import dataset_id

    acceptance = run.acceptance_csv(dataset_id(options.data, options.limit, options.seed))
    acceptance.parent.mkdir(parents=True, exist_ok=True)
    acceptance.write_text("spec_id\n")
    run.spec_dir("h4-v1.00-l2-g3").mkdir(parents=True)
    best = {"objective": options.objective, "method": options.method,
            "supernet_hash": file_hash(run.supernet_dir / SUPERNET_WEIGHTS),
            "dtype": options.dtype, "spec_id": "h4-v1.00-l2-g3",
            "spec_dir": "specs/h4-v1.00-l2-g3", "predicted": {"speedup": 1.5, "tau": 2.0},
            "measured": {"speedup": 1.4}, "inputs": search_inputs(run, options, HW, "float32")}
    path = run.best_json(HW)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(best))
    later = path.stat().st_mtime + 5
    os.utime(path, (later, later))
    return best


def _options(**changes) -> SearchOptions:
    base = {"hardware": HW, "limit": 2, "max_new_tokens": 5, "verify": 1, "verify_prompts": 1,
            "device": "cpu", "dtype": "float32"}
    return SearchOptions(**{**base, **changes})


def test_best_json_is_reused_for_the_same_inputs(tmp_path, logged) -> None:
    run = _trained_run(tmp_path / "run")
    _searched(run, _options())
    done = finished_search(run, HW, _options())
    assert done is not None and done["best"] == "h4-v1.00-l2-g3"
    assert not [m for m in logged if m.startswith("search:")]


@pytest.mark.parametrize("change, logged_change", [
    ({"max_new_tokens": 8}, "max_new_tokens 5 -> 8"),
    ({"verify_prompts": 2}, "verify_prompts 1 -> 2"),
    ({"verify": 3}, "verify 1 -> 3"),
    ({"verify_repeats": 5}, "verify_repeats 3 -> 5"),
    ({"seed": 1}, "seed 0 -> 1"),
    ({"max_draft_ms": 2.5}, "max_draft_ms none -> 2.5"),
])
def test_best_json_of_other_settings_is_redone_saying_which(change, logged_change, tmp_path,
                                                            logged) -> None:
    """Before, only mtimes, objective, method, supernet and dtype were compared: a best.json of
    another max_new_tokens (its acceptance file unchanged since) was reused."""
    run = _trained_run(tmp_path / "run")
    _searched(run, _options())
    asked = _options(**change)
    if "seed" in change:  # another seed is another evaluation set: give it its rows
        run.acceptance_csv("builtin-eval-n2-s1").write_text("spec_id\n")
        os.utime(run.acceptance_csv("builtin-eval-n2-s1"), (1, 1))
    assert finished_search(run, HW, asked) is None
    (line,) = [m for m in logged if m.startswith("search: redone (")]
    assert logged_change in line


def test_best_json_of_another_limit_is_redone(tmp_path, logged) -> None:
    run = _trained_run(tmp_path / "run")
    _searched(run, _options())
    assert finished_search(run, HW, _options(limit=3)) is None
    assert logged[-1] == (f"search: redone (no {run.acceptance_csv('builtin-eval-n3')})")
    run.acceptance_csv("builtin-eval-n3").write_text("spec_id\n")  # scored since, before best
    os.utime(run.acceptance_csv("builtin-eval-n3"), (1, 1))
    assert finished_search(run, HW, _options(limit=3)) is None
    assert ("dataset_id builtin-eval-n2 -> builtin-eval-n3; limit 2 -> 3" in logged[-1]
            and "acceptance acceptance/builtin-eval-n2.csv -> "
                "acceptance/builtin-eval-n3.csv" in logged[-1])


def test_best_json_after_a_refit_of_the_predictor_is_redone(tmp_path, logged) -> None:
    run = _trained_run(tmp_path / "run")
    best = _searched(run, _options())
    best["inputs"]["predictor_created"] = "2020-01-01T00:00:00Z"
    run.best_json(HW).write_text(json.dumps(best))
    os.utime(run.best_json(HW), (run.best_json(HW).stat().st_mtime + 10,) * 2)
    assert finished_search(run, HW, _options()) is None
    assert "predictor_created 2020-01-01T00:00:00Z -> " in logged[-1]


def test_best_json_that_does_not_record_an_input_is_redone(tmp_path, logged) -> None:
    """An input best.json does not record is not assumed: the search is redone, saying so."""
    run = _trained_run(tmp_path / "run")
    best = _searched(run, _options(verify_repeats=1))
    del best["inputs"]["verify_repeats"]
    run.best_json(HW).write_text(json.dumps(best))
    os.utime(run.best_json(HW), (run.best_json(HW).stat().st_mtime + 10,) * 2)
    assert finished_search(run, HW, _options(verify_repeats=1)) is None
    assert "verify_repeats none -> 1" in logged[-1]


def test_best_json_priced_by_a_predictor_of_an_older_schema_is_redone(tmp_path, logged) -> None:
    """A predictor of an older schema is refused when loaded (`profile --fit-only` refits it);
    the reuse check does not load it: predictor.json still reads as before, so the schema
    decides."""
    run = _trained_run(tmp_path / "run")
    _searched(run, _options())
    meta_path = run.predictor_json(HW)
    meta = json.loads(meta_path.read_text())
    meta["schema_version"] = 7
    meta_path.write_text(json.dumps(meta))
    os.utime(meta_path, (1, 1))  # not newer than best.json: only the schema tells
    assert finished_search(run, HW, _options()) is None
    assert "predictor schema 7 -> 9" in logged[-1]


def test_best_json_without_inputs_is_not_reused(tmp_path, logged) -> None:
    run = _trained_run(tmp_path / "run")
    best = _searched(run, _options())
    del best["inputs"]
    run.best_json(HW).write_text(json.dumps(best))
    os.utime(run.best_json(HW), (run.best_json(HW).stat().st_mtime + 10,) * 2)
    assert finished_search(run, HW, _options()) is None
    assert "best.json records no inputs" in logged[-1]


def test_no_best_json_says_there_is_nothing_to_reuse(tmp_path, logged) -> None:
    run = _trained_run(tmp_path / "run")
    assert finished_search(run, HW, _options()) is None
    assert logged[-1] == f"search: nothing to reuse (no {run.best_json(HW)})"


# --- the demo's supernet, trained with other settings ------------------------------------------
def test_the_demo_reuses_a_supernet_trained_otherwise_and_says_how_to_retrain(
        tmp_path, logged) -> None:
    run = _trained_run(tmp_path / "run")
    same = TrainOptions(n_train=3, warmup_steps=1, multires_steps=1, max_new_tokens=5)
    assert ensure_supernet(run, same)[1] is True
    assert not [m for m in logged if "warning" in m]
    other = TrainOptions(n_train=3, warmup_steps=2, multires_steps=2, max_new_tokens=8)
    summary, reused = ensure_supernet(run, other)
    assert reused and summary["hash"] == file_hash(run.supernet_dir / SUPERNET_WEIGHTS)
    (warning,) = [m for m in logged if m.startswith("warning: reusing the supernet")]
    assert "warmup_steps 1 -> 2, multires_steps 1 -> 2, max_new_tokens 5 -> 8" in warning
    assert "prompts" not in warning.split("(")[1].split(")")[0]
    assert (f"`dreams-nas train --run {run.root} --target builtin --n-train 3 --warmup-steps 2 "
            "--multires-steps 2 --max-new-tokens 8`") in warning
    default = TrainOptions()  # 384 builtin prompts, 300 + at most 400 steps, 64 tokens
    ensure_supernet(run, default)
    assert "prompts 3 -> 384" in logged[-1]
    assert "visual-context" not in logged[-1]  # the same: visual tokens in its own sequence
    block = run.read_run()["supernet"]
    run.update_run(supernet={**block, "config": {"visual_in_self": True, "num_layers": 1,
                                                 "mlp_shares": [1.0]}})
    memory_only = TrainOptions(n_train=3, warmup_steps=1, multires_steps=1, max_new_tokens=5,
                               visual_context="cross")
    ensure_supernet(run, memory_only)
    assert "(visual-context self -> cross)" in logged[-1]
    assert "--visual-context cross" in logged[-1]
    assert "--depth" not in logged[-1] and "--mlp" not in logged[-1]  # the defaults
    elastic = TrainOptions(n_train=3, warmup_steps=1, multires_steps=1, max_new_tokens=5,
                           depth=3, mlp=(0.25, 0.5, 1.0))
    ensure_supernet(run, elastic)  # the config trained: one layer a side, the whole MLP
    assert "(depth 1 -> 3, mlp 1 -> 0.25,0.5,1)" in logged[-1]
    assert "--depth 3 --mlp 0.25,0.5,1 " in logged[-1]


# --- the demo's own option names ----------------------------------------------------------------
def test_the_demo_names_its_own_budget_option(tmp_path, env, capsys) -> None:
    code, err = _call(capsys, "demo", "--run", str(tmp_path / "run"), "--device", "cpu",
                      "--profile-budget", "lots")
    assert code == 2 and err.count("\n") == 1
    assert "--profile-budget 'lots' is not a number" in err and "--budget '" not in err
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()
    from dreams_nas.nas.stages.demo import _profile_options

    assert _profile_options(DemoOptions(profile_budget="1"), "cpu").budget_option == (
        "--profile-budget")
