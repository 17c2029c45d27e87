"""The draft steps' cost model: draft rows -> milliseconds, linear in the context.

A draft step's cost is what its blocks do: a fixed part, a part per block, the MLP's channels
and the attention's work over the keys it reads, which are the text and the *kept* visual tokens
and so grow linearly with the context; then the LM head, whose rows are the draft's vocabulary
(a share `draft_vocab` of the target's) times the positions it computes logits for (one, or a
tree level's nodes). `DraftFeatures` turns a row into exactly these products of the subnet's
sizes (heads, visual_keep, blocks = 2 * depth + 1, mlp, draft_vocab, a tree level's extra
nodes) and, at most once in each, the attended keys or the context: every feature is affine in
the context, so a model linear in them is linear in the context, inside the profiled range and
beyond it. Nothing squares the context or takes its log: a ridge on squared log features
predicts many times the true cost a few spans beyond the profiled contexts.

`RelativeRidge` fits milliseconds (not their log: a model linear in the context fitted on
log(ms) is exponential in the context) with weights 1 / ms^2, so what it minimises is the squared
*relative* error -- what MAPE and "within 10 %" measure, and the draft's cheap and expensive
steps weigh alike. `CVSelectedRegressor` picks among such candidates (the base shape features,
or those plus the sizes' pairwise products) by grouped K-fold cross-validation and the
one-standard-error rule. Gradient boosting, random forests and polynomials of the context are
not candidates: the first two are flat outside the profiled range, the last explodes.

Each draft kind (``draft``, with its tree levels, and ``draft_first``) gets its own selector
(`regressor.LatencyRegressor`); the target's steps are not regressed at all (`target_table`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from dreams_nas.latency.kinds import DRAFT_KINDS
from dreams_nas.supernet.core.spec import SIZE_DEFAULTS
from sklearn.base import BaseEstimator, RegressorMixin, TransformerMixin, clone
from sklearn.linear_model import RidgeCV
from sklearn.model_selection import GroupKFold, KFold
from sklearn.preprocessing import StandardScaler
from sklearn.utils.validation import check_is_fitted, validate_data

# The cost's shape: a fixed part, per block (blocks = 2 * depth + 1) its overhead, heads, MLP
# channels and attention over the attended keys; a tree level's extra nodes (width - 1) repeat
# the per-block work; the LM head's rows (draft_vocab) once per position it computes (1 +
# extra_nodes). Each feature is affine in the context.
BASE_FEATURES = (
    "context", "attended", "heads", "mlp", "blocks", "blocks_x_heads", "blocks_x_mlp",
    "blocks_x_attended", "blocks_x_heads_x_attended", "heads_x_attended", "extra_nodes",
    "extra_x_blocks", "extra_x_blocks_x_heads", "extra_x_blocks_x_mlp",
    "extra_x_blocks_x_heads_x_attended", "draft_vocab", "extra_x_draft_vocab",
)
SIZES = ("heads", "visual_keep", "blocks", "mlp", "draft_vocab", "extra_nodes")
# Pairwise products of the sizes (squares included), alone and times the attended keys: still
# affine in the context.
SIZE_PRODUCTS = tuple(f"{a}_x_{b}" for i, a in enumerate(SIZES) for b in SIZES[i:])
FEATURE_NAMES = (*BASE_FEATURES, *SIZE_PRODUCTS, *(f"{p}_x_attended" for p in SIZE_PRODUCTS))
N_BASE_FEATURES = len(BASE_FEATURES)

_INPUT_COLUMNS = ("kind", "heads", "visual_keep", "context_len", "k")
# Optional input columns: rows made without them (in memory) are the paper's draft size,
# `SIZE_DEFAULTS`.
_SIZE_COLUMNS = tuple(SIZE_DEFAULTS)
DEFAULT_ALPHAS = tuple(float(a) for a in np.logspace(-6, 2, 9))


class DraftFeatures(TransformerMixin, BaseEstimator):
    """Draft rows of (kind, heads, visual_keep, depth, mlp, draft_vocab, context_len, k) -> the
    numeric features of a step (a row without a depth, mlp or draft_vocab column is at 1 there:
    the paper's draft), `FEATURE_NAMES`, the first `N_BASE_FEATURES` of them the cost's shape.

    The attention reads the text and the *kept* visual tokens,
    ``attended = context_len - visual_tokens * (1 - visual_keep)``; a step runs
    ``blocks = 2 * depth + 1`` blocks (depth decoder layers on each side of the
    cross-attention); a step over a tree level of k nodes has ``extra_nodes`` = k - 1 (0 for a
    chain's step), and its LM head computes ``draft_vocab`` of the vocabulary's rows for each of
    the k nodes (``draft_vocab`` + ``extra_x_draft_vocab``). `inject_layer` and `draft_len` are
    deliberately absent: they do not change what one step costs.

    visual_tokens: visual tokens in one prompt of the target (0 when unknown: then
    ``attended`` is the context scaled by visual_keep).
    """

    def __init__(self, visual_tokens: int = 0) -> None:
        self.visual_tokens = visual_tokens

    def fit(self, X: Any, y: Any = None) -> DraftFeatures:
        self._check_frame(X)
        if self.visual_tokens < 0:
            raise ValueError(f"visual_tokens={self.visual_tokens} must be >= 0")
        self.n_features_in_ = len(_INPUT_COLUMNS)
        self.feature_names_in_ = np.array(_INPUT_COLUMNS, dtype=object)
        return self

    def transform(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "n_features_in_")
        frame = self._check_frame(X)
        ctx = frame["context_len"].astype(float).to_numpy()
        extra = frame["k"].astype(float).to_numpy() - 1.0  # a tree level's nodes beyond one
        heads = pd.to_numeric(frame["heads"], errors="coerce").to_numpy(dtype=float)
        keep = pd.to_numeric(frame["visual_keep"], errors="coerce").to_numpy(dtype=float)
        if np.isnan(heads).any() or np.isnan(keep).any():
            raise ValueError("draft rows need numeric heads and visual_keep")
        depth, mlp, vocab = (
            pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float)
            if name in frame.columns else np.full(len(frame), float(SIZE_DEFAULTS[name]))
            for name in _SIZE_COLUMNS)
        if np.isnan(depth).any() or np.isnan(mlp).any() or np.isnan(vocab).any():
            raise ValueError("draft rows need numeric depth, mlp and draft_vocab (or no such "
                             "column: depth 1, mlp 1, draft_vocab 1)")
        blocks = 2.0 * depth + 1.0  # decoder layers + cross-attention
        if self.visual_tokens:
            attended = ctx - self.visual_tokens * (1.0 - keep)
        else:
            attended = ctx * keep
        attended = np.maximum(attended, 1.0)
        base = [ctx, attended, heads, mlp, blocks, blocks * heads, blocks * mlp,
                blocks * attended, blocks * heads * attended, heads * attended, extra,
                extra * blocks, extra * blocks * heads, extra * blocks * mlp,
                extra * blocks * heads * attended, vocab, extra * vocab]
        sizes = [heads, keep, blocks, mlp, vocab, extra]
        products = [a * b for i, a in enumerate(sizes) for b in sizes[i:]]
        out = np.column_stack([*base, *products, *(p * attended for p in products)])
        return out  # (rows, len(FEATURE_NAMES))

    def get_feature_names_out(self, input_features: Any = None) -> np.ndarray:
        return np.array(FEATURE_NAMES, dtype=object)

    @staticmethod
    def _check_frame(X: Any) -> pd.DataFrame:
        if not isinstance(X, pd.DataFrame):
            raise TypeError(
                f"DraftFeatures takes a DataFrame with columns {list(_INPUT_COLUMNS)}, "
                f"got {type(X).__name__}"
            )
        missing = [c for c in _INPUT_COLUMNS if c not in X.columns]
        if missing:
            raise ValueError(f"rows lack column(s) {missing}; they need {list(_INPUT_COLUMNS)}")
        bad = sorted(set(X["kind"].astype(str)) - set(DRAFT_KINDS))
        if bad:
            raise ValueError(f"DraftFeatures takes draft steps ({', '.join(DRAFT_KINDS)}), "
                             f"not {bad}")
        return X


class RelativeRidge(RegressorMixin, BaseEstimator):
    """Ridge regression of a positive target (milliseconds) that minimises the squared
    *relative* error: weights 1 / y^2, features standardised, the penalty chosen among `alphas`
    by efficient leave-one-out (`RidgeCV`). Linear in its features, so it extrapolates as they
    do. Never predicts below a tenth of the cheapest fitted target (`floor_`): a line far below
    its range could otherwise cross zero.

    features: how many of the leading feature columns it reads (None: all).
    """

    def __init__(self, features: int | None = None,
                 alphas: Sequence[float] = DEFAULT_ALPHAS) -> None:
        self.features = features
        self.alphas = alphas

    def fit(self, X: Any, y: Any) -> RelativeRidge:
        X, y = validate_data(self, X, y, y_numeric=True)
        if not (np.asarray(y) > 0).all():
            raise ValueError("RelativeRidge fits positive targets (milliseconds); got y <= 0")
        cols = self._columns(X)
        self.scaler_ = StandardScaler().fit(cols)
        weights = 1.0 / np.square(y)
        weights /= weights.mean()
        scaled = self.scaler_.transform(cols)
        if len(y) >= 3:
            self.ridge_ = RidgeCV(alphas=list(self.alphas)).fit(scaled, y, sample_weight=weights)
        else:  # leave-one-out needs rows to leave out: the strongest penalty of the list
            self.ridge_ = RidgeCV(alphas=[max(self.alphas)]).fit(scaled, y,
                                                                  sample_weight=weights)
        self.floor_ = 0.1 * float(np.min(y))
        return self

    def predict(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "ridge_")
        X = validate_data(self, X, reset=False)
        out = self.ridge_.predict(self.scaler_.transform(self._columns(X)))
        return np.maximum(np.asarray(out, dtype=float).ravel(), self.floor_)

    def _columns(self, X: np.ndarray) -> np.ndarray:
        return X if self.features is None else X[:, : int(self.features)]


def default_candidates(random_state: int = 0) -> list[tuple[str, Any]]:
    """The regressors cross-validation chooses among, simplest first (see `CVSelectedRegressor`):
    both linear in the context. random_state: unused (the candidates are deterministic), kept
    for candidates that draw."""
    return [
        ("linear", RelativeRidge(features=N_BASE_FEATURES)),
        ("linear_sizes2", RelativeRidge()),
    ]


class CVSelectedRegressor(RegressorMixin, BaseEstimator):
    """Chooses among `candidates` by K-fold cross-validated error, then refits it on all rows.

    The choice follows the one-standard-error rule (Hastie, Tibshirani & Friedman, *Elements
    of Statistical Learning*, 7.10): the first candidate, in the given order (simplest first),
    whose mean CV error is within one standard error of the lowest. A profile fitted on a
    budget has few rows, and the lowest CV error then often belongs to a richer model that
    predicts the untimed grid points worse (BENCHMARKS.md, "Latency predictor").

    `fit(X, y, groups=...)`: rows of one group (a grid point: a subnet's architecture at one
    context) are never split between a fold's training and test rows (`GroupKFold`); without
    groups, plain shuffled K-fold.

    candidates: list of (name, unfitted regressor), simplest first; None means
    `default_candidates()`.
    cv: number of folds (fewer when there are fewer rows or groups).
    error: ``rmse`` (root mean squared error) or ``relative_rmse`` (root mean squared
    relative error, for positive targets such as milliseconds).
    """

    def __init__(self, candidates: Sequence[tuple[str, Any]] | None = None, cv: int = 5,
                 random_state: int = 0, error: str = "rmse") -> None:
        self.candidates = candidates
        self.cv = cv
        self.random_state = random_state
        self.error = error

    def fit(self, X: Any, y: Any, groups: Any = None) -> CVSelectedRegressor:
        X, y = validate_data(self, X, y, y_numeric=True)
        candidates = (self.candidates if self.candidates is not None
                      else default_candidates(self.random_state))
        if not candidates:
            raise ValueError("candidates is empty; give at least one (name, regressor) pair")
        if self.cv < 2:
            raise ValueError(f"cv={self.cv} must be at least 2 folds")
        if self.error not in ("rmse", "relative_rmse"):
            raise ValueError(f"error={self.error!r} must be rmse or relative_rmse")
        splits = self._splits(X, y, groups)
        scores: dict[str, float] = {}
        if len(splits) >= 2 and len(candidates) > 1:
            errors: dict[str, np.ndarray] = {}
            for name, estimator in candidates:
                errors[name] = np.array([self._fold_error(estimator, X, y, train, test)
                                         for train, test in splits])
                scores[name] = float(np.mean(errors[name]))
            lowest = min(scores, key=lambda n: (not np.isfinite(scores[n]), scores[n]))
            spread = errors[lowest]
            standard_error = float(np.std(spread, ddof=1) / np.sqrt(len(spread)))
            bound = scores[lowest] + (standard_error if np.isfinite(standard_error) else 0.0)
            best = next((n for n, _ in candidates if np.isfinite(scores[n])
                         and scores[n] <= bound), candidates[0][0])
        else:
            best = candidates[0][0]
        self.cv_scores_ = scores  # name -> mean cross-validated error (`error`)
        self.best_name_ = best
        self.best_estimator_ = clone(dict(candidates)[best]).fit(X, y)
        return self

    def predict(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "best_estimator_")
        X = validate_data(self, X, reset=False)
        return np.asarray(self.best_estimator_.predict(X), dtype=float).ravel()

    def _splits(self, X: np.ndarray, y: np.ndarray, groups: Any
                ) -> list[tuple[np.ndarray, np.ndarray]]:
        if groups is None:
            folds = min(self.cv, len(y))
            if folds < 2:
                return []
            splitter = KFold(n_splits=folds, shuffle=True, random_state=self.random_state)
            return list(splitter.split(X, y))
        groups = np.asarray(groups)
        if groups.shape != (len(y),):
            raise ValueError(f"groups has shape {groups.shape}; need one group per row "
                             f"({len(y)})")
        folds = min(self.cv, len(np.unique(groups)))
        if folds < 2:
            return []
        splitter = GroupKFold(n_splits=folds, shuffle=True, random_state=self.random_state)
        return list(splitter.split(X, y, groups))

    def _fold_error(self, estimator: Any, X: np.ndarray, y: np.ndarray, train: np.ndarray,
                    test: np.ndarray) -> float:
        try:
            predicted = clone(estimator).fit(X[train], y[train]).predict(X[test])
        except ValueError:  # a fold a candidate cannot fit (too few rows): it loses this one
            return float("inf")
        diff = np.asarray(predicted, dtype=float) - y[test]
        if self.error == "relative_rmse":
            diff = diff / y[test]
        return float(np.sqrt(np.mean(np.square(diff))))


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
