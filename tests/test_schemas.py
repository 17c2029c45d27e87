"""SCHEMAS.md against the code: the writers' files of a tiny real run, their constants, and what
the report reads.

The fast tests read the document and the code; the slow ones build one tiny run folder with the
real commands (`dreams-nas demo` on the tiny built-in target, then an Optuna search) and check every
file in it against the document.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import sqlite3
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest


def _schemas_reader() -> Any:
    """tests/schemas_reader.py as the module `schemas_reader` (no sys.path change)."""
    if "schemas_reader" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "schemas_reader", Path(__file__).with_name("schemas_reader.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["schemas_reader"] = module
        spec.loader.exec_module(module)
    return sys.modules["schemas_reader"]


Schemas = _schemas_reader().Schemas
SchemaDocError = _schemas_reader().SchemaDocError
ROOT = Path(__file__).parents[1]
SCHEMAS = Schemas.read(ROOT / "SCHEMAS.md")

# The artefacts every run folder can hold (the README/DESIGN layout plus the files the code
# writes beside them): each must have its own section.
ARTEFACTS = (
    "run.json", "supernet/config.json", "supernet/model.safetensors", "supernet/selfdistill.json",
    "supernet/curve.csv", "supernet/features/index.json",
    "supernet/features/shard-<n>.safetensors",
    "supernet/checkpoint/state.json", "latency/<hardware-id>/hardware.json",
    "latency/<hardware-id>/plan.json", "latency/<hardware-id>/profile.csv",
    "latency/<hardware-id>/predictor.skops", "latency/<hardware-id>/predictor_train.csv",
    "latency/<hardware-id>/predictor.json", "acceptance/<dataset-id>.csv",
    "search/<hardware-id>/study.db", "search/<hardware-id>/trials.csv",
    "search/<hardware-id>/pareto.csv", "search/<hardware-id>/history.csv",
    "search/<hardware-id>/best.json", "specs/<spec-id>/spec.json", "specs/<spec-id>/config.json",
    "specs/<spec-id>/draft.safetensors", "report.html",
)

# What the report (reports/) reads of each artefact.
REPORT_READS: dict[str, tuple[str, ...]] = {
    "run.json": (
        "target", "target.id", "target.family", "target.num_layers", "target.hidden_size",
        "supernet", "supernet.hash", "supernet.num_params", "aifd", "aifd.ae", "aifd.layers",
        "aifd.delta_ae", "aifd.chosen", "aifd.rule", "versions", "versions.dreams-nas",
        "versions.torch", "versions.transformers", "versions.optuna", "versions.scikit-learn",
        "versions.python", "supernet.train", "supernet.train.loss_curve",
        "supernet.train.loss_curve[].step", "supernet.train.loss_curve[].loss",
        "supernet.train.warmup_steps", "supernet.train.convergence",
        "supernet.train.convergence.evals", "supernet.train.convergence.evals[].step",
        "supernet.train.convergence.evals[].tau_full",
        "supernet.train.convergence.evals[].tau_smallest",
        "supernet.train.convergence.evals[].score", "supernet.train.convergence.best_step",
        "supernet.train.convergence.stopped", "supernet.train.convergence.draft_len",
    ),
    "latency/<hardware-id>/hardware.json": (
        "name", "kind", "memory_gb", "cuda", "driver", "threads", "dtype",
    ),
    "latency/<hardware-id>/predictor.json": (
        "regressor", "metrics", "metrics.mape", "metrics.rmse", "metrics.within_10pct",
        "metrics.kendall_tau", "holdout", "holdout[].kind", "holdout[].k", "holdout[].spec_id",
        "holdout[].measured_ms", "holdout[].predicted_ms", "n_train", "n_holdout",
        "transfer", "transfer.sources", "transfer.sources[].hardware_id", "transfer.measured",
        # every kind's entry alike (the report reads whichever are there)
        "metrics_by_kind", *(f"metrics_by_kind.{kind}.{key}"
                             for kind in ("draft", "draft_tree", "draft_first", "decode",
                                          "verify", "verify_tree")
                             for key in ("n", "mape", "within_10pct", "kendall_tau")),
    ),
    "acceptance/<dataset-id>.csv": (
        "spec_id", "supernet_hash", "draft_len", "tau", *(f"accept_rate_{i}" for i in range(1, 8)),
    ),
    "search/<hardware-id>/trials.csv": (
        "number", "spec_id", "heads", "visual_keep", "inject_layer", "draft_len", "tau", "tau_lo",
        "tau_hi", "draft_ms", "first_draft_ms", "verify_ms", "decode_ms", "speedup",
        "draft_params", "feasible", "state", "tree", "cycle_ms", "depth", "mlp", "draft_vocab",
    ),
    "search/<hardware-id>/pareto.csv": ("spec_id",),
    "search/<hardware-id>/history.csv": ("number", "value", "best_so_far"),
    "search/<hardware-id>/best.json": (
        "spec", "spec.heads", "spec.visual_keep", "spec.inject_layer", "spec.draft_len",
        "spec.tree", "spec.depth", "spec.mlp", "spec.draft_vocab",
        "spec_id", "spec_dir", "objective", "method", "created", "supernet_hash",
        # what trials.csv and pareto.csv are checked against (reports.search_checks)
        "n_evaluations", "front", "front.maximise", "front.minimise",
        "predicted", "predicted.speedup", "predicted.tau", "predicted.tau_ci",
        "predicted.draft_ms", "predicted.verify_ms", "predicted.decode_ms",
        "measured", "measured.speedup", "measured.speedup_end_to_end", "measured.tau",
        "measured.speedup_range", "measured.repeats",
        "measured.tokens_per_s", "measured.baseline_tokens_per_s",
        "verified", "verified[].spec_id", "verified[].predicted_speedup",
        "verified[].measured_speedup", "verified[].measured_tau",
        # the fallbacks when hardware.json or run.json lack them
        "hardware", "hardware.name", "hardware.kind", "hardware.memory_gb", "hardware.cuda",
        "hardware.driver", "hardware.threads", "hardware.dtype", "versions",
        "versions.dreams-nas",
    ),
    "specs/<spec-id>/spec.json": (),  # existence only
}
# String keys in reports/ that name no artefact key: figure and colour-map names.
NOT_ARTEFACT_KEYS = {"pareto_latency", "viridis", "tab10"}


# --- the document and the code ------------------------------------------------------------
def test_the_document_parses_and_names_every_artefact() -> None:
    assert set(ARTEFACTS) <= set(SCHEMAS.sections)
    for section in SCHEMAS.artefacts():
        for label in ("Format", "Written by"):
            assert f"**{label}" in section.body, f"`{section.heading}` says no {label}"
    for name in ("run.json", "latency/<hardware-id>/profile.csv", "search/<hardware-id>/best.json"):
        assert SCHEMAS.sections[name].rows, f"`{name}` has no table"


def test_a_malformed_table_is_refused() -> None:
    with pytest.raises(SchemaDocError, match=r"`a.b`: its parent is not documented"):
        Schemas("### `x.json`\n\n| key | type | req | unit | meaning |\n|---|---|---|---|---|\n"
                "| `a.b` | int | yes | – | – |\n")
    with pytest.raises(SchemaDocError, match=r"unknown type\(s\) \['integer'\]"):
        Schemas("### `x.json`\n\n| key | type | req | unit | meaning |\n|---|---|---|---|---|\n"
                "| `a` | integer | yes | – | – |\n")


def test_csv_columns_are_the_writers_columns() -> None:
    from dreams_nas.latency.measure.profile_store import PROFILE_COLUMNS
    from dreams_nas.latency.model.persist import TRAIN_COLUMNS
    from dreams_nas.nas.stages.export import HISTORY_COLUMNS, TRIAL_COLUMNS
    from dreams_nas.supernet.acceptance.table import ACCEPTANCE_COLUMNS
    from dreams_nas.supernet.training.recipe import CURVE_COLUMNS

    expected = {
        "latency/<hardware-id>/profile.csv": PROFILE_COLUMNS,
        "latency/<hardware-id>/predictor_train.csv": TRAIN_COLUMNS,
        "acceptance/<dataset-id>.csv": ACCEPTANCE_COLUMNS,
        "search/<hardware-id>/trials.csv": TRIAL_COLUMNS,
        "search/<hardware-id>/pareto.csv": TRIAL_COLUMNS,
        "search/<hardware-id>/history.csv": HISTORY_COLUMNS,
        "supernet/curve.csv": CURVE_COLUMNS,
    }
    csv_sections = {s.heading for s in SCHEMAS.artefacts() if s.kind == "csv"}
    assert csv_sections == set(expected)
    for heading, columns in expected.items():
        assert SCHEMAS.sections[heading].columns == list(columns), heading


def _constant(owner: type, name: str) -> Any:
    """`name` from the module that defines `owner` (modules move; the public names stay)."""
    return getattr(importlib.import_module(owner.__module__), name)


def test_schema_versions_are_the_codes() -> None:
    from dreams_nas.latency.model import persist
    from dreams_nas.supernet import DraftConfig, RunFolder, SearchSpace, SubnetSpec
    from dreams_nas.supernet.training.feature_store import FeatureStore

    config = _constant(DraftConfig, "CONFIG_SCHEMA_VERSION")
    spec = _constant(SubnetSpec, "SPEC_SCHEMA_VERSION")
    expected = {
        "run.json": _constant(RunFolder, "RUN_SCHEMA_VERSION"), "supernet/config.json": config,
        "latency/<hardware-id>/predictor.json": persist.PREDICTOR_SCHEMA_VERSION,
        "specs/<spec-id>/spec.json": spec, "specs/<spec-id>/config.json": config,
        "{SearchSpace}": _constant(SearchSpace, "SPACE_SCHEMA_VERSION"), "{SubnetSpec}": spec,
        "{DraftConfig}": config,
        "supernet/features/index.json": _constant(FeatureStore, "STORE_SCHEMA_VERSION"),
    }
    versioned = {h for h, s in SCHEMAS.sections.items() if s.schema_version is not None}
    assert versioned == set(expected)
    for heading, version in expected.items():
        assert SCHEMAS.sections[heading].schema_version == ("schema_version", version), heading


def test_every_key_the_report_reads_is_documented() -> None:
    missing = [f"{heading}: {key}" for heading, keys in REPORT_READS.items() for key in keys
               if not SCHEMAS.documents(heading, key)]
    assert not missing


def _literal_keys(path: Path) -> set[str]:
    """String constants used as `.get("key")` or `x["key"]` in one module."""
    keys = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get" and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            keys.add(node.args[0].value)
        if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)):
            keys.add(node.slice.value)
    return keys


def test_report_reads_list_covers_the_reports_code() -> None:
    """A key the report starts reading must join REPORT_READS (and so SCHEMAS.md)."""
    listed = {token for keys in REPORT_READS.values() for key in keys
              for token in key.replace("[]", "").split(".")}
    modules = sorted((ROOT / "reports").rglob("*.py"))
    assert modules
    used = set().union(*(_literal_keys(p) for p in modules))
    assert not used - listed - NOT_ARTEFACT_KEYS


# --- a tiny real run ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tiny_demo, tmp_path_factory) -> dict[str, Any]:
    """The demo on the tiny built-in target (train, profile, score, exhaustive search with
    verification, report: a copy of the session's `tiny_demo`), then an Optuna search (study.db,
    history.csv, best.json unmeasured). Returns the run folder and the demo's best.json
    (overwritten by the Optuna search)."""
    from dreams_nas.nas import cli
    from dreams_nas.supernet.core.device import torch_threads

    run = tiny_demo.copy(tmp_path_factory.mktemp("schemas") / "dreams-run")
    small = ["--device", "cpu", "--limit", "2", "--max-new-tokens", "5", "--json", "-q"]
    (best,) = run.glob("search/*/best.json")
    demo_best = json.loads(best.read_text(encoding="utf-8"))
    with pytest.MonkeyPatch.context() as mp, torch_threads(1):
        tiny_demo.env(mp)
        assert cli.main(["search", "--run", str(run), "--method", "optuna", "--trials", "3",
                         "--verify", "0", *small]) == 0
    return {"root": run, "demo_best": demo_best}


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.slow
def test_every_file_of_the_run_is_documented_and_every_artefact_written(tiny_run) -> None:
    files = _files(tiny_run["root"])
    assert [f for f in files if not SCHEMAS.matching(f)] == []
    written = {s.heading for f in files for s in SCHEMAS.matching(f)}
    assert {s.heading for s in SCHEMAS.artefacts()} - written == set()


def _study_view(db: Path) -> dict[str, Any]:
    """study.db as SCHEMAS.md documents it: the study through Optuna's API, plus the claims."""
    import optuna

    storage = f"sqlite:///{db}"
    (name,) = optuna.study.get_all_study_names(storage)
    study = optuna.load_study(study_name=name, storage=storage)
    with closing(sqlite3.connect(db)) as con:
        con.row_factory = sqlite3.Row
        claims = [dict(r) for r in con.execute("SELECT * FROM dreams_nas_claims")]
    return {
        "study_name": study.study_name, "directions": [d.name for d in study.directions],
        "metric_names": study.metric_names, "user_attrs": study.user_attrs,
        "trials": [{"number": t.number, "state": t.state.name, "values": t.values,
                    "params": t.params, "user_attrs": t.user_attrs}
                   for t in study.get_trials(deepcopy=False)],
        "dreams_nas_claims": claims,
    }


JSON_SECTIONS = [s.heading for s in SCHEMAS.artefacts() if s.kind == "json"]
CSV_SECTIONS = [s.heading for s in SCHEMAS.artefacts() if s.kind == "csv"]


@pytest.mark.slow
@pytest.mark.parametrize("heading", JSON_SECTIONS)
def test_json_files_hold_the_documented_keys_and_types(tiny_run, heading) -> None:
    root: Path = tiny_run["root"]
    section = SCHEMAS.sections[heading]
    paths = [root / f for f in _files(root) if section.path_regex().match(f)]
    assert paths, f"the tiny run wrote no {heading}"
    docs: list[tuple[str, Any]] = []
    for path in paths:
        if path.suffix == ".db":
            docs.append((path.name, _study_view(path)))
        else:
            docs.append((path.name, json.loads(path.read_text(encoding="utf-8"))))
    if heading.endswith("best.json"):
        docs.append(("demo best.json", tiny_run["demo_best"]))  # `measured` and `verified` set
    for name, doc in docs:
        assert SCHEMAS.check_json(heading, doc) == [], name
        if section.schema_version is not None:
            key, version = section.schema_version
            assert doc[key] == version, name


@pytest.mark.slow
def test_the_run_exercises_the_optional_parts(tiny_run) -> None:
    """Both shapes of best.json were checked: measured (the demo) and not (Optuna, --verify 0)."""
    demo = tiny_run["demo_best"]
    assert isinstance(demo["measured"], dict) and demo["verified"]
    (best,) = tiny_run["root"].glob("search/*/best.json")
    optuna_best = json.loads(best.read_text(encoding="utf-8"))
    assert optuna_best["measured"] is None and optuna_best["method"] == "optuna"


@pytest.mark.slow
@pytest.mark.parametrize("heading", CSV_SECTIONS)
def test_csv_files_have_the_documented_header_and_cell_types(tiny_run, heading) -> None:
    root: Path = tiny_run["root"]
    section = SCHEMAS.sections[heading]
    paths = [root / f for f in _files(root) if section.path_regex().match(f)]
    assert paths, f"the tiny run wrote no {heading}"
    for path in paths:
        assert path.read_text(encoding="utf-8").count("\n") > 1, f"{path} has no rows"
        assert SCHEMAS.check_csv(heading, path) == []
