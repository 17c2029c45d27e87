"""Compute the report: read a run folder into one frozen `ReportData`.

`reports/` imports none of the other dreams-nas packages: it reads the files they write, at the
paths of `layout`, and tolerates extra keys/columns and missing optional parts (no Optuna
history, one hardware id, no predictor metrics, no AIFD curves...). The renderers only draw the
`ReportData`, and the tests assert on it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from dreams_nas.reports import layout
from dreams_nas.reports.diagnostics import (
    load_acceptance,
    load_aifd,
    load_predictor,
    load_training,
)
from dreams_nas.reports.reading import integer, read_json_object
from dreams_nas.reports.search_results import (
    cross_hardware,
    load_best,
    load_history,
    load_subnet_table,
    mark_front,
    pick_hardware,
    searched_hardware_ids,
)
from dreams_nas.reports.values import (
    MissingResultsError,
    PairedSpeedups,
    ReportData,
    Subnet,
    SubnetTable,
)

# Up to this many subnets ReportData.subnets is a tuple of Subnet objects; above, their columns
# (a SubnetTable): 10^6 objects would take seconds and a gigabyte to build.
OBJECTS_UP_TO = 20_000


def build_report_data(run_dir: str | Path, hardware_id: str | None = None) -> ReportData:
    """Read a run folder into a `ReportData` for `hardware_id` (default: the latest search)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise MissingResultsError(
            f"run folder {run_dir} does not exist; pass the folder of your run with --run DIR or "
            "run `dreams-nas demo` first"
        )
    hardware_ids = searched_hardware_ids(run_dir)
    hw = pick_hardware(run_dir, hardware_ids, hardware_id)
    table = mark_front(run_dir, hw, load_subnet_table(run_dir, hw))
    best, verified, best_raw = load_best(run_dir, hw)

    run = read_json_object(layout.run_json(run_dir)) or {}
    supernet = run.get("supernet") or {}
    supernet_hash = best_raw.get("supernet_hash") or supernet.get("hash")
    hardware = (read_json_object(layout.hardware_json(run_dir, hw))
                or best_raw.get("hardware") or {"hardware_id": hw})
    front = sorted(table.take(table.on_front), key=lambda s: (-s.speedup, s.draft_ms))
    dataset, curves = load_acceptance(run_dir, [s.spec_id for s in front], supernet_hash,
                                      {s.spec_id: s.tau for s in front},
                                      best_raw.get("dtype") or run.get("dtype"))
    specs_root = layout.specs_root(run_dir)
    exported = frozenset(
        p.name for p in specs_root.iterdir() if layout.spec_json(run_dir, p.name).is_file()
    ) if specs_root.is_dir() else frozenset()
    return ReportData(
        run_dir=run_dir,
        hardware_id=hw,
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        target=dict(run.get("target") or {}),
        supernet_hash=supernet_hash,
        supernet_params=integer(supernet.get("num_params")),
        hardware=dict(hardware),
        versions=dict(best_raw.get("versions") or run.get("versions") or {}),
        subnets=_by_speedup(table),
        best=best,
        verified=verified,
        acceptance_dataset=dataset,
        acceptance=curves,
        predictor=load_predictor(run_dir, hw),
        aifd=load_aifd(run),
        history=load_history(run_dir, hw),
        cross_hardware=cross_hardware(run_dir, hardware_ids),
        searched_hardware_ids=tuple(hardware_ids),
        exported_specs=exported,
        paired=paired_speedups(run_dir, hw, table, hardware_ids),
        training=load_training(run),
    )


def paired_speedups(run_dir: Path, hw: str, table: SubnetTable, hardware_ids: list[str]
                    ) -> PairedSpeedups | None:
    """Speedups here and on the first other searched hardware id, for the subnets both
    scored (None with one hardware id or no subnet in common)."""
    others = [h for h in hardware_ids if h != hw]
    if not others:
        return None
    other = load_subnet_table(run_dir, others[0])
    common, mine, theirs = np.intersect1d(table.spec_id, other.spec_id, return_indices=True)
    if not common.size:
        return None
    return PairedSpeedups(others[0], common, table.speedup[mine], other.speedup[theirs])


def _by_speedup(table: SubnetTable) -> tuple[Subnet, ...] | SubnetTable:
    """Every subnet, best predicted speedup first (ties: by spec id); as objects up to
    OBJECTS_UP_TO subnets, as columns above."""
    ordered = table.rows(np.lexsort((table.spec_id, -table.speedup)))
    return ordered.take(slice(None)) if len(ordered) <= OBJECTS_UP_TO else ordered
