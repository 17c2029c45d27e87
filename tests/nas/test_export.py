from __future__ import annotations

import csv
import json
from dataclasses import replace

import pytest
from _support.search import (
    SIZED_SPACE,
    SMALL_SPACE,
    VOCAB_SPACE,
    FakeLatency,
    FakeScorer,
    fake_params,
    run_search,
)
from dreams_nas.nas.stages.export import TRIAL_COLUMNS, SearchRecord, export_result
from dreams_nas.supernet.core.spec import SubnetSpec

HW = {"hardware_id": "cpu-test-2t", "kind": "cpu", "name": "test cpu"}
TARGET = {"id": "builtin", "path": "/tmp/x", "family": "llava"}
RECORD = SearchRecord("cpu-test-2t", HW, "abc123", "float32", target=TARGET)


def _read(path):
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(params=["exhaustive", "optuna"])
def exported(request, run_dir):
    result = run_search(SMALL_SPACE, FakeScorer(), FakeLatency(), fake_params, context_len=32,
                    method=request.param, n_trials=10, show_progress=False, objective="pareto")

    def write_draft(spec, folder):
        (folder / "config.json").write_text(json.dumps({"heads": spec.heads}))

    paths = export_result(run_dir, result, RECORD, write_draft=write_draft)
    return result, paths, run_dir


def test_trials_and_pareto_follow_the_schema(exported) -> None:
    result, paths, _ = exported
    trials, front = _read(paths["trials"]), _read(paths["pareto"])
    with paths["trials"].open() as handle:
        assert next(csv.reader(handle)) == list(TRIAL_COLUMNS)
    assert len(trials) == result.n_evaluations
    assert {r["spec_id"] for r in front} <= {r["spec_id"] for r in trials}
    assert {r["spec_id"] for r in front} == {c.spec.id for c in result.front}
    row = trials[0]
    assert SubnetSpec.from_id(row["spec_id"]) == SubnetSpec(
        int(row["heads"]), float(row["visual_keep"]), int(row["inject_layer"]),
        int(row["draft_len"]), depth=int(row["depth"]), mlp=float(row["mlp"]),
        draft_vocab=float(row["draft_vocab"]))
    assert {(r["depth"], r["mlp"]) for r in trials} == {("1", "1.0")}  # the paper's one size
    assert {r["draft_vocab"] for r in trials} == {"1.0"}  # the whole vocabulary
    assert row["state"] == "complete" and row["method"] == result.method
    assert row["objective"] == "pareto" and row["feasible"] in ("0", "1")
    assert float(row["speedup"]) == pytest.approx(result.candidates[0].speedup, rel=1e-15)


def test_best_json_and_spec_dir(exported) -> None:
    result, paths, run = exported
    best = json.loads(paths["best"].read_text())
    for key in ("hardware_id", "objective", "method", "spec", "spec_id", "spec_dir",
                "predicted", "measured", "verified", "hardware", "supernet_hash", "created",
                "versions"):
        assert key in best
    assert best["spec_id"] == result.best.spec.id
    assert SubnetSpec.from_dict(best["spec"]) == result.best.spec
    assert set(best["predicted"]) == {"speedup", "tau", "tau_ci", "draft_ms", "first_draft_ms",
                                      "verify_ms", "decode_ms", "cycle_overhead_ms"}
    assert best["measured"] is None and best["verified"] == []
    spec_dir = run.root / best["spec_dir"]
    spec = json.loads((spec_dir / "spec.json").read_text())
    assert spec["schema_version"] == 1 and spec["supernet_hash"] == "abc123"
    assert spec["target"] == TARGET and spec["hardware"] == HW
    assert spec["predicted"] == best["predicted"]
    assert (spec_dir / "config.json").is_file()
    for c in result.front:  # every front member is deployable
        assert (run.spec_dir(c.spec.id) / "spec.json").is_file()
    assert not list(run.root.rglob("*.tmp"))


def test_history_only_for_optuna(exported) -> None:
    result, paths, _ = exported
    if result.method == "exhaustive":
        assert "history" not in paths
        return
    rows = _read(paths["history"])
    assert len(rows) == result.n_evaluations
    bests = [float(r["best_so_far"]) for r in rows]
    assert bests == sorted(bests)


def test_best_json_records_the_inputs_it_was_computed_from(run_dir) -> None:
    """`inputs` is the key `finished_search` reuses best.json on; null when none is given."""
    result = run_search(SMALL_SPACE, FakeScorer(), FakeLatency(), fake_params, context_len=32,
                    show_progress=False)
    inputs = {"dataset_id": "builtin-eval-n2", "limit": 2, "max_new_tokens": 5, "verify": 1,
              "verify_prompts": None, "seed": 0, "dtype": "float32", "max_draft_ms": None,
              "trials": None, "acceptance": "acceptance/builtin-eval-n2.csv",
              "predictor_fingerprint": {"hardware_id": "cpu-test-2t"},
              "predictor_created": "2025-01-01T00:00:00Z"}
    paths = export_result(run_dir, result, replace(RECORD, inputs=inputs))
    assert json.loads(paths["best"].read_text())["inputs"] == inputs
    paths = export_result(run_dir, result, RECORD)
    assert json.loads(paths["best"].read_text())["inputs"] is None


def test_depth_and_mlp_reach_trials_pareto_and_the_spec_folders(run_dir) -> None:
    result = run_search(SIZED_SPACE, FakeScorer(), FakeLatency(), fake_params, context_len=32,
                    show_progress=False, objective="pareto")
    paths = export_result(run_dir, result, RECORD)
    trials, front = _read(paths["trials"]), _read(paths["pareto"])
    assert list(trials[0])[6:9] == ["tree", "depth", "mlp"]
    assert {(r["depth"], r["mlp"]) for r in trials} == {
        ("1", "0.5"), ("1", "1.0"), ("2", "0.5"), ("2", "1.0")}
    for row in trials + front:  # each row's fields are its id's
        spec = SubnetSpec.from_id(row["spec_id"])
        assert (spec.depth, spec.mlp) == (int(row["depth"]), float(row["mlp"]))
    sized = [c for c in result.front if (c.spec.depth, c.spec.mlp) != (1, 1.0)]
    assert sized  # the fake's trade-off puts other sizes on the front
    for c in sized:
        saved = json.loads((run_dir.spec_dir(c.spec.id) / "spec.json").read_text())
        assert SubnetSpec.from_dict(saved["spec"]) == c.spec
        assert {k: saved["spec"].get(k) for k in ("depth", "mlp")} == {
            "depth": c.spec.depth if c.spec.depth != 1 else None,
            "mlp": c.spec.mlp if c.spec.mlp != 1.0 else None}
    best = json.loads(paths["best"].read_text())
    assert SubnetSpec.from_dict(best["spec"]) == result.best.spec


def test_the_draft_vocab_reaches_trials_pareto_and_the_spec_folders(run_dir) -> None:
    result = run_search(VOCAB_SPACE, FakeScorer(), FakeLatency(), fake_params, context_len=32,
                    show_progress=False, objective="pareto")
    paths = export_result(run_dir, result, RECORD)
    trials, front = _read(paths["trials"]), _read(paths["pareto"])
    assert list(trials[0])[6:10] == ["tree", "depth", "mlp", "draft_vocab"]
    assert {r["draft_vocab"] for r in trials} == {"0.25", "1.0"}
    for row in trials + front:  # each row's fields are its id's
        assert SubnetSpec.from_id(row["spec_id"]).draft_vocab == float(row["draft_vocab"])
    small = [c for c in result.front if c.spec.draft_vocab != 1.0]
    assert small  # the fake's trade-off (a faster step, a lower tau) puts both on the front
    assert any(c.spec.draft_vocab == 1.0 for c in result.front)
    for c in result.front:
        saved = json.loads((run_dir.spec_dir(c.spec.id) / "spec.json").read_text())
        assert SubnetSpec.from_dict(saved["spec"]) == c.spec and saved["spec_id"] == c.spec.id
        assert saved["spec"].get("draft_vocab") == (
            None if c.spec.draft_vocab == 1.0 else c.spec.draft_vocab)
    assert "-n0.25-" in small[0].spec.id
    best = json.loads(paths["best"].read_text())
    assert SubnetSpec.from_dict(best["spec"]) == result.best.spec


def test_a_spec_folder_linked_out_of_the_run_folder_is_not_written_through(run_dir, tmp_path
                                                                          ) -> None:
    from dreams_nas.supernet.core.errors import InputError

    result = run_search(SMALL_SPACE, FakeScorer(), FakeLatency(), fake_params, context_len=32,
                        show_progress=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_dir.specs_root.mkdir(parents=True, exist_ok=True)
    run_dir.spec_dir(result.best.spec.id).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(InputError, match=r"outside the run folder .*; remove the link"):
        export_result(run_dir, result, RECORD)
    assert list(elsewhere.iterdir()) == []
