"""The latency predictor's regressor: profile rows (kind, spec fields, context length, k) ->
milliseconds, one model per kind of step.

* ``draft`` (a hot step, and a step over a token tree's level of k nodes) and ``draft_first``
  (the cycle's first step, right after a verify): each its own `CVSelectedRegressor` over
  `DraftFeatures`, linear in the context (`draft_regression`), cross-validated over grid-point
  groups (`validation.grid_groups`).
* ``decode``, ``verify``, ``verify_tree``, ``cycle`` and ``cycle_tree`` (the speculative
  cycle's own work outside the forwards, per k = draft_len + 1 or tree size): each a
  `TargetTable`, its own measurements interpolated per k, linear in the context beyond
  them, or a least-squares surface over (k, context) when that predicts left-out rows clearly
  better (a noisy machine) (`target_table`).

A kind the profile never timed is refused (`InputError`) rather than guessed from another, and
so is a draft step over a tree level wider than any timed.

It is a scikit-learn style estimator (`fit(rows, ms)`, `predict(rows)`, `get_params`, `clone`)
saved with skops, which loads only `SKOPS_TRUSTED_TYPES` beyond scikit-learn's and numpy's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from dreams_nas.latency.kinds import DRAFT_KINDS, KINDS
from dreams_nas.latency.model.draft_regression import CVSelectedRegressor, DraftFeatures
from dreams_nas.latency.model.target_table import TABLE, TargetTable
from dreams_nas.latency.model.validation import grid_groups
from dreams_nas.supernet.core.errors import InputError
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted

# What a saved predictor (skops) holds beyond skops's default-trusted types (scikit-learn's
# estimators, numpy): our classes. Loading trusts these names and nothing else, so a file naming
# any other type is refused unread.
SKOPS_TRUSTED_TYPES = (
    "dreams_nas.latency.model.draft_regression.CVSelectedRegressor",
    "dreams_nas.latency.model.draft_regression.DraftFeatures",
    "dreams_nas.latency.model.draft_regression.RelativeRidge",
    "dreams_nas.latency.model.regressor.LatencyRegressor",
    "dreams_nas.latency.model.target_table.TargetTable",
)
INTERPOLATED = TABLE  # the name `regressors` gives a target kind's table (SURFACE: its surface)
_INPUT_COLUMNS = ("kind", "heads", "visual_keep", "context_len", "k")
_FIX = ("rerun `dreams-nas profile` with the run's search space (it times every kind the space "
        "needs)")


class LatencyRegressor(RegressorMixin, BaseEstimator):
    """Rows (a DataFrame with columns kind, heads, visual_keep, context_len, k and optionally
    depth, mlp, draft_vocab) -> milliseconds, one model per kind (module docstring).

    visual_tokens: visual tokens in one prompt of the target (a feature of the draft steps).
    candidates, cv, random_state: each draft kind's `CVSelectedRegressor`'s.
    """

    def __init__(self, visual_tokens: int = 0,
                 candidates: Sequence[tuple[str, Any]] | None = None, cv: int = 5,
                 random_state: int = 0) -> None:
        self.visual_tokens = visual_tokens
        self.candidates = candidates
        self.cv = cv
        self.random_state = random_state

    def fit(self, X: Any, y: Any) -> LatencyRegressor:
        frame = _check_rows(X)
        y = np.asarray(y, dtype=float).ravel()
        if y.shape != (len(frame),):
            raise ValueError(f"y has {y.shape[0]} values for {len(frame)} rows")
        if not (y > 0).all():
            raise ValueError("latency rows need positive milliseconds")
        kinds = frame["kind"].astype(str).to_numpy()
        drafted = np.isin(kinds, DRAFT_KINDS)
        self.draft_features_ = DraftFeatures(self.visual_tokens).fit(frame[drafted])
        self.draft_models_: dict[str, CVSelectedRegressor] = {}
        self.draft_widths_: dict[str, int] = {}  # kind -> widest step (k) timed
        self.target_models_: dict[str, TargetTable] = {}
        for kind in KINDS:
            rows = kinds == kind
            if not rows.any():
                continue
            sub = frame[rows]
            if kind in DRAFT_KINDS:
                selector = CVSelectedRegressor(self.candidates, cv=self.cv,
                                               random_state=self.random_state,
                                               error="relative_rmse")
                selector.fit(self.draft_features_.transform(sub), y[rows],
                             groups=grid_groups(sub))
                self.draft_models_[kind] = selector
                self.draft_widths_[kind] = int(sub["k"].max())
            else:
                table = TargetTable(kind=kind)
                self.target_models_[kind] = table.fit(_target_columns(sub), y[rows])
        return self

    def predict(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "target_models_")
        frame = _check_rows(X)
        kinds = frame["kind"].astype(str).to_numpy()
        out = np.empty(len(frame), dtype=float)
        for kind in dict.fromkeys(kinds):
            rows = kinds == kind
            sub = frame[rows]
            if kind in DRAFT_KINDS:
                model, widest = self._draft_model(kind)
                wide = int(sub["k"].max())
                if wide > widest:
                    raise InputError(
                        f"a {kind} step over a tree level of {wide} nodes was not profiled "
                        f"(widest timed: {widest}) and is not extrapolated; {_FIX}")
                out[rows] = model.predict(self.draft_features_.transform(sub))
            else:
                table = self.target_models_.get(kind)
                if table is None:
                    raise InputError(f"no {kind} step was profiled, and it is not guessed from "
                                     f"another kind's; {_FIX}")
                out[rows] = table.predict(_target_columns(sub))
        return out

    # --- what was chosen ------------------------------------------------------------------
    def regressors(self) -> dict[str, str]:
        """{kind: the regressor that predicts it} for every kind it answers: a candidate's name
        for a draft kind, `INTERPOLATED` or ``surface`` for a target kind (`choice_`)."""
        check_is_fitted(self, "target_models_")
        out = {kind: m.best_name_ for kind, m in self.draft_models_.items()}
        out.update({kind: getattr(m, "choice_", TABLE) for kind, m in self.target_models_.items()})
        return {kind: out[kind] for kind in KINDS if kind in out}

    def cv_scores(self) -> dict[str, dict[str, float]]:
        """{draft kind: {candidate: its grouped K-fold CV error (root mean squared relative
        error)}}, and {target kind: {interpolated, surface: mean relative error of each row left
        out}}; empty for a kind too small to score."""
        check_is_fitted(self, "target_models_")
        out = {kind: dict(m.cv_scores_) for kind, m in self.draft_models_.items()}
        out.update({kind: dict(getattr(m, "loo_", {}))
                    for kind, m in self.target_models_.items()})
        return out

    def _draft_model(self, kind: str) -> tuple[CVSelectedRegressor, int]:
        model = self.draft_models_.get(kind)
        if model is None:
            raise InputError(f"no {kind} step was profiled, and it is not guessed from another "
                             f"kind's; {_FIX}")
        return model, self.draft_widths_[kind]


def make_regressor(visual_tokens: int = 0, candidates: Sequence[tuple[str, Any]] | None = None,
                       cv: int = 5, random_state: int = 0) -> LatencyRegressor:
    """The unfitted latency model (rows in, milliseconds out)."""
    return LatencyRegressor(visual_tokens=visual_tokens, candidates=candidates, cv=cv,
                            random_state=random_state)


def _check_rows(X: Any) -> pd.DataFrame:
    if not isinstance(X, pd.DataFrame):
        raise TypeError(f"the latency model takes a DataFrame with columns "
                        f"{list(_INPUT_COLUMNS)}, got {type(X).__name__}")
    missing = [c for c in _INPUT_COLUMNS if c not in X.columns]
    if missing:
        raise ValueError(f"rows lack column(s) {missing}; they need {list(_INPUT_COLUMNS)}")
    bad = sorted(set(X["kind"].astype(str)) - set(KINDS))
    if bad:
        raise ValueError(f"unknown step kind(s) {bad}; kinds are {', '.join(KINDS)}")
    return X


def _target_columns(frame: pd.DataFrame) -> np.ndarray:
    return frame[["context_len", "k"]].to_numpy(dtype=float)  # (rows, 2)
