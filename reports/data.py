"""Compute the report: everything the figures and the page show, read from a run folder.

`reports/` imports none of the other dreams-nas packages: it reads the files they write, at the
paths of the documented run-folder layout (README "The run folder", SCHEMAS.md), and tolerates
extra keys/columns and missing optional parts (no Optuna history, one hardware id, no predictor
metrics, no AIFD curves...). `build_report_data` returns one frozen `ReportData`; the renderers
only draw it, and the tests assert on it.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dreams_nas.reports.values import (
    AcceptanceCurve,
    AifdInfo,
    BestSubnet,
    CrossHardware,
    HistoryPoint,
    HoldoutPoint,
    MissingResultsError,
    PredictorInfo,
    ReportData,
    ReportError,
    Subnet,
    Verified,
)

# The documented run-folder layout (re-derived here on purpose: reports imports no other package).
RUN_JSON = "run.json"
SEARCH_DIR = "search"
LATENCY_DIR = "latency"
ACCEPTANCE_DIR = "acceptance"
SPECS_DIR = "specs"
REPORT_HTML = "report.html"

__all__ = [
    "AcceptanceCurve", "AifdInfo", "BestSubnet", "CrossHardware", "HistoryPoint", "HoldoutPoint",
    "MissingResultsError", "PredictorInfo", "ReportData", "ReportError", "Subnet", "Verified",
    "build_report_data", "pareto_mask", "searched_hardware_ids",
]


# --- reading files ------------------------------------------------------------------------
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ReportError(
            f"{path} is not valid JSON (line {exc.lineno}: {exc.msg}); rerun the command that "
            "wrote it"
        ) from None


def _read_json_if(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    data = _read_json(path)
    if not isinstance(data, dict):
        raise ReportError(f"{path} must hold a JSON object; rerun the command that wrote it")
    return data


def _read_csv(path: Path) -> list[dict[str, str]]:
    """Rows of a CSV file; a torn last line (a kill mid-append) is skipped."""
    text = path.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    return [dict(row) for row in csv.DictReader(text.splitlines())]


def _num(value: Any) -> float | None:
    """A float, or None for empty / missing / non-numeric / NaN cells."""
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def _int(value: Any) -> int | None:
    out = _num(value)
    return None if out is None or math.isinf(out) else int(round(out))


def _flag(value: Any, default: bool = True) -> bool:
    if value is None or str(value).strip() == "":
        return default
    return str(value).strip().lower() in {"1", "true", "yes", "1.0"}


def _spec_id(heads: int, visual_keep: float, inject_layer: int, draft_len: int) -> str:
    # The documented SubnetSpec.id format, e.g. "h4-v0.50-l12-g5".
    return f"h{heads}-v{visual_keep:.2f}-l{inject_layer}-g{draft_len}"


def _subnet_from_row(row: Mapping[str, str], path: Path, on_front: bool) -> Subnet | None:
    """A trials.csv row as a Subnet; None for rows without a usable speedup (failed, pruned)."""
    state = (row.get("state") or "complete").strip().lower()
    speedup, draft_ms, tau = _num(row.get("speedup")), _num(row.get("draft_ms")), _num(row.get("tau"))
    if state != "complete" or speedup is None or draft_ms is None or tau is None:
        return None
    fields = {n: _num(row.get(n)) for n in ("heads", "visual_keep", "inject_layer", "draft_len")}
    missing = [n for n, v in fields.items() if v is None]
    if missing:
        raise ReportError(
            f"{path} has a row without {missing} (spec_id={row.get('spec_id')!r}); trials need "
            "the spec fields heads, visual_keep, inject_layer, draft_len: rerun `dreams-nas search`"
        )
    heads, keep = int(fields["heads"]), float(fields["visual_keep"])
    layer, gamma = int(fields["inject_layer"]), int(fields["draft_len"])
    return Subnet(
        spec_id=(row.get("spec_id") or "").strip() or _spec_id(heads, keep, layer, gamma),
        heads=heads, visual_keep=keep, inject_layer=layer, draft_len=gamma,
        tau=tau, tau_lo=_num(row.get("tau_lo")), tau_hi=_num(row.get("tau_hi")),
        draft_ms=draft_ms, verify_ms=_num(row.get("verify_ms")), decode_ms=_num(row.get("decode_ms")),
        speedup=speedup, draft_params=_int(row.get("draft_params")),
        feasible=_flag(row.get("feasible")), on_front=on_front, number=_int(row.get("number")),
    )


def pareto_mask(maximise: Sequence[float], minimise: Sequence[float]) -> list[bool]:
    """True where no other point is at least as good in both and strictly better in one.

    Two objectives, so a sort and one sweep do it in O(n log n) (Optuna-sized studies have
    thousands of trials). Duplicated points are all kept. Used for the figures' frontier lines
    and, when a run lacks pareto.csv, for the front itself (max speedup, min draft ms).
    """
    if len(maximise) != len(minimise):
        raise ValueError(f"pareto_mask needs equal lengths, got {len(maximise)} and {len(minimise)}")
    order = sorted(range(len(maximise)), key=lambda i: (minimise[i], -maximise[i]))
    out = [False] * len(order)
    best_before = -math.inf  # best `maximise` among points with a strictly smaller `minimise`
    k = 0
    while k < len(order):
        group = [order[k]]
        while k + len(group) < len(order) and minimise[order[k + len(group)]] == minimise[order[k]]:
            group.append(order[k + len(group)])
        top = maximise[group[0]]
        if top > best_before:
            for i in group:
                out[i] = maximise[i] == top
        best_before = max(best_before, top)
        k += len(group)
    return out


def _load_trials(search_dir: Path) -> tuple[list[Subnet], str]:
    trials_path = search_dir / "trials.csv"
    if not trials_path.is_file():
        raise MissingResultsError(
            f"no search results in {trials_path}; run `dreams-nas search` first"
        )
    rows = _read_csv(trials_path)
    pareto_path = search_dir / "pareto.csv"
    front_ids: set[str] | None = None
    if pareto_path.is_file():
        front_ids = {(r.get("spec_id") or "").strip() for r in _read_csv(pareto_path)}
    # One row per subnet: a resumed search may have appended a subnet twice; keep the last.
    by_id: dict[str, Subnet] = {}
    for row in rows:
        sub = _subnet_from_row(row, trials_path, on_front=False)
        if sub is not None:
            by_id.pop(sub.spec_id, None)
            by_id[sub.spec_id] = sub
    subnets = list(by_id.values())
    if not subnets:
        raise MissingResultsError(
            f"{trials_path} holds no completed trial; run `dreams-nas search` (again) first"
        )
    if front_ids is not None:
        source = "pareto.csv"
        subnets = [_replace_front(s, s.spec_id in front_ids) for s in subnets]
    else:
        source = "computed (max speedup, min draft ms; pareto.csv missing)"
        feasible = [s for s in subnets if s.feasible] or subnets
        mask = pareto_mask([s.speedup for s in feasible], [s.draft_ms for s in feasible])
        ids = {s.spec_id for s, m in zip(feasible, mask, strict=True) if m}
        subnets = [_replace_front(s, s.spec_id in ids) for s in subnets]
    return subnets, source


def _replace_front(sub: Subnet, on_front: bool) -> Subnet:
    return replace(sub, on_front=on_front)


def _load_best(search_dir: Path, run_dir: Path, subnets: Sequence[Subnet]) -> tuple[
        BestSubnet, tuple[Verified, ...], dict[str, Any]]:
    path = search_dir / "best.json"
    raw = _read_json_if(path)
    if raw is None:
        raise MissingResultsError(f"no best subnet in {path}; run `dreams-nas search` first")
    spec = raw.get("spec") or {}
    spec_id = str(raw.get("spec_id") or "")
    row = next((s for s in subnets if s.spec_id == spec_id), None)

    def field_of(name: str) -> Any:
        value = spec.get(name)
        return value if value is not None else (getattr(row, name) if row else None)

    heads, keep = _int(field_of("heads")), _num(field_of("visual_keep"))
    layer, gamma = _int(field_of("inject_layer")), _int(field_of("draft_len"))
    if None in (heads, keep, layer, gamma):
        raise ReportError(
            f"{path} has no complete 'spec' (heads, visual_keep, inject_layer, draft_len) and its "
            f"spec_id {spec_id!r} is not in trials.csv; rerun `dreams-nas search`"
        )
    spec_id = spec_id or _spec_id(heads, keep, layer, gamma)
    pred = raw.get("predicted") or {}
    meas = raw.get("measured") or None
    ci = pred.get("tau_ci")
    tau_ci = (float(ci[0]), float(ci[1])) if isinstance(ci, Sequence) and len(ci) == 2 else None
    if tau_ci is None and row is not None and row.tau_lo is not None and row.tau_hi is not None:
        tau_ci = (row.tau_lo, row.tau_hi)
    predicted_speedup = _num(pred.get("speedup"))
    if predicted_speedup is None:
        if row is None:
            raise ReportError(f"{path} has no predicted speedup; rerun `dreams-nas search`")
        predicted_speedup = row.speedup
    spec_dir = str(raw.get("spec_dir") or f"{SPECS_DIR}/{spec_id}")

    def predicted_or_row(name: str) -> float | None:
        # best.json's prediction; the trials row when an older writer left the field out.
        value = _num(pred.get(name))
        return value if value is not None or row is None else getattr(row, name)

    best = BestSubnet(
        spec_id=spec_id, heads=heads, visual_keep=keep, inject_layer=layer, draft_len=gamma,
        objective=str(raw.get("objective") or "speedup"), method=str(raw.get("method") or "?"),
        spec_dir=spec_dir, predicted_speedup=predicted_speedup,
        predicted_tau=predicted_or_row("tau"), tau_ci=tau_ci,
        draft_ms=predicted_or_row("draft_ms"), verify_ms=predicted_or_row("verify_ms"),
        decode_ms=predicted_or_row("decode_ms"),
        measured_speedup=_num(meas.get("speedup")) if meas else None,
        measured_tau=_num(meas.get("tau")) if meas else None,
        tokens_per_s=_num(meas.get("tokens_per_s")) if meas else None,
        baseline_tokens_per_s=_num(meas.get("baseline_tokens_per_s")) if meas else None,
        created=raw.get("created"),
        measured_speedup_end_to_end=_num(meas.get("speedup_end_to_end")) if meas else None,
        exported=(run_dir / spec_dir / "spec.json").is_file(),
    )
    verified = []
    for item in raw.get("verified") or []:
        p, m = _num(item.get("predicted_speedup")), _num(item.get("measured_speedup"))
        if item.get("spec_id") and p is not None and m is not None:
            verified.append(Verified(str(item["spec_id"]), p, m, _num(item.get("measured_tau"))))
    if not verified and best.measured_speedup is not None:
        verified.append(Verified(best.spec_id, best.predicted_speedup, best.measured_speedup,
                                 best.measured_tau))
    return best, tuple(verified), raw


def _load_acceptance(run_dir: Path, spec_ids: Sequence[str], supernet_hash: str | None,
                     trials_tau: Mapping[str, float]) -> tuple[str | None, tuple[AcceptanceCurve, ...]]:
    """Per-position acceptance curves of `spec_ids` from the acceptance CSV that covers them best.

    Among several datasets, the one whose τ matches the search's τ for the most front subnets
    wins (the search scored on it), then the one covering most of them.
    """
    base = run_dir / ACCEPTANCE_DIR
    if not base.is_dir() or not spec_ids:
        return None, ()
    wanted = set(spec_ids)
    best_key, best_choice = None, (None, ())
    for path in sorted(base.glob("*.csv")):
        curves: dict[str, AcceptanceCurve] = {}
        for row in _read_csv(path):
            sid = (row.get("spec_id") or "").strip()
            if sid not in wanted:
                continue
            if supernet_hash and row.get("supernet_hash") and row["supernet_hash"] != supernet_hash:
                continue
            gamma = _int(row.get("draft_len")) or 7
            rates = [_num(row.get(f"accept_rate_{i}")) for i in range(1, gamma + 1)]
            rates = [r for r in rates if r is not None]
            if rates:
                curves[sid] = AcceptanceCurve(sid, tuple(rates), _num(row.get("tau")))
        matched = sum(1 for sid, c in curves.items()
                      if c.tau is not None and sid in trials_tau
                      and abs(c.tau - trials_tau[sid]) <= 1e-6 * max(1.0, abs(c.tau)))
        key = (matched, len(curves))
        if curves and (best_key is None or key > best_key):
            best_key = key
            best_choice = (path.stem, tuple(curves[s] for s in spec_ids if s in curves))
    return best_choice


def _load_predictor(path: Path) -> PredictorInfo | None:
    raw = _read_json_if(path)
    if raw is None:
        return None
    metrics = raw.get("metrics") or {}
    points = []
    for item in raw.get("holdout") or []:
        m, p = _num(item.get("measured_ms")), _num(item.get("predicted_ms"))
        if m is not None and p is not None:
            points.append(HoldoutPoint(str(item.get("kind") or "?"), item.get("spec_id"), m, p))
    return PredictorInfo(
        regressor=str(raw.get("regressor") or "?"),
        mape=_num(metrics.get("mape")), rmse=_num(metrics.get("rmse")),
        within_10pct=_num(metrics.get("within_10pct")), kendall_tau=_num(metrics.get("kendall_tau")),
        n_train=_int(raw.get("n_train")), n_holdout=_int(raw.get("n_holdout")) or (len(points) or None),
        holdout=tuple(points),
    )


def _load_aifd(run: Mapping[str, Any]) -> AifdInfo | None:
    raw = run.get("aifd")
    if not isinstance(raw, Mapping):
        return None
    ae = [_num(v) for v in raw.get("ae") or []]
    if not ae or any(v is None for v in ae):
        return None
    layers = [int(v) for v in raw.get("layers") or range(1, len(ae) + 1)]
    delta = [_num(v) for v in raw.get("delta_ae") or []]
    if len(delta) != len(ae) or any(v is None for v in delta):
        delta = [0.0] + [b - a for a, b in zip(ae, ae[1:], strict=False)]
    if len(layers) != len(ae):
        layers = list(range(1, len(ae) + 1))
    chosen = raw.get("chosen")
    chosen = [chosen] if isinstance(chosen, int | float) else list(chosen or [])
    return AifdInfo(tuple(layers), tuple(ae), tuple(delta), tuple(int(c) for c in chosen),
                    str(raw.get("rule") or ""))


def _load_history(path: Path) -> tuple[HistoryPoint, ...]:
    if not path.is_file():
        return ()
    points = []
    for row in _read_csv(path):
        number = _int(row.get("number"))
        if number is not None:
            points.append(HistoryPoint(number, _num(row.get("value")), _num(row.get("best_so_far"))))
    return tuple(sorted(points, key=lambda p: p.number))


def searched_hardware_ids(run_dir: str | Path) -> list[str]:
    """Hardware ids with search results (search/<id>/trials.csv) in this run."""
    base = Path(run_dir) / SEARCH_DIR
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if (p / "trials.csv").is_file())


def _pick_hardware(run_dir: Path, hardware_ids: Sequence[str], requested: str | None) -> str:
    if requested is not None:
        if requested not in hardware_ids:
            have = ", ".join(hardware_ids) or "none"
            raise MissingResultsError(
                f"no search results for hardware id {requested!r} in {run_dir / SEARCH_DIR} "
                f"(searched: {have}); run `dreams-nas search --hardware {requested}` or pick one "
                "of those"
            )
        return requested
    if not hardware_ids:
        raise MissingResultsError(
            f"no search results in {run_dir / SEARCH_DIR}/<hardware-id>/trials.csv; run "
            "`dreams-nas search` first"
        )
    # Several searched machines: the most recent search is the one the user is looking at.
    def created(hw: str) -> str:
        raw = _read_json_if(run_dir / SEARCH_DIR / hw / "best.json") or {}
        return str(raw.get("created") or "")

    return max(hardware_ids, key=lambda hw: (created(hw), hw))


def _cross_hardware(run_dir: Path, hardware_ids: Sequence[str]) -> CrossHardware | None:
    if len(hardware_ids) < 2:
        return None
    tables: dict[str, dict[str, float]] = {}
    bests: dict[str, str] = {}
    for hw in hardware_ids:
        subnets, _ = _load_trials(run_dir / SEARCH_DIR / hw)
        tables[hw] = {s.spec_id: s.speedup for s in subnets}
        raw = _read_json_if(run_dir / SEARCH_DIR / hw / "best.json") or {}
        bests[hw] = str(raw.get("spec_id") or max(subnets, key=lambda s: s.speedup).spec_id)
    matrix = tuple(tuple(tables[col].get(bests[row]) for col in hardware_ids) for row in hardware_ids)
    return CrossHardware(tuple(hardware_ids), tuple(bests[h] for h in hardware_ids), matrix)


def build_report_data(run_dir: str | Path, hardware_id: str | None = None) -> ReportData:
    """Read a run folder into a `ReportData` for `hardware_id` (default: the latest search)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise MissingResultsError(
            f"run folder {run_dir} does not exist; pass the folder of your run with --run DIR or "
            "run `dreams-nas demo` first"
        )
    hardware_ids = searched_hardware_ids(run_dir)
    hw = _pick_hardware(run_dir, hardware_ids, hardware_id)
    search_dir = run_dir / SEARCH_DIR / hw
    subnets, front_source = _load_trials(search_dir)
    best, verified, best_raw = _load_best(search_dir, run_dir, subnets)

    run = _read_json_if(run_dir / RUN_JSON) or {}
    supernet = run.get("supernet") or {}
    supernet_hash = best_raw.get("supernet_hash") or supernet.get("hash")
    hardware = (_read_json_if(run_dir / LATENCY_DIR / hw / "hardware.json")
                or best_raw.get("hardware") or {"hardware_id": hw})
    front = sorted((s for s in subnets if s.on_front), key=lambda s: (-s.speedup, s.draft_ms))
    dataset, curves = _load_acceptance(run_dir, [s.spec_id for s in front], supernet_hash,
                                       {s.spec_id: s.tau for s in subnets})
    specs_root = run_dir / SPECS_DIR
    exported = frozenset(
        p.name for p in specs_root.iterdir() if (p / "spec.json").is_file()
    ) if specs_root.is_dir() else frozenset()
    return ReportData(
        run_dir=run_dir,
        hardware_id=hw,
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        target=dict(run.get("target") or {}),
        supernet_hash=supernet_hash,
        supernet_params=_int(supernet.get("num_params")),
        hardware=dict(hardware),
        versions=dict(best_raw.get("versions") or run.get("versions") or {}),
        subnets=tuple(sorted(subnets, key=lambda s: (-s.speedup, s.spec_id))),
        best=best,
        verified=verified,
        acceptance_dataset=dataset,
        acceptance=curves,
        predictor=_load_predictor(run_dir / LATENCY_DIR / hw / "predictor.json"),
        aifd=_load_aifd(run),
        history=_load_history(search_dir / "history.csv"),
        cross_hardware=_cross_hardware(run_dir, hardware_ids),
        searched_hardware_ids=tuple(hardware_ids),
        exported_specs=exported,
        front_source=front_source,
    )
