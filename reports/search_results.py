"""The search's files of a run folder as report values: search/<hardware-id>/trials.csv,
pareto.csv, best.json and history.csv (SCHEMAS.md), and which hardware ids were searched."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dreams_nas.reports import layout
from dreams_nas.reports.reading import (
    csv_header,
    flag,
    integer,
    num,
    read_csv,
    read_json_object,
)
from dreams_nas.reports.values import (
    BestSubnet,
    CrossHardware,
    HistoryPoint,
    MissingResultsError,
    ReportError,
    Subnet,
    Verified,
)

SPEC_FIELDS = ("heads", "visual_keep", "inject_layer", "draft_len")
# The trials.csv columns the report reads (the writer writes a few more).
TRIALS_COLUMNS = ("number", "spec_id", *SPEC_FIELDS, "tau", "tau_lo", "tau_hi", "draft_ms",
                  "first_draft_ms", "verify_ms", "decode_ms", "speedup", "draft_params",
                  "feasible", "state")


def searched_hardware_ids(run_dir: str | Path) -> list[str]:
    """Hardware ids with search results (search/<id>/trials.csv) in this run."""
    run_dir = Path(run_dir)
    base = layout.search_root(run_dir)
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if layout.trials_csv(run_dir, p.name).is_file())


def pick_hardware(run_dir: Path, hardware_ids: Sequence[str], requested: str | None) -> str:
    """`requested`, or by default the hardware id searched last (the newest best.json)."""
    if requested is not None:
        if requested not in hardware_ids:
            have = ", ".join(hardware_ids) or "none"
            raise MissingResultsError(
                f"no search results for hardware id {requested!r} in "
                f"{layout.search_root(run_dir)} (searched: {have}); run `dreams-nas search "
                f"--hardware {requested}` or pick one of those"
            )
        return requested
    if not hardware_ids:
        raise MissingResultsError(
            f"no search results in {layout.search_root(run_dir)}/<hardware-id>/trials.csv; run "
            "`dreams-nas search` first"
        )

    def created(hw: str) -> str:
        raw = read_json_object(layout.best_json(run_dir, hw)) or {}
        return str(raw.get("created") or "")

    return max(hardware_ids, key=lambda hw: (created(hw), hw))


def _subnet_from_row(row: dict[str, str], path: Path) -> Subnet | None:
    """A trials.csv row as a Subnet (off the front); None for a row without a usable score."""
    speedup, draft_ms, tau = num(row["speedup"]), num(row["draft_ms"]), num(row["tau"])
    first_draft_ms = num(row["first_draft_ms"])
    if ((row["state"] or "").strip().lower() != "complete"
            or None in (speedup, draft_ms, first_draft_ms, tau)):
        return None
    fields = {n: num(row[n]) for n in SPEC_FIELDS}
    spec_id = (row["spec_id"] or "").strip()
    missing = [n for n, v in fields.items() if v is None] + ([] if spec_id else ["spec_id"])
    if missing:
        raise ReportError(
            f"{path} has a row without {missing} (number={row['number']!r}); every trial names "
            "its subnet: rerun `dreams-nas search`"
        )
    return Subnet(
        spec_id=spec_id, heads=int(fields["heads"]), visual_keep=float(fields["visual_keep"]),
        inject_layer=int(fields["inject_layer"]), draft_len=int(fields["draft_len"]),
        tau=tau, tau_lo=num(row["tau_lo"]), tau_hi=num(row["tau_hi"]),
        draft_ms=draft_ms, first_draft_ms=first_draft_ms, verify_ms=num(row["verify_ms"]),
        decode_ms=num(row["decode_ms"]),
        speedup=speedup, draft_params=integer(row["draft_params"]), feasible=flag(row["feasible"]),
        on_front=False, number=integer(row["number"]),
    )


def load_subnets(run_dir: Path, hardware_id: str) -> list[Subnet]:
    """Every scored subnet of trials.csv, in file order, none marked on the front yet."""
    path = layout.trials_csv(run_dir, hardware_id)
    if not path.is_file():
        raise MissingResultsError(f"no search results in {path}; run `dreams-nas search` first")
    missing = [c for c in TRIALS_COLUMNS if c not in csv_header(path)]
    if missing:
        raise ReportError(f"{path} lacks the column(s) {missing}; rerun `dreams-nas search`")
    # One subnet per spec id; SCHEMAS.md: a subnet listed twice keeps its last row.
    by_id: dict[str, Subnet] = {}
    for row in read_csv(path):
        sub = _subnet_from_row(row, path)
        if sub is not None:
            by_id.pop(sub.spec_id, None)
            by_id[sub.spec_id] = sub
    if not by_id:
        raise MissingResultsError(
            f"{path} holds no completed trial; run `dreams-nas search` (again) first"
        )
    return list(by_id.values())


def mark_front(run_dir: Path, hardware_id: str, subnets: Sequence[Subnet]) -> list[Subnet]:
    """`subnets`, those listed in pareto.csv (the search's front) marked on the front."""
    path = layout.pareto_csv(run_dir, hardware_id)
    if not path.is_file():
        raise MissingResultsError(f"no Pareto front in {path}; run `dreams-nas search` (again)")
    front = {(row.get("spec_id") or "").strip() for row in read_csv(path)}
    return [replace(s, on_front=s.spec_id in front) for s in subnets]


def load_best(run_dir: Path, hardware_id: str) -> tuple[BestSubnet, tuple[Verified, ...],
                                                        dict[str, Any]]:
    """best.json as the best subnet, the subnets verified end to end, and the raw document."""
    path = layout.best_json(run_dir, hardware_id)
    raw = read_json_object(path)
    if raw is None:
        raise MissingResultsError(f"no best subnet in {path}; run `dreams-nas search` first")
    spec = raw.get("spec") or {}
    heads, keep = integer(spec.get("heads")), num(spec.get("visual_keep"))
    layer, gamma = integer(spec.get("inject_layer")), integer(spec.get("draft_len"))
    pred = raw.get("predicted") or {}
    predicted_speedup = num(pred.get("speedup"))
    missing = [k for k in ("spec_id", "spec_dir") if not raw.get(k)]
    missing += [f"spec.{k}" for k, v in zip(SPEC_FIELDS, (heads, keep, layer, gamma),
                                            strict=True) if v is None]
    missing += ["predicted.speedup"] if predicted_speedup is None else []
    if missing:
        raise ReportError(f"{path} lacks {missing}; rerun `dreams-nas search`")
    meas = raw.get("measured") or {}
    ci = pred.get("tau_ci")
    spec_dir = str(raw["spec_dir"])
    best = BestSubnet(
        spec_id=str(raw["spec_id"]), heads=heads, visual_keep=keep, inject_layer=layer,
        draft_len=gamma, objective=str(raw.get("objective") or "speedup"),
        method=str(raw.get("method") or "?"), spec_dir=spec_dir,
        predicted_speedup=predicted_speedup, predicted_tau=num(pred.get("tau")),
        tau_ci=_interval(ci),
        draft_ms=num(pred.get("draft_ms")), verify_ms=num(pred.get("verify_ms")),
        decode_ms=num(pred.get("decode_ms")),
        measured_speedup=num(meas.get("speedup")), measured_tau=num(meas.get("tau")),
        tokens_per_s=num(meas.get("tokens_per_s")),
        baseline_tokens_per_s=num(meas.get("baseline_tokens_per_s")),
        created=raw.get("created"),
        measured_speedup_end_to_end=num(meas.get("speedup_end_to_end")),
        exported=(run_dir / spec_dir / layout.SPEC_JSON).is_file(),
    )
    verified = []
    for item in raw.get("verified") or []:
        p, m = num(item.get("predicted_speedup")), num(item.get("measured_speedup"))
        if item.get("spec_id") and p is not None and m is not None:
            verified.append(Verified(str(item["spec_id"]), p, m, num(item.get("measured_tau"))))
    return best, tuple(verified), raw


def load_history(run_dir: Path, hardware_id: str) -> tuple[HistoryPoint, ...]:
    """history.csv (Optuna searches only; () without one)."""
    path = layout.history_csv(run_dir, hardware_id)
    if not path.is_file():
        return ()
    points = []
    for row in read_csv(path):
        number = integer(row.get("number"))
        if number is not None:
            points.append(HistoryPoint(number, num(row.get("value")), num(row.get("best_so_far"))))
    return tuple(sorted(points, key=lambda p: p.number))


def cross_hardware(run_dir: Path, hardware_ids: Sequence[str]) -> CrossHardware | None:
    """Each searched hardware's best subnet, looked up in every hardware's trials."""
    if len(hardware_ids) < 2:
        return None
    tables: dict[str, dict[str, float]] = {}
    bests: dict[str, str] = {}
    for hw in hardware_ids:
        subnets = load_subnets(run_dir, hw)
        tables[hw] = {s.spec_id: s.speedup for s in subnets}
        # best.json is the search's last write: until it is there, the fastest subnet stands in.
        raw = read_json_object(layout.best_json(run_dir, hw)) or {}
        bests[hw] = str(raw.get("spec_id") or max(subnets, key=lambda s: s.speedup).spec_id)
    matrix = tuple(tuple(tables[col].get(bests[row]) for col in hardware_ids)
                   for row in hardware_ids)
    return CrossHardware(tuple(hardware_ids), tuple(bests[h] for h in hardware_ids), matrix)


def _interval(value: Any) -> tuple[float, float] | None:
    """A [low, high] pair of numbers, else None (null ends: an interval nobody could compute)."""
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2:
        return None
    low, high = num(value[0]), num(value[1])
    return None if low is None or high is None else (low, high)
