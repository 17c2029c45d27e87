"""Compute the report: read a run folder into one frozen `ReportData`.

`reports/` reads the files the other packages write, at the paths of
`supernet.core.runfolder.RunFolder` (the only part of the project it imports is `supernet.core`),
and tolerates extra keys/columns and missing optional parts (no Optuna history, one hardware id,
no predictor metrics, no AIFD curves...). The renderers only draw the `ReportData`, and the tests
assert on it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from dreams_nas.reports.diagnostics import (
    load_acceptance,
    load_aifd,
    load_predictor,
    load_training,
)
from dreams_nas.reports.errors import MissingResultsError
from dreams_nas.reports.reading import integer, json_object
from dreams_nas.reports.search_results import (
    cross_hardware,
    load_best,
    load_history,
    load_subnet_table,
    mark_front,
    pick_hardware,
    searched_hardware_ids,
)
from dreams_nas.reports.subnets import Subnet, SubnetTable
from dreams_nas.reports.values import PairedSpeedups, ReportData
from dreams_nas.supernet.core.runfolder import RunFolder

# Up to this many subnets ReportData.subnets is a tuple of Subnet objects; above, their columns
# (a SubnetTable): building a large search's subnets as objects costs much time and memory.
OBJECTS_UP_TO = 20_000


def build_report_data(run_dir: str | Path, hardware_id: str | None = None) -> ReportData:
    """Read a run folder into a `ReportData` for `hardware_id` (default: the latest search)."""
    run = RunFolder(run_dir)
    if not run.root.is_dir():
        raise MissingResultsError(
            f"run folder {run.root} does not exist; pass the folder of your run with --run DIR "
            "or run `dreams-nas demo` first"
        )
    hardware_ids = searched_hardware_ids(run.root)
    hw = pick_hardware(run, hardware_ids, hardware_id)
    table = mark_front(run, hw, load_subnet_table(run, hw))
    best, verified, best_raw = load_best(run, hw)

    meta = json_object(run.run_json) or {}
    supernet = meta.get("supernet") or {}
    supernet_hash = best_raw.get("supernet_hash") or supernet.get("hash")
    hardware = (json_object(run.hardware_json(hw))
                or best_raw.get("hardware") or {"hardware_id": hw})
    front = sorted(table.take(table.on_front), key=lambda s: (-s.speedup, s.draft_ms))
    dataset, curves = load_acceptance(run, [s.spec_id for s in front], supernet_hash,
                                      {s.spec_id: s.tau for s in front},
                                      best_raw.get("dtype") or meta.get("dtype"))
    specs_root = run.specs_root
    exported = frozenset(
        p.name for p in specs_root.iterdir() if run.spec_json(p.name).is_file()
    ) if specs_root.is_dir() else frozenset()
    return ReportData(
        run_dir=run.root,
        hardware_id=hw,
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        target=dict(meta.get("target") or {}),
        supernet_hash=supernet_hash,
        supernet_params=integer(supernet.get("num_params")),
        hardware=dict(hardware),
        versions=dict(best_raw.get("versions") or meta.get("versions") or {}),
        subnets=_by_speedup(table),
        best=best,
        verified=verified,
        acceptance_dataset=dataset,
        acceptance=curves,
        predictor=load_predictor(run, hw),
        aifd=load_aifd(meta),
        history=load_history(run, hw),
        cross_hardware=cross_hardware(run, hardware_ids),
        searched_hardware_ids=tuple(hardware_ids),
        exported_specs=exported,
        paired=paired_speedups(run, hw, table, hardware_ids),
        training=load_training(meta),
    )


def paired_speedups(run: RunFolder, hw: str, table: SubnetTable, hardware_ids: list[str]
                    ) -> PairedSpeedups | None:
    """Speedups here and on the first other searched hardware id, for the subnets both
    scored (None with one hardware id or no subnet in common)."""
    others = [h for h in hardware_ids if h != hw]
    if not others:
        return None
    other = load_subnet_table(run, others[0])
    common, mine, theirs = np.intersect1d(table.spec_id, other.spec_id, return_indices=True)
    if not common.size:
        return None
    return PairedSpeedups(others[0], common, table.speedup[mine], other.speedup[theirs])


def _by_speedup(table: SubnetTable) -> tuple[Subnet, ...] | SubnetTable:
    """Every subnet, best predicted speedup first (ties: by spec id); as objects up to
    OBJECTS_UP_TO subnets, as columns above."""
    ordered = table.rows(np.lexsort((table.spec_id, -table.speedup)))
    return ordered.take(slice(None)) if len(ordered) <= OBJECTS_UP_TO else ordered
