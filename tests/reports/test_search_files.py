"""The report reads what the search writes, where it writes it: a search result exported by
`nas.stages.export` into a run folder, then read back by `build_report_data`."""

from __future__ import annotations

import itertools

from dreams_nas.nas.search.candidate import Candidate
from dreams_nas.nas.search.strategies import (
    SearchResult,
    best_candidate,
    history_of,
    pareto_front,
)
from dreams_nas.nas.stages.export import SearchRecord, export_result
from dreams_nas.reports import build_report_data, searched_hardware_ids
from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.core.spec import SubnetSpec

HW = "nvidia-h100-80gb-hbm3"


def _candidates() -> list[Candidate]:
    """A 12-subnet grid whose speedups trade off against draft size, a few infeasible."""
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
    assert written["trials"] == run.trials_csv(HW)
    assert written["pareto"] == run.pareto_csv(HW)
    assert written["best"] == run.best_json(HW)
    assert written["history"].parent == run.search_dir(HW)
    assert written["spec_dir"] == run.spec_dir(best_id)
    assert searched_hardware_ids(run.root) == [HW]

    data = build_report_data(run.root)
    front_ids = {c.spec.id for c in result.front}
    assert {s.spec_id for s in data.front} == front_ids
    assert data.best.spec_id == best_id and data.best.exported
    assert data.exported_specs == front_ids | {best_id}
    assert len(data.subnets) == len(candidates) and len(data.history) == len(candidates)
