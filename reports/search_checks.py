"""The search's files checked against each other before a report believes them: trials.csv
whole (no row cut short, every cell it reads a number where numbers go) and as long as best.json
counts, best.json's subnet among its trials, and pareto.csv the front of those trials.

The search rewrites each of these files whole (atomically), so a file that fails a check is
damaged or edited, never a search in progress: it is refused in one line naming it and
`dreams-nas search`, which writes it again (SCHEMAS.md), instead of being read into a report of
other subnets or of another front.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from dreams_nas.reports.errors import ReportError
from dreams_nas.reports.subnets import SubnetTable
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.pareto import is_pareto_front
from dreams_nas.supernet.core.spec import SubnetSpec

REWRITE = "rerun `dreams-nas search` to write it again"
FLAG_TRUE = ("1", "true", "yes", "1.0")
_FLAG_FALSE = ("0", "false", "no", "0.0")
# best.json `front`: the trials.csv columns a front may maximise and minimise
_MAXIMISED = ("tau", "speedup")
_MINIMISED = ("cycle_ms", "draft_bytes", "draft_params")


def numbers(path: Path, frame: pd.DataFrame, name: str) -> pd.Series:
    """Column `name` of trials.csv as numbers, an empty cell NaN; a cell that is neither (text
    where a number goes) or is infinite (the search writes none) is refused naming its line."""
    column = frame[name]
    out = pd.to_numeric(column, errors="coerce")
    values = out.to_numpy(dtype=np.float64)
    bad = np.flatnonzero((np.isnan(values) & column.notna().to_numpy()) | np.isinf(values))
    if bad.size:
        raise ReportError(f"{path}, line {int(bad[0]) + 2}: {name} {column.iloc[bad[0]]!r} is "
                          f"not a finite number; the file is damaged: {REWRITE}")
    return out


def check_text(path: Path, frame: pd.DataFrame) -> None:
    """Every trial `complete` (the only state the search writes) and flagged feasible or not."""
    for name, allowed in (("state", ("complete",)), ("feasible", FLAG_TRUE + _FLAG_FALSE)):
        codes, labels = pd.factorize(frame[name])  # (n,), -1 for an empty cell; a few labels
        labels = np.char.lower(np.char.strip(np.asarray(labels, dtype=str)))
        known = np.append(np.isin(labels, allowed), False)  # [-1]: an empty cell
        bad = np.flatnonzero(~known[codes])
        if bad.size:
            raise ReportError(
                f"{path}, line {int(bad[0]) + 2}: {name} {frame[name].iloc[bad[0]]!r} is not "
                f"one of {list(allowed)}; the file is damaged: {REWRITE}")


def check_count(path: Path, rows: int, best: Mapping[str, Any] | None, best_path: Path) -> None:
    """trials.csv holds one row per subnet best.json counts as evaluated (`n_evaluations`; not
    checked without a best.json or without the count)."""
    counted = (best or {}).get("n_evaluations")
    if isinstance(counted, int) and not isinstance(counted, bool) and counted != rows:
        raise ReportError(
            f"{path} holds {rows} trial row(s) where {best_path} counts {counted} evaluated "
            f"subnets: rows were cut off, dropped or repeated; {REWRITE}")


def check_best(path: Path, table: SubnetTable, best: Mapping[str, Any] | None,
               best_path: Path) -> None:
    """best.json's subnet is a scored trial of trials.csv, named as its fields say."""
    spec_id = (best or {}).get("spec_id")
    if not isinstance(spec_id, str) or not spec_id:
        return  # `load_best` names what best.json lacks
    row = table.index_of(spec_id)
    if row is None:
        raise ReportError(f"{best_path} names the best subnet {spec_id}, which {path} does not "
                          f"hold as a scored trial; {REWRITE}")
    check_ids(path, table, [row])


def check_ids(path: Path, table: SubnetTable, rows: Iterable[int]) -> None:
    """Each of `rows` (indices into `table`) has the id its spec fields make (`SubnetSpec.id`)."""
    for row in rows:
        subnet = table[int(row)]
        try:
            made = SubnetSpec(subnet.heads, subnet.visual_keep, subnet.inject_layer,
                              subnet.draft_len, tree=subnet.tree, depth=subnet.depth,
                              mlp=subnet.mlp, draft_vocab=subnet.draft_vocab).id
        except (InputError, ValueError) as exc:
            made = f"none ({' '.join(str(exc).split())[:200]})"
        if made != subnet.spec_id:
            raise ReportError(f"{path}: the trial named {subnet.spec_id} has the fields of "
                              f"{made}; the file is damaged: {REWRITE}")


def check_front(path: Path, front: Sequence[str], table: SubnetTable, trials: Path,
                best: Mapping[str, Any] | None, best_path: Path) -> None:
    """pareto.csv (`front`: its spec ids) lists scored subnets of trials.csv, and exactly the
    feasible front of the pair best.json `front` names (only the first without that pair)."""
    listed = set(front)
    stray = sorted(listed - set(table.spec_id.tolist()))
    if stray:
        raise ReportError(f"{path} lists {_few(stray)}, not among the scored subnets of {trials}; "
                          f"{REWRITE}")
    pair = (best or {}).get("front")
    if not isinstance(pair, Mapping):
        return
    high, low = pair.get("maximise"), pair.get("minimise")
    if high not in _MAXIMISED or low not in _MINIMISED:
        raise ReportError(f"{best_path} names the front {high!r} against {low!r}, not a pair "
                          f"the search writes; {REWRITE}")
    cycle = np.where(np.isnan(table.recorded_cycle_ms), table.cycle_ms, table.recorded_cycle_ms)
    columns = {"tau": table.tau, "speedup": table.speedup, "cycle_ms": cycle,
               "draft_bytes": table.draft_bytes, "draft_params": table.draft_params}
    feasible = np.flatnonzero(table.feasible)
    values = np.column_stack([columns[high][feasible], columns[low][feasible]])
    on = feasible[is_pareto_front(values, ("maximize", "minimize"))]
    expected = set(table.spec_id[on].tolist())
    if expected != listed:
        raise ReportError(
            f"{path} is not the front of {trials} (maximising {high}, minimising {low}): it "
            f"lacks {_few(sorted(expected - listed))} and lists {_few(sorted(listed - expected))}"
            f" off it; {REWRITE}")
    check_ids(trials, table, on)


def _few(ids: Sequence[str]) -> str:
    if not ids:
        return "none"
    return ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
