"""What the other stages measured, as report values: per-position acceptance
(acceptance/<dataset-id>.csv), the latency predictor's held-out quality
(latency/<hardware-id>/predictor.json) and the AIFD entropy curve (run.json `aifd`).

Each is optional: a run without it gets None (or no curves) and the report leaves its figure out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dreams_nas.reports.reading import integer, json_object, num, read_csv
from dreams_nas.reports.values import (
    AcceptanceCurve,
    AifdInfo,
    HoldoutPoint,
    KindAccuracy,
    PredictorInfo,
    TrainingCurve,
)
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.runfolder import RunFolder


def load_acceptance(run: RunFolder, spec_ids: Sequence[str], supernet_hash: str | None,
                    trials_tau: Mapping[str, float], dtype: str | None = None
                    ) -> tuple[str | None, tuple[AcceptanceCurve, ...]]:
    """Per-position acceptance curves of `spec_ids` from the acceptance CSV that covers them best.
    Rows of another dtype than the search's (`dtype`, when known) are not its.

    Among several datasets, the one whose τ matches the search's τ for the most front subnets
    wins (the search scored on it), then the one covering most of them.
    """
    if not spec_ids:
        return None, ()
    wanted = set(spec_ids)
    best_key, best_choice = None, (None, ())
    for dataset_id in run.dataset_ids():
        try:
            path = run.acceptance_csv(dataset_id)
        except InputError:  # a name no `dreams-nas score` writes (RunFolder refuses it)
            continue
        curves: dict[str, AcceptanceCurve] = {}
        for row in read_csv(path):
            sid = (row.get("spec_id") or "").strip()
            if sid not in wanted:
                continue
            if supernet_hash and row.get("supernet_hash") != supernet_hash:
                continue
            if dtype and row.get("dtype") not in (None, dtype):
                continue
            draft_len = integer(row.get("draft_len")) or 0
            rates = [num(row.get(f"accept_rate_{i}")) for i in range(1, draft_len + 1)]
            rates = [r for r in rates if r is not None]
            if rates:
                curves[sid] = AcceptanceCurve(sid, tuple(rates), num(row.get("tau")))
        matched = sum(1 for sid, c in curves.items()
                      if c.tau is not None and sid in trials_tau
                      and abs(c.tau - trials_tau[sid]) <= 1e-6 * max(1.0, abs(c.tau)))
        key = (matched, len(curves))
        if curves and (best_key is None or key > best_key):
            best_key = key
            best_choice = (dataset_id, tuple(curves[s] for s in spec_ids if s in curves))
    return best_choice


def load_predictor(run: RunFolder, hardware_id: str) -> PredictorInfo | None:
    raw = json_object(run.predictor_json(hardware_id))
    if raw is None:
        return None
    metrics = raw.get("metrics") or {}
    points = []
    for item in raw.get("holdout") or []:
        m, p = num(item.get("measured_ms")), num(item.get("predicted_ms"))
        if m is not None and p is not None:
            points.append(HoldoutPoint(holdout_kind(item), item.get("spec_id"), m, p))
    by_kind = raw.get("metrics_by_kind")
    kinds = [KindAccuracy(str(kind), integer(m.get("n")), num(m.get("mape")),
                          num(m.get("within_10pct")), num(m.get("kendall_tau")))
             for kind, m in (by_kind.items() if isinstance(by_kind, Mapping) else ())
             if isinstance(m, Mapping)]
    return PredictorInfo(
        regressor=str(raw.get("regressor") or "?"),
        mape=num(metrics.get("mape")), rmse=num(metrics.get("rmse")),
        within_10pct=num(metrics.get("within_10pct")),
        kendall_tau=num(metrics.get("kendall_tau")),
        n_train=integer(raw.get("n_train")), n_holdout=integer(raw.get("n_holdout")),
        holdout=tuple(points), by_kind=tuple(kinds), transfer=transfer_text(raw.get("transfer")),
    )


def transfer_text(raw: Any) -> str | None:
    """predictor.json's `transfer` block in words (None for a predictor of its own profile)."""
    if not isinstance(raw, Mapping):
        return None
    ids = ", ".join(str(s.get("hardware_id")) for s in raw.get("sources") or ()
                    if isinstance(s, Mapping))
    measured = integer(raw.get("measured"))
    return f"transferred from {ids or '?'}, {measured if measured is not None else '?'} " \
           "steps measured here"


def holdout_kind(item: Mapping[str, Any]) -> str:
    """A held-out row's label as `metrics_by_kind` counts it: its kind, ``draft_tree`` for a
    draft step over a tree level (k > 1), so the plot's colours match the accuracy lines."""
    kind = str(item.get("kind") or "?")
    k = integer(item.get("k"))
    return "draft_tree" if kind == "draft" and k is not None and k > 1 else kind


def load_aifd(run: Mapping[str, Any]) -> AifdInfo | None:
    """run.json's `aifd` block; None without one, or when its lists do not line up."""
    raw = run.get("aifd")
    if not isinstance(raw, Mapping):
        return None
    layers = [integer(v) for v in raw.get("layers") or []]
    ae = [num(v) for v in raw.get("ae") or []]
    delta = [num(v) for v in raw.get("delta_ae") or []]
    chosen = [integer(v) for v in raw.get("chosen") or []]
    if not ae or len(layers) != len(ae) or len(delta) != len(ae):
        return None
    if any(v is None for v in (*layers, *ae, *delta, *chosen)):
        return None
    return AifdInfo(tuple(layers), tuple(ae), tuple(delta), tuple(chosen),
                    str(raw.get("rule") or ""))


def load_training(run: Mapping[str, Any]) -> TrainingCurve | None:
    """run.json's supernet training curve and held-out evaluations; None without a curve."""
    supernet = run.get("supernet")
    train = supernet.get("train") if isinstance(supernet, Mapping) else None
    if not isinstance(train, Mapping):
        return None
    rows = [r for r in train.get("loss_curve") or [] if isinstance(r, Mapping)]
    points = [(integer(r.get("step")), num(r.get("loss"))) for r in rows]
    points = [(s, v) for s, v in points if s is not None and v is not None]
    if not points:
        return None
    conv = train.get("convergence") if isinstance(train.get("convergence"), Mapping) else {}
    evals = [e for e in conv.get("evals") or [] if isinstance(e, Mapping)
             and integer(e.get("step")) is not None and num(e.get("tau_full")) is not None]
    best_step = integer(conv.get("best_step"))
    best = next((e for e in evals if integer(e["step"]) == best_step), {})
    return TrainingCurve(
        steps=tuple(s for s, _ in points), loss=tuple(v for _, v in points),
        eval_steps=tuple(integer(e["step"]) for e in evals),  # type: ignore[misc]
        tau_full=tuple(num(e["tau_full"]) for e in evals),  # type: ignore[misc]
        tau_smallest=tuple(num(e.get("tau_smallest")) for e in evals),
        warmup_steps=integer(train.get("warmup_steps")),
        best_step=best_step, best_score=num(best.get("score")),
        stopped=str(conv["stopped"]) if conv.get("stopped") else None,
        draft_len=integer(conv.get("draft_len")))
