"""The target's steps from their own measurements: (context_len, k) -> milliseconds, per kind.

A profile times every target step (``decode``, ``verify`` over each k, ``verify_tree`` over each
tree size) at every context length of its grid: a few dozen rows that scale every speedup. They
are not regressed together with the draft rows (which would outnumber them and blur them); each
kind's rows are read as a table, per k:

* inside the measured contexts of that k: piecewise-linear interpolation between them (a
  measured context gives back its own measurement: the mean of its rows, when profiles of
  several machines were merged);
* outside them: that k's least-squares line in the context (a target step's cost is its fixed
  part plus attention over the KV cache, linear in the context); with one measured context, that
  context's value;
* a k between two measured ks: linear in k between the two ks' values at the context (a step
  over k positions costs its fixed part plus a part per position); a k outside the measured ks
  is refused (`InputError`): nothing says how a longer verify scales on this hardware.

No prediction falls below a tenth of the cheapest measurement of its k (a line far below the
measured contexts could otherwise cross zero).

On a noisy machine each measurement carries its own noise (a shared 2-vCPU VM: p10s of one
step 20-40 % apart minute to minute), and the table passes it on: a verify over 8 positions
priced 18 % above one over 7 where both cost the same, which is enough to swap the search's
choice of draft_len. So the kind's rows are also fitted by one least-squares surface, relative
error weighted, in the cost's shape: a fixed part, a part per position, attention over the
cache and per position over the cache (``a + b k + c context + d k context``; one k: ``a + c
context``). Each is scored by leave-one-row-out relative error over the rows, and the surface
predicts the kind only when it predicts the left-out rows at least `SURFACE_MARGIN` better than
the table: measurements precise enough to show a step (a GPU's tile boundaries, a cache
spilling) keep the table. `choice_` names the model, `loo_` holds both errors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from dreams_nas.supernet.core.errors import InputError
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

# The surface replaces the table only when its leave-one-out relative error is at most this share
# of the table's.
SURFACE_MARGIN = 0.9
TABLE, SURFACE = "interpolated", "surface"


class TargetTable(RegressorMixin, BaseEstimator):
    """One target kind's measured steps; X columns (context_len, k), y milliseconds.

    kind: the step kind the rows are (``decode``, ``verify``, ``verify_tree``), named in
    messages.
    """

    def __init__(self, kind: str = "verify") -> None:
        self.kind = kind

    def fit(self, X: Any, y: Any) -> TargetTable:
        """The table, the surface, and the choice between them (module docstring)."""
        self.fit_table(X, y)
        X, y = np.asarray(X, dtype=float), np.asarray(y, dtype=float)  # validated by fit_table
        self.coef_ = _surface_fit(X, y)
        self.loo_ = _loo_errors(self.kind, X, y) if self.coef_ is not None else {}
        surface_wins = (bool(self.loo_)
                        and self.loo_[SURFACE] <= SURFACE_MARGIN * self.loo_[TABLE])
        self.choice_ = SURFACE if surface_wins else TABLE
        return self

    def fit_table(self, X: Any, y: Any) -> TargetTable:
        """The table alone (`choice_` is the table)."""
        X, y = validate_data(self, X, y, y_numeric=True)
        if X.shape[1] != 2:
            raise ValueError(f"TargetTable takes columns (context_len, k); got {X.shape[1]}")
        if not (np.asarray(y) > 0).all():
            raise ValueError(f"{self.kind} milliseconds must be positive")
        ks = np.unique(X[:, 1].astype(int))
        contexts, values, slopes, intercepts = [], [], [], []
        for k in ks:
            rows = X[:, 1].astype(int) == k
            ctx, inverse = np.unique(X[rows, 0], return_inverse=True)
            ms = np.bincount(inverse, weights=y[rows]) / np.bincount(inverse)  # mean per context
            if len(ctx) >= 2:
                slope, intercept = np.polyfit(ctx, ms, 1)
            else:
                slope, intercept = 0.0, float(ms[0])
            contexts.append(ctx.astype(float))
            values.append(ms.astype(float))
            slopes.append(float(slope))
            intercepts.append(float(intercept))
        self.ks_ = ks.astype(np.int64)
        self.contexts_ = contexts  # per k: the measured contexts, ascending
        self.ms_ = values  # per k: the mean milliseconds at each
        self.slopes_ = np.array(slopes)  # per k: least-squares line over the contexts
        self.intercepts_ = np.array(intercepts)
        self.floor_ = 0.1 * float(np.min(y))
        self.coef_, self.loo_, self.choice_ = None, {}, TABLE
        return self

    def predict(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "ks_")
        X = validate_data(self, X, reset=False)
        ctx, k = X[:, 0].astype(float), X[:, 1].astype(int)
        if getattr(self, "choice_", TABLE) == SURFACE:
            for value in np.unique(k):
                self._check_k(int(value))
            return np.maximum(_surface_features(X) @ self.coef_, self.floor_)
        out = np.empty(len(X), dtype=float)
        for value in np.unique(k):
            rows = k == value
            out[rows] = self._at_k(int(value), ctx[rows])
        return out

    def k_range(self) -> tuple[int, int]:
        check_is_fitted(self, "ks_")
        return int(self.ks_[0]), int(self.ks_[-1])

    def _at_k(self, k: int, ctx: np.ndarray) -> np.ndarray:
        hit = np.flatnonzero(self.ks_ == k)
        if hit.size:
            return self._along_context(int(hit[0]), ctx)
        self._check_k(k)
        above = int(np.searchsorted(self.ks_, k))
        k0, k1 = int(self.ks_[above - 1]), int(self.ks_[above])
        w = (k - k0) / (k1 - k0)
        return (1 - w) * self._along_context(above - 1, ctx) + w * self._along_context(above, ctx)

    def _check_k(self, k: int) -> None:
        """Refuse a k outside the profiled ks (`InputError`): it is not extrapolated."""
        low, high = self.k_range()
        if not low <= k <= high:
            span = f"{low}" if low == high else f"{low}..{high}"
            raise InputError(
                f"a {self.kind} step over k={k} positions was not profiled (profiled: k {span}) "
                "and is not extrapolated; rerun `dreams-nas profile` with the run's search space "
                "(it times the target's steps for every draft length and tree of the space)")

    def _along_context(self, i: int, ctx: np.ndarray) -> np.ndarray:
        known, ms = self.contexts_[i], self.ms_[i]
        inside = np.interp(ctx, known, ms)
        line = self.intercepts_[i] + self.slopes_[i] * ctx
        outside = (ctx < known[0]) | (ctx > known[-1])
        return np.maximum(np.where(outside, line, inside), 0.1 * float(ms.min()))


def _surface_features(X: np.ndarray) -> np.ndarray:
    """(context_len, k) rows -> [1, k, context, k context]."""
    ctx, k = X[:, 0].astype(float), X[:, 1].astype(float)
    return np.c_[np.ones(len(X)), k, ctx, k * ctx]


def _surface_fit(X: np.ndarray, y: np.ndarray) -> np.ndarray | None:
    """The relative-error least-squares surface's coefficients, padded to [a, b, c, d] (b = d = 0
    for one k); None when the rows cannot pin it down with a row to spare for scoring (fewer
    than two contexts, or no more rows than coefficients + 1)."""
    multi_k = len(np.unique(X[:, 1])) > 1
    n_coef = 4 if multi_k else 2
    if len(np.unique(X[:, 0])) < 2 or len(X) <= n_coef + 1:
        return None
    columns = [0, 1, 2, 3] if multi_k else [0, 2]
    A = _surface_features(X)[:, columns] / y[:, None]  # relative error: rows divided by their ms
    coef = np.zeros(4)
    coef[columns] = np.linalg.lstsq(A, np.ones(len(y)), rcond=None)[0]
    return coef


def _loo_errors(kind: str, X: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Mean relative error of the table and of the surface on each row left out of their fit, over
    the rows both can predict (a row whose k has no other row is skipped); {} when none."""
    errors: dict[str, list[float]] = {TABLE: [], SURFACE: []}
    for i in range(len(X)):
        keep = np.arange(len(X)) != i
        coef = _surface_fit(X[keep], y[keep])
        if coef is None or not (X[keep, 1] == X[i, 1]).any():
            continue
        table = TargetTable(kind).fit_table(X[keep], y[keep])
        errors[TABLE].append(abs(float(table.predict(X[i:i + 1])[0]) - y[i]) / y[i])
        surface = max(float((_surface_features(X[i:i + 1]) @ coef)[0]),
                      0.1 * float(y[keep].min()))
        errors[SURFACE].append(abs(surface - y[i]) / y[i])
    if not errors[TABLE]:
        return {}
    return {name: float(np.mean(values)) for name, values in errors.items()}
