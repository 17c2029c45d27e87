"""The latency predictor: (kind of step, spec fields, context length, k) -> milliseconds.

It is an ordinary scikit-learn pipeline so that it clones and cross-validates like any other
model, and is saved with skops (`SKOPS_TRUSTED_TYPES`), never pickled::

    Pipeline([
        ("features",  StepFeatures(visual_tokens=...)),          # rows -> numeric array
        ("regressor", TransformedTargetRegressor(                 # fit on log-latency
                          CVSelectedRegressor(candidates), func=np.log, inverse_func=np.exp)),
    ])

`CVSelectedRegressor` picks, by K-fold cross-validation on the training rows and the
one-standard-error rule, one of ridge regression on the step features or on their polynomial
expansions, gradient boosting and a random forest. Latency is fitted in
log space: errors then are relative (what MAPE and "within 10%" measure) and the step costs,
which span orders of magnitude, weigh equally.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from dreams_nas.latency.plan import DRAFT_KINDS, KINDS
from dreams_nas.supernet.core.space import SIZE_DEFAULTS
from sklearn.base import BaseEstimator, RegressorMixin, TransformerMixin, clone
from sklearn.compose import TransformedTargetRegressor
from sklearn.ensemble import GradientBoostingRegressor, RandomForestRegressor
from sklearn.linear_model import RidgeCV
from sklearn.model_selection import KFold, cross_val_score
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import PolynomialFeatures, StandardScaler
from sklearn.utils.validation import check_is_fitted, validate_data

FEATURE_NAMES = (
    "is_draft", "heads", "visual_keep", "attended", "heads_x_attended", "log_context",
    "context", "k", "k_x_context", "log_k", "is_first", "draft_width", "log_draft_width",
    "is_tree", "mlp", "blocks", "log_blocks", "blocks_x_heads", "blocks_x_mlp",
    "blocks_x_attended", "blocks_x_heads_x_attended",
)

_INPUT_COLUMNS = ("kind", "heads", "visual_keep", "context_len", "k")
# Optional input columns: rows without them (written before elastic depth and MLP width) are
# the paper's draft size, `SIZE_DEFAULTS`.
_SIZE_COLUMNS = tuple(SIZE_DEFAULTS)

# What a saved predictor (skops) holds beyond skops's default-trusted types (scikit-learn's
# estimators, numpy): our two classes, defined below, and the trees of the two ensembles. Loading
# trusts these names and nothing else, so a file naming any other type is refused unread.
SKOPS_TRUSTED_TYPES = (
    "dreams_nas.latency.estimators.CVSelectedRegressor",
    "dreams_nas.latency.estimators.StepFeatures",
    "sklearn.tree._tree.Tree",
)


class StepFeatures(TransformerMixin, BaseEstimator):
    """Rows of (kind, heads, visual_keep, depth, mlp, context_len, k) -> the numeric features
    of a step (rows without depth and mlp columns are depth 1, mlp 1: the paper's draft).

    A draft step's cost grows with its heads and with the keys its attention reads: the text
    and the *kept* visual tokens, ``attended = context_len - visual_tokens * (1 - visual_keep)``.
    It runs ``blocks = 2 * depth + 1`` blocks (depth decoder layers on each side of the
    cross-attention), each paying a fixed overhead, its heads' work over the attended keys and
    its MLP's share of channels: cost ~ fixed + blocks * (overhead + heads * attended + mlp).
    So the features carry ``blocks`` and its products with heads, mlp, attended and
    heads x attended (which let a linear model carry a per-block cost to an unprofiled depth),
    and ``log_blocks`` (the fit is in log space, where a cost proportional to the blocks is
    linear in log_blocks).
    A target step (decode is verify with k = 1) grows with k and the context. `inject_layer`
    and `draft_len` are deliberately absent: they do not change what one step costs. Features
    of the other kind are zero, so one regressor serves both kinds. A ``draft_first`` step
    (the draft step right after a target verify, caches cold) has the draft features plus
    ``is_first`` = 1, so the regressor learns the cold step's extra cost (and its growth with
    the subnet's size) from the draft rows' shape. A token tree's costs: a draft step over a
    tree level of k nodes has ``draft_width`` = k (1 for a chain's step), and the target's
    verify of a tree (`verify_tree`, k positions under a tree mask) has the verify features
    plus ``is_tree`` = 1.

    visual_tokens: visual tokens in one prompt of the target (0 when unknown: then
    ``attended`` is the context scaled by visual_keep).
    """

    def __init__(self, visual_tokens: int = 0) -> None:
        self.visual_tokens = visual_tokens

    def fit(self, X: Any, y: Any = None) -> StepFeatures:
        self._check_frame(X)
        if self.visual_tokens < 0:
            raise ValueError(f"visual_tokens={self.visual_tokens} must be >= 0")
        self.n_features_in_ = len(_INPUT_COLUMNS)
        self.feature_names_in_ = np.array(_INPUT_COLUMNS, dtype=object)
        return self

    def transform(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "n_features_in_")
        frame = self._check_frame(X)
        kinds = frame["kind"].astype(str)
        is_draft = kinds.isin(DRAFT_KINDS).to_numpy()
        is_first = (kinds == "draft_first").to_numpy()
        ctx = frame["context_len"].astype(float).to_numpy()
        k = frame["k"].astype(float).to_numpy()
        heads = np.where(is_draft, pd.to_numeric(frame["heads"], errors="coerce"), 0.0)
        keep = np.where(is_draft, pd.to_numeric(frame["visual_keep"], errors="coerce"), 0.0)
        if np.isnan(heads).any() or np.isnan(keep).any():
            raise ValueError("draft rows need numeric heads and visual_keep")
        depth, mlp = (
            np.where(is_draft, pd.to_numeric(frame[name], errors="coerce"), 0.0)
            if name in frame.columns else np.where(is_draft, float(SIZE_DEFAULTS[name]), 0.0)
            for name in _SIZE_COLUMNS)
        if np.isnan(depth).any() or np.isnan(mlp).any():
            raise ValueError("draft rows need numeric depth and mlp (or neither column: "
                             "depth 1, mlp 1)")
        blocks = np.where(is_draft, 2.0 * depth + 1.0, 0.0)  # decoder layers + cross-attention
        if self.visual_tokens:
            attended = ctx - self.visual_tokens * (1.0 - keep)
        else:
            attended = ctx * keep
        attended = np.where(is_draft, np.maximum(attended, 1.0), 0.0)
        target_k = np.where(is_draft, 0.0, k)
        target_ctx = np.where(is_draft, 0.0, ctx)
        width = np.where(is_draft, k, 0.0)  # nodes a draft step runs over (a tree level)
        out = np.column_stack([
            is_draft.astype(float), heads, keep, attended, heads * attended, np.log(ctx),
            ctx, target_k, target_k * target_ctx, np.log(np.maximum(target_k, 1.0)),
            is_first.astype(float), width, np.log(np.maximum(width, 1.0)),
            (kinds == "verify_tree").to_numpy().astype(float),
            mlp, blocks, np.log(np.maximum(blocks, 1.0)), blocks * heads, blocks * mlp,
            blocks * attended, blocks * heads * attended,
        ])
        return out  # (rows, len(FEATURE_NAMES))

    def get_feature_names_out(self, input_features: Any = None) -> np.ndarray:
        return np.array(FEATURE_NAMES, dtype=object)

    @staticmethod
    def _check_frame(X: Any) -> pd.DataFrame:
        if not isinstance(X, pd.DataFrame):
            raise TypeError(
                f"StepFeatures takes a DataFrame with columns {list(_INPUT_COLUMNS)}, "
                f"got {type(X).__name__}"
            )
        missing = [c for c in _INPUT_COLUMNS if c not in X.columns]
        if missing:
            raise ValueError(f"rows lack column(s) {missing}; they need {list(_INPUT_COLUMNS)}")
        bad = sorted(set(X["kind"].astype(str)) - set(KINDS))
        if bad:
            raise ValueError(f"unknown step kind(s) {bad}; kinds are {', '.join(KINDS)}")
        return X


def default_candidates(random_state: int = 0) -> list[tuple[str, Any]]:
    """The regressors cross-validation chooses among, simplest first (see `CVSelectedRegressor`)."""
    return [
        ("ridge", make_pipeline(StandardScaler(), RidgeCV(alphas=np.logspace(-6, 2, 9)))),
        ("ridge_poly2", make_pipeline(StandardScaler(), PolynomialFeatures(2),
                                      RidgeCV(alphas=np.logspace(-6, 2, 9)))),
        ("ridge_poly3", make_pipeline(StandardScaler(), PolynomialFeatures(3),
                                      RidgeCV(alphas=np.logspace(-6, 2, 9)))),
        ("gradient_boosting", GradientBoostingRegressor(
            n_estimators=150, learning_rate=0.1, max_depth=3, subsample=0.9,
            random_state=random_state)),
        ("random_forest", RandomForestRegressor(
            n_estimators=100, min_samples_leaf=1, random_state=random_state)),
    ]


class CVSelectedRegressor(RegressorMixin, BaseEstimator):
    """Chooses among `candidates` by K-fold cross-validated RMSE, then refits it on all rows.

    The choice follows the one-standard-error rule (Hastie, Tibshirani & Friedman, *Elements
    of Statistical Learning*, 7.10): the first candidate, in the given order (simplest first),
    whose mean CV error is within one standard error of the lowest. A profile fitted on a
    budget has few rows, and the lowest CV error then often belongs to a richer model that
    predicts the untimed grid points worse (BENCHMARKS.md, "Latency predictor").

    candidates: list of (name, unfitted regressor), simplest first; None means
    `default_candidates()`.
    cv: number of folds (fewer when there are fewer rows).
    """

    def __init__(self, candidates: Sequence[tuple[str, Any]] | None = None, cv: int = 5,
                 random_state: int = 0) -> None:
        self.candidates = candidates
        self.cv = cv
        self.random_state = random_state

    def fit(self, X: Any, y: Any) -> CVSelectedRegressor:
        X, y = validate_data(self, X, y, y_numeric=True)
        candidates = (self.candidates if self.candidates is not None
                      else default_candidates(self.random_state))
        if not candidates:
            raise ValueError("candidates is empty; give at least one (name, regressor) pair")
        if self.cv < 2:
            raise ValueError(f"cv={self.cv} must be at least 2 folds")
        folds = min(self.cv, len(y))
        scores: dict[str, float] = {}
        if folds >= 2 and len(candidates) > 1:
            splitter = KFold(n_splits=folds, shuffle=True, random_state=self.random_state)
            errors: dict[str, np.ndarray] = {}
            for name, estimator in candidates:
                errors[name] = -cross_val_score(clone(estimator), X, y, cv=splitter,
                                                scoring="neg_root_mean_squared_error")
                scores[name] = float(np.mean(errors[name]))
            lowest = min(scores, key=lambda n: (not np.isfinite(scores[n]), scores[n]))
            spread = errors[lowest]
            standard_error = float(np.std(spread, ddof=1) / np.sqrt(len(spread)))
            bound = scores[lowest] + (standard_error if np.isfinite(standard_error) else 0.0)
            best = next(n for n, _ in candidates if np.isfinite(scores[n]) and scores[n] <= bound)
        else:
            best = candidates[0][0]
        self.cv_scores_ = scores  # name -> mean cross-validated RMSE (in the fitted y's units)
        self.best_name_ = best
        self.best_estimator_ = clone(dict(candidates)[best]).fit(X, y)
        return self

    def predict(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "best_estimator_")
        X = validate_data(self, X, reset=False)
        return np.asarray(self.best_estimator_.predict(X), dtype=float).ravel()


def make_latency_model(visual_tokens: int = 0, candidates: Sequence[tuple[str, Any]] | None = None,
                       cv: int = 5, random_state: int = 0) -> Pipeline:
    """The unfitted predictor pipeline (rows in, milliseconds out)."""
    return Pipeline([
        ("features", StepFeatures(visual_tokens=visual_tokens)),
        ("regressor", TransformedTargetRegressor(
            regressor=CVSelectedRegressor(candidates=candidates, cv=cv, random_state=random_state),
            func=np.log, inverse_func=np.exp, check_inverse=False)),
    ])


def chosen_regressor(model: Pipeline) -> tuple[str, dict[str, float]]:
    """(name of the regressor cross-validation chose, {name: CV RMSE of log-latency})."""
    selector = model.named_steps["regressor"].regressor_
    return selector.best_name_, dict(selector.cv_scores_)


def latency_metrics(measured_ms: Any, predicted_ms: Any) -> dict[str, float]:
    """MAPE (fraction), RMSE (ms), share within +-10 % and Kendall's tau of the ranking."""
    from scipy.stats import kendalltau

    y = np.asarray(measured_ms, dtype=float)
    p = np.asarray(predicted_ms, dtype=float)
    if y.shape != p.shape or y.size == 0:
        raise ValueError(f"need equal, non-empty arrays; got {y.shape} and {p.shape}")
    rel = np.abs(p - y) / y
    tau = kendalltau(y, p).statistic if y.size > 1 else float("nan")
    return {
        "mape": float(rel.mean()),
        "rmse": float(np.sqrt(np.mean((p - y) ** 2))),
        "within_10pct": float((rel <= 0.10 + 1e-9).mean()),  # 1.1 vs 1.0 is within
        "kendall_tau": float(tau),
    }
