"""The copies that `reports/` keeps on purpose agree with the originals.

reports imports none of the other packages (import-linter holds it), so it states again two
things they own: the Pareto front (`nas.search.pareto.is_pareto_front`) and the run-folder
layout (`supernet.core.runfolder.RunFolder`). These tests are the only place both sides meet.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from dreams_nas.nas.search.candidate import Candidate
from dreams_nas.nas.search.pareto import is_pareto_front as search_front
from dreams_nas.nas.search.strategies import (
    FRONT_DIRECTIONS,
    SearchResult,
    best_candidate,
    history_of,
    pareto_front,
)
from dreams_nas.nas.stages.export import SearchRecord, export_result
from dreams_nas.reports import build_report_data, layout, searched_hardware_ids
from dreams_nas.reports.pareto import pareto_mask
from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.core.space import SubnetSpec


# --- the Pareto front ---------------------------------------------------------------------
def _random_values(rng: np.random.Generator, n_objectives: int) -> np.ndarray:
    """(n, n_objectives) small integers (many ties and duplicates), some ±inf and NaN."""
    n = int(rng.integers(0, 60))
    values = rng.integers(0, 5, size=(n, n_objectives)).astype(np.float64)
    for special, share in ((np.inf, 0.05), (-np.inf, 0.05), (np.nan, 0.04)):
        values[rng.random(values.shape) < share] = special
    return values


def test_pareto_mask_is_the_search_front_of_speedup_and_cost() -> None:
    # The report's two-objective form: maximise the first list, minimise the second, as the
    # search's front does (speedup, draft_params).
    assert FRONT_DIRECTIONS == ("maximize", "minimize")
    rng = np.random.default_rng(7)
    for _ in range(600):
        values = _random_values(rng, 2)
        expected = search_front(values, FRONT_DIRECTIONS).tolist()
        assert pareto_mask(list(values[:, 0]), list(values[:, 1])) == expected, values


@pytest.mark.parametrize("directions", list(itertools.product(("maximize", "minimize"),
                                                              repeat=2)), ids="-".join)
def test_pareto_mask_serves_every_pair_of_directions(directions) -> None:
    # Negating a column turns minimise into maximise: every direction pair agrees too.
    rng = np.random.default_rng(sum(d == "maximize" for d in directions))
    signs = [1.0 if d == "maximize" else -1.0 for d in directions]
    for _ in range(150):
        values = _random_values(rng, 2)
        expected = search_front(values, directions).tolist()
        assert pareto_mask(list(signs[0] * values[:, 0]),
                           list(-signs[1] * values[:, 1])) == expected, (values, directions)


def test_pareto_mask_on_many_points() -> None:
    # More points than one comparison block of the search's implementation.
    rng = np.random.default_rng(11)
    values = rng.integers(0, 30, size=(2500, 2)).astype(np.float64)
    values[rng.random(2500) < 0.01, 1] = np.nan
    assert (pareto_mask(list(values[:, 0]), list(values[:, 1]))
            == search_front(values, FRONT_DIRECTIONS).tolist())


def test_pareto_mask_refuses_lists_of_different_lengths() -> None:
    with pytest.raises(ValueError, match="equal lengths, got 2 and 1"):
        pareto_mask([1.0, 2.0], [1.0])


# --- the run-folder layout ----------------------------------------------------------------
HW, DATASET, SPEC_ID = "nvidia-h100-80gb-hbm3", "builtin-eval-n64-s0", "h4-v0.50-l12-g5"


def test_every_path_the_report_reads_is_the_run_folders(tmp_path) -> None:
    run = RunFolder(tmp_path / "run")
    root = run.root
    pairs = {
        "run.json": (layout.run_json(root), run.run_json),
        "latency dir": (layout.latency_dir(root, HW), run.latency_dir(HW)),
        "predictor.json": (layout.predictor_json(root, HW), run.predictor_json(HW)),
        "acceptance csv": (layout.acceptance_csv(root, DATASET), run.acceptance_csv(DATASET)),
        "acceptance dir": (layout.acceptance_dir(root), run.acceptance_csv(DATASET).parent),
        "search dir": (layout.search_dir(root, HW), run.search_dir(HW)),
        "search root": (layout.search_root(root), run.search_dir(HW).parent),
        "trials.csv": (layout.trials_csv(root, HW), run.trials_csv(HW)),
        "pareto.csv": (layout.pareto_csv(root, HW), run.pareto_csv(HW)),
        "best.json": (layout.best_json(root, HW), run.best_json(HW)),
        "specs root": (layout.specs_root(root), run.specs_root),
        "spec dir": (layout.spec_dir(root, SPEC_ID), run.spec_dir(SPEC_ID)),
        "report.html": (layout.report_html(root), run.report_html),
        # RunFolder gives the folder; nas.stages.profile names the file inside it.
        "hardware.json": (layout.hardware_json(root, HW), run.latency_dir(HW) / "hardware.json"),
    }
    for artefact, (report_path, run_path) in pairs.items():
        assert report_path == run_path, artefact


def test_dataset_ids_are_read_back_as_written(tmp_path) -> None:
    run = RunFolder(tmp_path / "run")
    path = run.acceptance_csv(DATASET)
    path.parent.mkdir(parents=True)
    path.write_text("spec_id\n")
    assert [p.stem for p in layout.acceptance_dir(run.root).glob("*.csv")] == run.dataset_ids()


def _candidates() -> list[Candidate]:
    out = []
    grid = itertools.product((2, 4, 8), (0.5, 1.0), (12,), (3, 5))
    for number, (heads, keep, layer, draft_len) in enumerate(grid):
        draft_ms = 1.0 + 0.2 * heads + 0.5 * keep
        tau = 1.0 + 0.3 * draft_len * (0.5 + 0.05 * heads + 0.2 * keep)
        verify_ms, decode_ms = 20.0 + draft_len, 20.0
        speedup = tau * decode_ms / (1.1 * draft_ms + (draft_len - 1) * draft_ms + verify_ms)
        out.append(Candidate(
            spec=SubnetSpec(heads, keep, layer, draft_len), tau=tau,
            tau_ci=(0.95 * tau, 1.05 * tau),
            draft_ms=draft_ms, first_draft_ms=1.1 * draft_ms, verify_ms=verify_ms,
            decode_ms=decode_ms, speedup=speedup, draft_params=1_000_000 + 100_000 * heads,
            feasible=draft_ms < 2.5, number=number))
    return out


def test_the_report_reads_what_the_search_writes_where_it_writes_it(tmp_path) -> None:
    run = RunFolder(tmp_path / "run")
    candidates = _candidates()
    result = SearchResult(
        objective="pareto", method="optuna", candidates=tuple(candidates),
        front=tuple(pareto_front(candidates)), best=best_candidate(candidates),
        space_size=len(candidates), n_scored=0, history=history_of(candidates))
    written = export_result(run, result, SearchRecord(HW, {}, "0123456789abcdef", "float32"))
    best_id = result.best.spec.id
    assert written["trials"] == layout.trials_csv(run.root, HW)
    assert written["pareto"] == layout.pareto_csv(run.root, HW)
    assert written["history"] == layout.history_csv(run.root, HW)
    assert written["best"] == layout.best_json(run.root, HW)
    assert written["spec_dir"] == layout.spec_dir(run.root, best_id)
    assert layout.spec_json(run.root, best_id).is_file()
    assert searched_hardware_ids(run.root) == [HW]

    data = build_report_data(run.root)
    front_ids = {c.spec.id for c in result.front}
    assert {s.spec_id for s in data.front} == front_ids
    assert data.best.spec_id == best_id and data.best.exported
    assert data.exported_specs == front_ids | {best_id}
    assert len(data.subnets) == len(candidates) and len(data.history) == len(candidates)
