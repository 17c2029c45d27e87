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
saved with skops, which loads only `SKOPS_TRUSTED_TYPES` beyond scikit-learn's and numpy's; a
loaded model is then checked by type (`model_problem`): only the classes `make_regressor` builds
and fitting fills in (`PERSISTED_PARTS`) pass, so a valid scikit-learn estimator in their place
(a `DummyRegressor`) is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from dreams_nas.latency.kinds import DRAFT_KINDS, KINDS
from dreams_nas.latency.model.draft_regression import (
    CVSelectedRegressor,
    DraftFeatures,
    RelativeRidge,
)
from dreams_nas.latency.model.target_table import TABLE, TargetTable
from dreams_nas.latency.model.validation import grid_groups
from dreams_nas.supernet.core.errors import InputError
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import RidgeCV
from sklearn.preprocessing import StandardScaler
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
# Every estimator class a fitted `LatencyRegressor` holds, exactly (no subclass), each with the
# fitted attributes that hold its parts and the class each part is (a dict attribute: each of
# its values). What `make_regressor` builds and `fit` fills in; a saved model holding any other
# object is refused (`model_problem`).
PERSISTED_PARTS: dict[type, dict[str, type]] = {
    # LatencyRegressor is added below its class
    CVSelectedRegressor: {"best_estimator_": RelativeRidge},
    RelativeRidge: {"scaler_": StandardScaler, "ridge_": RidgeCV},
    DraftFeatures: {}, TargetTable: {}, StandardScaler: {}, RidgeCV: {},
}
# What else a fitted model holds: numbers, text, numpy arrays of them, and containers.
_VALUES = (type(None), bool, int, float, str)
_NUMPY_VALUES = (np.bool_, np.number, np.str_)
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


PERSISTED_PARTS[LatencyRegressor] = {"draft_features_": DraftFeatures,
                                     "draft_models_": CVSelectedRegressor,
                                     "target_models_": TargetTable}


def model_problem(model: Any) -> str | None:
    """Why `model` is not a fitted `LatencyRegressor` as `make_regressor` builds it (None: it
    is): the root, every part that fitting filled in (`PERSISTED_PARTS`, each fitted) and every
    estimator anywhere in it (the candidates' too) must be of exactly those classes, and
    everything else numbers, text, numpy arrays of them, lists, tuples or dicts."""
    if type(model) is not LatencyRegressor:
        return f"a {_type_name(model)}, not a {LatencyRegressor.__name__}"
    stack: list[tuple[str, Any, bool]] = [("the model", model, True)]  # where, what, fitted?
    seen: set[int] = set()
    while stack:
        where, value, fitted = stack.pop()
        if type(value) in _VALUES or isinstance(value, _NUMPY_VALUES) or id(value) in seen:
            continue
        seen.add(id(value))
        kind = type(value)
        if kind is np.ndarray:
            if value.dtype.kind not in "biufU" and value.dtype != object:
                return f"{where}: an array of {value.dtype}"
            if value.dtype == object:
                stack += [(f"{where}[]", v, False) for v in value.ravel()]
        elif kind in (list, tuple):
            stack += [(f"{where}[{i}]", v, False) for i, v in enumerate(value)]
        elif kind is dict:
            stack += [(f"{where}[{k!r}]", v, fitted) for k, v in value.items()]
            stack += [(f"{where} key", k, False) for k in value]
        elif kind in PERSISTED_PARTS:
            problem = _parts_problem(where, value, fitted)
            if problem:
                return problem
            stack += [(f"{where}.{k}", v, k in PERSISTED_PARTS[kind]) for k, v in
                      vars(value).items()]
        else:
            return f"{where}: a {_type_name(value)}, which make_regressor never builds"
    return None


def _parts_problem(where: str, estimator: Any, fitted: bool) -> str | None:
    """A fitted part (`fitted`) unfitted, or a part of another class than `PERSISTED_PARTS`
    names (a dict attribute: any of its values)."""
    if fitted:
        try:
            check_is_fitted(estimator)
        except NotFittedError:
            return f"{where}: an unfitted {type(estimator).__name__}"
    for name, part in PERSISTED_PARTS[type(estimator)].items():
        if name not in vars(estimator):
            if fitted:
                return f"{where} has no {name}"
            continue
        held = vars(estimator)[name]
        for value in held.values() if isinstance(held, dict) else (held,):
            if type(value) is not part:
                return f"{where}.{name}: a {_type_name(value)}, not a {part.__name__}"
    return None


def _type_name(value: Any) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


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
