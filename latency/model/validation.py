"""How the latency predictor is validated: grid-point groups, the grouped hold-out split and
accuracy per kind of step.

A *grid point* is what one profile measurement point stands for: a draft architecture (heads,
visual_keep, depth, mlp, draft_vocab) at one context length, or one target step (kind, k) at
one context. One draft grid point is timed several times -- as ``draft``, as ``draft_first``
and, for the largest and smallest subnets, over each tree level's width -- and those rows share
most of their cost. Cross-validation folds and the hold-out split therefore move whole grid
points (`grid_groups`): a held-out ``draft_first`` row is never predicted by a model that saw
the same point's ``draft`` row.

Accuracy is reported per *metric kind* (`METRIC_KINDS`): the profile's kinds, with a draft step
over a tree level (kind ``draft``, k > 1) apart as ``draft_tree``. The few dozen target rows
that scale every speedup are then not averaged away by hundreds of draft rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from dreams_nas.latency.kinds import DRAFT_KINDS
from dreams_nas.latency.model.draft_regression import latency_metrics
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.spec import SIZE_DEFAULTS

METRIC_KINDS = ("draft", "draft_tree", "draft_first", "decode", "verify", "verify_tree",
                "cycle", "cycle_tree")


def metric_kinds(frame: pd.DataFrame) -> np.ndarray:
    """(rows,) the metric kind of each row: its kind, ``draft_tree`` for a draft step over a
    tree level (k > 1)."""
    kinds = frame["kind"].astype(str).to_numpy()
    level = (kinds == "draft") & (frame["k"].astype(int).to_numpy() > 1)
    return np.where(level, "draft_tree", kinds).astype(object)


def grid_groups(frame: pd.DataFrame) -> np.ndarray:
    """(rows,) the grid point of each row, as text: ``arch h4 v0.5 d1 m1 n1 @ 640`` for the
    draft kinds (every draft kind and tree width of one architecture at one context), ``verify k5 @
    640`` for a target step."""
    kinds = frame["kind"].astype(str).to_numpy()
    ctx = frame["context_len"].astype(int).to_numpy()
    k = frame["k"].astype(int).to_numpy()
    drafted = np.isin(kinds, DRAFT_KINDS)

    def column(name: str) -> np.ndarray:
        if name in frame.columns:
            return pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float)
        return np.full(len(frame), float(SIZE_DEFAULTS.get(name, np.nan)))

    heads, keep = column("heads"), column("visual_keep")
    depth, mlp, vocab = column("depth"), column("mlp"), column("draft_vocab")
    return np.array([
        f"arch h{h:g} v{v:g} d{d:g} m{m:g} n{n:g} @ {c}" if is_draft else f"{kind} k{kk} @ {c}"
        for is_draft, kind, h, v, d, m, n, kk, c in zip(drafted, kinds, heads, keep, depth, mlp,
                                                        vocab, k, ctx, strict=True)
    ], dtype=object)


def holdout_split(frame: pd.DataFrame, fraction: float, seed: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks (train, holdout): `fraction` of the grid points held out at random, whole
    (`grid_groups`), within strata that each keep at least two points for training -- the draft
    points with a tree level's rows, the other draft points, and each target kind's points of one
    k (so every k keeps measurements to interpolate from, and a held-out target row is
    predicted from that k's other contexts)."""
    if not 0.0 <= fraction < 1.0:
        raise InputError(f"holdout fraction {fraction} must be in [0, 1)")
    rng = np.random.default_rng(seed)
    groups = grid_groups(frame)
    kinds = frame["kind"].astype(str).to_numpy()
    k = frame["k"].astype(int).to_numpy()
    drafted = np.isin(kinds, DRAFT_KINDS)
    levels = set(groups[drafted & (k > 1)])
    strata: dict[str, set[str]] = {}
    for g, kind, kk, is_draft in zip(groups, kinds, k, drafted, strict=True):
        if is_draft:
            name = "draft levels" if g in levels else "draft"
        else:
            name = f"{kind} k{kk}"
        strata.setdefault(name, set()).add(g)
    held: set[str] = set()
    for name in sorted(strata):
        points = sorted(strata[name])
        n = int(round(fraction * len(points)))
        if len(points) - n < 2:
            n = max(0, len(points) - 2)
        if n:
            held.update(rng.choice(points, size=n, replace=False).tolist())
    hold = np.isin(groups, sorted(held)) if held else np.zeros(len(frame), dtype=bool)
    return ~hold, hold


def metrics_by_kind(frame: pd.DataFrame, measured_ms: Any, predicted_ms: Any
                    ) -> dict[str, dict[str, float]]:
    """{metric kind: `latency_metrics` of its rows plus ``n`` (rows)}, for the kinds `frame`
    holds, in `METRIC_KINDS` order."""
    labels = metric_kinds(frame)
    measured = np.asarray(measured_ms, dtype=float)
    predicted = np.asarray(predicted_ms, dtype=float)
    out: dict[str, dict[str, float]] = {}
    for kind in METRIC_KINDS:
        rows = labels == kind
        if rows.any():
            out[kind] = {**latency_metrics(measured[rows], predicted[rows]),
                         "n": int(rows.sum())}
    return out
