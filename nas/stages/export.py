"""Write a search's results into the run folder (formats in SCHEMAS.md; every write atomic).

search/<hw>/trials.csv    every evaluated subnet
search/<hw>/pareto.csv    the feasible front of the search's pair (best.json `front`)
search/<hw>/history.csv   Optuna only: number, value, best_so_far
search/<hw>/best.json     the chosen subnet: predicted (and, once verified, measured) figures
specs/<spec_id>/          spec.json + the extracted draft (draft.safetensors + config.json)
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dreams_nas.nas.search.candidate import FRONTS, Candidate
from dreams_nas.nas.search.strategies import SearchResult
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.io import atomic_write_json, atomic_write_text
from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.core.spec import SPEC_SCHEMA_VERSION, SubnetSpec
from dreams_nas.supernet.core.versions import library_versions

TRIAL_COLUMNS: tuple[str, ...] = (
    "number", "spec_id", "heads", "visual_keep", "inject_layer", "draft_len", "tree", "depth",
    "mlp", "draft_vocab", "tau", "tau_lo", "tau_hi", "draft_ms", "first_draft_ms", "verify_ms",
    "decode_ms", "speedup", "draft_params", "draft_bytes", "cycle_ms", "cycle_overhead_ms",
    "feasible", "state", "method", "objective",
)
HISTORY_COLUMNS: tuple[str, ...] = ("number", "value", "best_so_far")

# Writes the extracted draft of `spec` (draft.safetensors + config.json) into a folder.
DraftWriter = Callable[[SubnetSpec, Path], None]


@dataclass(frozen=True)
class SearchRecord:
    """What best.json and the spec folders record of a search besides its result.

    inputs:     what the result was computed from (`nas.stages.search.search_inputs`), the key
                its reuse is checked against, and how its prices were obtained (`latency`,
                not checked); None: the file is never reused.
    cycle_note: why the speculative cycle's own work is priced 0 ms (a profile without
                ``cycle`` rows); None: it is priced.
    """

    hardware_id: str
    hardware: Mapping[str, Any]
    supernet_hash: str
    dtype: str
    target: Mapping[str, Any] = field(default_factory=dict)
    inputs: Mapping[str, Any] | None = None
    cycle_note: str | None = None


def _csv_text(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="raise",
                            lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(v) for k, v in row.items()})
    return buf.getvalue()


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return value


def trial_rows(candidates: Sequence[Candidate], *, method: str, objective: str,
               state: str = "complete") -> list[dict[str, Any]]:
    return [{**c.to_row(), "state": state, "method": method, "objective": objective}
            for c in candidates]


def write_trials(path: Path, candidates: Sequence[Candidate], *, method: str,
                 objective: str) -> Path:
    rows = trial_rows(candidates, method=method, objective=objective)
    return atomic_write_text(path, _csv_text(rows, TRIAL_COLUMNS))


def write_history(path: Path, history: Sequence[tuple[int, float, float]]) -> Path:
    rows = [{"number": n, "value": v, "best_so_far": b} for n, v, b in history]
    return atomic_write_text(path, _csv_text(rows, HISTORY_COLUMNS))


def predicted(c: Candidate) -> dict[str, Any]:
    return {"speedup": c.speedup, "tau": c.tau, "tau_ci": [c.tau_ci[0], c.tau_ci[1]],
            "draft_ms": c.draft_ms, "first_draft_ms": c.first_draft_ms, "verify_ms": c.verify_ms,
            "decode_ms": c.decode_ms, "cycle_overhead_ms": c.cycle_overhead_ms}


def write_spec_dir(folder: Path, c: Candidate, record: SearchRecord,
                   write_draft: DraftWriter | None = None) -> Path:
    """specs/<spec_id>/: spec.json (+ the extracted draft when `write_draft` is given, in
    `record.dtype`, the run's: the one its latency and acceptance were measured in)."""
    from dreams_nas.supernet.decoding.hf_entry import write_shim

    folder.mkdir(parents=True, exist_ok=True)
    if write_draft is not None:
        write_draft(c.spec, folder)
        write_shim(folder)  # model.generate(custom_generate=folder, trust_remote_code=True)
    atomic_write_json(folder / "spec.json", {  # RunFolder.spec_json
        "schema_version": SPEC_SCHEMA_VERSION, "spec": c.spec.to_dict(), "spec_id": c.spec.id,
        "target": dict(record.target), "supernet_hash": record.supernet_hash,
        "hardware": dict(record.hardware), "dtype": record.dtype, "predicted": predicted(c),
        "tau": c.tau, "tau_ci": [c.tau_ci[0], c.tau_ci[1]], "draft_params": c.draft_params,
        "versions": library_versions(),
    })
    return folder


def _inside(run: RunFolder, folder: Path) -> Path:
    """`folder`, refused when it (or a link on its way) leads out of the run folder: a spec
    written through a link would change files elsewhere."""
    where = folder.resolve()
    if not where.is_relative_to(run.root.resolve()):
        raise InputError(f"{folder} leads to {where}, outside the run folder {run.root}; "
                         f"remove the link (the search writes the spec there)")
    return folder


def best_payload(result: SearchResult, record: SearchRecord,
                 measured: Mapping[str, Any] | None = None,
                 verified: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """best.json's document."""
    best = result.best
    if best is None:
        raise ValueError("no feasible subnet: nothing to write to best.json")
    return {
        "hardware_id": record.hardware_id, "objective": result.objective,
        "method": result.method,
        "front": {"axes": result.front_axes, "maximise": FRONTS[result.front_axes][0],
                  "minimise": FRONTS[result.front_axes][1],
                  "spec_ids": [c.spec.id for c in result.front]},
        "spec": best.spec.to_dict(), "spec_id": best.spec.id, "spec_dir": f"specs/{best.spec.id}",
        "predicted": predicted(best),
        "measured": dict(measured) if measured is not None else None,
        "verified": [dict(v) for v in verified],
        "hardware": dict(record.hardware), "supernet_hash": record.supernet_hash,
        "dtype": record.dtype,
        "inputs": dict(record.inputs) if record.inputs is not None else None,
        "cycle_overhead": {"priced": record.cycle_note is None, "note": record.cycle_note},
        "n_evaluations": result.n_evaluations, "space_size": result.space_size,
        "study_name": result.study_name,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": library_versions(),
    }


def export_result(run: RunFolder, result: SearchResult, record: SearchRecord, *,
                  write_draft: DraftWriter | None = None,
                  spec_ids: Sequence[str] | None = None) -> dict[str, Path]:
    """Write every file of one search (best.json with the prediction alone); returns their
    paths by name. spec_ids: which candidates get a specs/<id>/ folder (default: the best one
    and the front)."""
    hardware_id = record.hardware_id
    paths: dict[str, Path] = {}
    paths["trials"] = write_trials(run.trials_csv(hardware_id), result.candidates,
                                   method=result.method, objective=result.objective)
    paths["pareto"] = write_trials(run.pareto_csv(hardware_id), result.front,
                                   method=result.method, objective=result.objective)
    if result.history:
        paths["history"] = write_history(run.history_csv(hardware_id),
                                         result.history)
    if result.best is not None:
        wanted = set(spec_ids) if spec_ids is not None else (
            {result.best.spec.id} | {c.spec.id for c in result.front})
        for c in result.candidates:
            if c.spec.id in wanted:
                write_spec_dir(_inside(run, run.spec_dir(c.spec.id)), c, record, write_draft)
        paths["best"] = write_best(run, result, record)
        paths["spec_dir"] = run.spec_dir(result.best.spec.id)
    return paths


def write_best(run: RunFolder, result: SearchResult, record: SearchRecord,
               measured: Mapping[str, Any] | None = None,
               verified: Sequence[Mapping[str, Any]] = ()) -> Path:
    """search/<hw>/best.json, atomically: first with the prediction alone, then again once
    the end-to-end measurement is in."""
    return atomic_write_json(run.best_json(record.hardware_id),
                             best_payload(result, record, measured, verified))
