"""The search's files of a run folder as report values: search/<hardware-id>/trials.csv,
pareto.csv, best.json and history.csv (SCHEMAS.md), and which hardware ids were searched."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from dreams_nas.reports.errors import MissingResultsError, ReportError
from dreams_nas.reports.reading import (
    csv_header,
    integer,
    json_object,
    num,
    read_csv,
    whole_csv,
)
from dreams_nas.reports.search_checks import (
    FLAG_TRUE,
    REWRITE,
    check_best,
    check_count,
    check_front,
    check_text,
    numbers,
)
from dreams_nas.reports.subnets import SubnetTable
from dreams_nas.reports.values import BestSubnet, CrossHardware, HistoryPoint, Verified
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.core.spec import SIZE_DEFAULTS, SPEC_FIELDS

# The trials.csv columns the report reads (the writer writes a few more).
TRIALS_COLUMNS = ("number", "spec_id", *SPEC_FIELDS, "tau", "tau_lo", "tau_hi", "draft_ms",
                  "first_draft_ms", "verify_ms", "decode_ms", "speedup", "draft_params",
                  "feasible", "state")
# written since fronts had names (absent: unknown), since token trees (absent: chains), since
# elastic depth and MLP width (absent or empty: depth 1, the whole MLP) and since the draft
# vocabulary (absent or empty: the whole vocabulary)
OPTIONAL_COLUMNS = ("draft_bytes", "tree", "cycle_ms", "depth", "mlp", "draft_vocab")
def _has_trials(run: RunFolder, name: str) -> bool:
    try:
        return run.trials_csv(name).is_file()
    except InputError:  # a folder name no search writes (RunFolder refuses it)
        return False


def searched_hardware_ids(run_dir: str | Path) -> list[str]:
    """Hardware ids with search results (search/<id>/trials.csv) in this run."""
    run = RunFolder(run_dir)
    base = run.search_root
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if _has_trials(run, p.name))


def pick_hardware(run: RunFolder, hardware_ids: Sequence[str], requested: str | None) -> str:
    """`requested`, or by default the hardware id searched last (the newest best.json)."""
    if requested is not None:
        if requested not in hardware_ids:
            have = ", ".join(hardware_ids) or "none"
            raise MissingResultsError(
                f"no search results for hardware id {requested!r} in "
                f"{run.search_root} (searched: {have}); run `dreams-nas search "
                f"--hardware {requested}` or pick one of those"
            )
        return requested
    if not hardware_ids:
        raise MissingResultsError(
            f"no search results in {run.search_root}/<hardware-id>/trials.csv; run "
            "`dreams-nas search` first"
        )

    def created(hw: str) -> str:
        raw = json_object(run.best_json(hw)) or {}
        return str(raw.get("created") or "")

    return max(hardware_ids, key=lambda hw: (created(hw), hw))


# trials.csv columns read as text: the name, the state and the flag (the rest are numbers).
_TEXT_COLUMNS = ("spec_id", "state", "feasible", "tree")


def _read_trials(path: Path) -> pd.DataFrame:
    """The TRIALS_COLUMNS of trials.csv, every row whole (`reading.whole_csv`: the search
    rewrites the file whole, so a row cut short is damage) and every cell of a number column a
    number or empty (`search_checks.numbers`)."""
    data = whole_csv(path, REWRITE)
    wanted = set(TRIALS_COLUMNS) | set(OPTIONAL_COLUMNS)
    frame = pd.read_csv(io.BytesIO(data), usecols=lambda name: name in wanted,
                        dtype={"spec_id": str, "state": "category", "feasible": "category",
                               "tree": str},
                        keep_default_na=False, na_values=[""], low_memory=False,
                        encoding="utf-8")
    for name in OPTIONAL_COLUMNS:
        if name not in frame:
            frame[name] = "" if name in _TEXT_COLUMNS else np.nan
    for name in (*TRIALS_COLUMNS, *OPTIONAL_COLUMNS):
        if name not in _TEXT_COLUMNS:
            frame[name] = numbers(path, frame, name)
    check_text(path, frame)
    for name, default in SIZE_DEFAULTS.items():
        frame[name] = frame[name].fillna(default)
    return frame


def _text(column: pd.Series) -> np.ndarray:
    return column.fillna("").astype(str).to_numpy(dtype=str)


def _is(column: pd.Series, values: Sequence[str]) -> np.ndarray:
    """Whether each cell, stripped and lower-cased, is one of `values` (an empty cell: no)."""
    codes, labels = pd.factorize(column)  # (n,), -1 for an empty cell; a few distinct labels
    labels = np.asarray(labels, dtype=str)
    hit = np.isin(np.char.lower(np.char.strip(labels)), values) if labels.size else labels
    return np.append(hit.astype(bool), False)[codes]


def load_subnet_table(run: RunFolder, hardware_id: str) -> SubnetTable:
    """Every scored subnet of trials.csv as columns, in file order, none marked on the front.

    A row is scored when its state is `complete` and its tau, speedup and draft steps are
    numbers; SCHEMAS.md: a subnet listed twice keeps its last scored row. The file must hold
    as many rows as best.json counts and best.json's subnet (`search_checks`).
    """
    path = run.trials_csv(hardware_id)
    if not path.is_file():
        raise MissingResultsError(f"no search results in {path}; run `dreams-nas search` first")
    missing = [c for c in TRIALS_COLUMNS if c not in csv_header(path)]
    if missing:
        raise ReportError(f"{path} lacks the column(s) {missing}; rerun `dreams-nas search`")
    try:
        frame = _read_trials(path)
    except ReportError:
        raise
    except (ValueError, pd.errors.ParserError) as exc:
        raise ReportError(f"{path} is not a readable CSV ({' '.join(str(exc).split())}); "
                          "rerun `dreams-nas search`") from None
    best_path = run.best_json(hardware_id)
    best = json_object(best_path)
    check_count(path, len(frame), best, best_path)
    number = lambda name: frame[name].to_numpy(dtype=np.float64)  # noqa: E731
    scored = _is(frame["state"], ("complete",)) & ~np.isnan(
        np.stack([number(n) for n in ("speedup", "draft_ms", "first_draft_ms", "tau")])
    ).any(axis=0)
    spec_id = np.char.strip(_text(frame["spec_id"]))
    lacking = np.stack([np.isnan(number(n)) for n in SPEC_FIELDS] + [spec_id == ""])  # (5, n)
    bad = np.flatnonzero(scored & lacking.any(axis=0))
    if bad.size:
        row = int(bad[0])
        names = [n for n, gap in zip((*SPEC_FIELDS, "spec_id"), lacking[:, row], strict=True)
                 if gap]
        raise ReportError(
            f"{path} has a row without {names} (number={_cell(frame['number'].iloc[row])!r}); "
            "every trial names its subnet: rerun `dreams-nas search`"
        )
    # One row per subnet: its last scored one, at the place of that row.
    keep = np.flatnonzero(scored)
    keep = keep[~pd.Series(spec_id[keep]).duplicated(keep="last").to_numpy()]
    if not keep.size:
        raise MissingResultsError(
            f"{path} holds no completed trial; run `dreams-nas search` (again) first"
        )
    whole = lambda name: _whole_numbers(number(name)[keep])  # noqa: E731
    table = SubnetTable(
        spec_id=spec_id[keep],
        # int() of the cell, as a Subnet's spec fields are read
        heads=number("heads")[keep].astype(np.int64),
        visual_keep=number("visual_keep")[keep],
        inject_layer=number("inject_layer")[keep].astype(np.int64),
        draft_len=number("draft_len")[keep].astype(np.int64),
        tau=number("tau")[keep], tau_lo=number("tau_lo")[keep], tau_hi=number("tau_hi")[keep],
        draft_ms=number("draft_ms")[keep], first_draft_ms=number("first_draft_ms")[keep],
        verify_ms=number("verify_ms")[keep], decode_ms=number("decode_ms")[keep],
        speedup=number("speedup")[keep], draft_params=whole("draft_params"),
        feasible=_is(frame["feasible"], FLAG_TRUE)[keep],
        on_front=np.zeros(keep.size, dtype=bool), number=whole("number"),
        draft_bytes=whole("draft_bytes"),
        tree=np.char.strip(_text(frame["tree"]))[keep], recorded_cycle_ms=number("cycle_ms")[keep],
        depth=number("depth")[keep].astype(np.int64), mlp=number("mlp")[keep],
        draft_vocab=number("draft_vocab")[keep],
    )
    check_best(path, table, best, best_path)
    return table


def _whole_numbers(values: np.ndarray) -> np.ndarray:
    """Cells read as whole numbers (`reading.integer`): rounded; NaN for infinite ones."""
    out = np.round(values)
    out[np.isinf(out)] = np.nan
    return out


def _cell(value: Any) -> str:
    """A number cell as written (whole numbers without the '.0'), for a message."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "" if value != value else str(value)


def mark_front(run: RunFolder, hardware_id: str, table: SubnetTable) -> SubnetTable:
    """`table`, the subnets listed in pareto.csv (the search's front) marked on the front;
    pareto.csv must be whole and the front of trials.csv (`search_checks.check_front`)."""
    path = run.pareto_csv(hardware_id)
    if not path.is_file():
        raise MissingResultsError(f"no Pareto front in {path}; run `dreams-nas search` (again)")
    try:
        text = whole_csv(path, REWRITE).decode("utf-8")
    except UnicodeDecodeError:
        raise ReportError(f"{path} is not UTF-8 text; {REWRITE}") from None
    reader = csv.DictReader(text.splitlines())
    if "spec_id" not in (reader.fieldnames or ()):
        raise ReportError(f"{path} has no spec_id column; {REWRITE}")
    front = sorted({(row.get("spec_id") or "").strip() for row in reader})
    best_path = run.best_json(hardware_id)
    check_front(path, front, table, run.trials_csv(hardware_id), json_object(best_path),
                best_path)
    return replace(table, on_front=np.isin(table.spec_id, front))


def load_best(run: RunFolder, hardware_id: str) -> tuple[BestSubnet, tuple[Verified, ...],
                                                         dict[str, Any]]:
    """best.json as the best subnet, the subnets verified end to end, and the raw document."""
    path = run.best_json(hardware_id)
    raw = json_object(path)
    if raw is None:
        raise MissingResultsError(f"no best subnet in {path}; run `dreams-nas search` first")
    spec = raw.get("spec") or {}
    heads, keep = integer(spec.get("heads")), num(spec.get("visual_keep"))
    layer, draft_len = integer(spec.get("inject_layer")), integer(spec.get("draft_len"))
    pred = raw.get("predicted") or {}
    predicted_speedup = num(pred.get("speedup"))
    missing = [k for k in ("spec_id", "spec_dir") if not raw.get(k)]
    missing += [f"spec.{k}" for k, v in zip(SPEC_FIELDS, (heads, keep, layer, draft_len),
                                            strict=True) if v is None]
    missing += ["predicted.speedup"] if predicted_speedup is None else []
    if missing:
        raise ReportError(f"{path} lacks {missing}; rerun `dreams-nas search`")
    meas = raw.get("measured") or {}
    ci = pred.get("tau_ci")
    spec_dir = str(raw["spec_dir"])
    best = BestSubnet(
        spec_id=str(raw["spec_id"]), heads=heads, visual_keep=keep, inject_layer=layer,
        draft_len=draft_len, objective=str(raw.get("objective") or "speedup"),
        method=str(raw.get("method") or "?"), spec_dir=spec_dir,
        predicted_speedup=predicted_speedup, predicted_tau=num(pred.get("tau")),
        tau_ci=_interval(ci),
        draft_ms=num(pred.get("draft_ms")), verify_ms=num(pred.get("verify_ms")),
        decode_ms=num(pred.get("decode_ms")),
        measured_speedup=num(meas.get("speedup")), measured_tau=num(meas.get("tau")),
        tokens_per_s=num(meas.get("tokens_per_s")),
        baseline_tokens_per_s=num(meas.get("baseline_tokens_per_s")),
        created=raw.get("created"),
        tree=str(spec.get("tree") or ""),
        measured_speedup_end_to_end=num(meas.get("speedup_end_to_end")),
        measured_range=_interval(meas.get("speedup_range")),
        measured_repeats=integer(meas.get("repeats")),
        exported=(run.root / spec_dir / "spec.json").is_file(),  # spec_dir: best.json's
        # spec.json omits depth, mlp and draft_vocab at the paper's draft size and the whole
        # vocabulary
        depth=integer(spec.get("depth")) or SIZE_DEFAULTS["depth"],
        mlp=num(spec.get("mlp")) or SIZE_DEFAULTS["mlp"],
        draft_vocab=num(spec.get("draft_vocab")) or SIZE_DEFAULTS["draft_vocab"],
    )
    verified = []
    for item in raw.get("verified") or []:
        p, m = num(item.get("predicted_speedup")), num(item.get("measured_speedup"))
        if item.get("spec_id") and p is not None and m is not None:
            verified.append(Verified(str(item["spec_id"]), p, m, num(item.get("measured_tau"))))
    return best, tuple(verified), raw


def load_history(run: RunFolder, hardware_id: str) -> tuple[HistoryPoint, ...]:
    """history.csv (Optuna searches only; () without one)."""
    path = run.history_csv(hardware_id)
    if not path.is_file():
        return ()
    points = []
    for row in read_csv(path):
        number = integer(row.get("number"))
        if number is not None:
            points.append(HistoryPoint(number, num(row.get("value")), num(row.get("best_so_far"))))
    return tuple(sorted(points, key=lambda p: p.number))


def cross_hardware(run: RunFolder, hardware_ids: Sequence[str]) -> CrossHardware | None:
    """Each searched hardware's best subnet, looked up in every hardware's trials."""
    if len(hardware_ids) < 2:
        return None
    tables: dict[str, SubnetTable] = {}
    bests: dict[str, str] = {}
    for hw in hardware_ids:
        table = tables[hw] = load_subnet_table(run, hw)
        # best.json is the search's last write: until it is there, the fastest subnet stands in.
        raw = json_object(run.best_json(hw)) or {}
        bests[hw] = str(raw.get("spec_id") or table.spec_id[int(np.argmax(table.speedup))])

    def speedup(hw: str, spec_id: str) -> float | None:
        row = tables[hw].index_of(spec_id)
        return None if row is None else float(tables[hw].speedup[row])

    matrix = tuple(tuple(speedup(col, bests[row]) for col in hardware_ids)
                   for row in hardware_ids)
    return CrossHardware(tuple(hardware_ids), tuple(bests[h] for h in hardware_ids), matrix)


def _interval(value: Any) -> tuple[float, float] | None:
    """A [low, high] pair of numbers, else None (null ends: an interval nobody could compute)."""
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2:
        return None
    low, high = num(value[0]), num(value[1])
    return None if low is None or high is None else (low, high)
