"""Pareto front as a pure array function (Optuna's `_is_pareto_front` is the model).

A point is on the front when no other point is at least as good in every objective and
strictly better in one. Duplicates of a front point are all on the front (neither dominates
the other); +-inf compare as ordinary extremes; a row holding NaN is never on the front and
dominates nothing (its value is unknown).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from dreams_nas.supernet.core.errors import InputError
from numpy.typing import ArrayLike, NDArray

_DIRECTIONS = ("maximize", "minimize")
_CHUNK = 1024  # rows compared at once: bounds memory at _CHUNK * n * m booleans


def is_pareto_front(values: ArrayLike, directions: Sequence[str]) -> NDArray[np.bool_]:
    """Mask of the non-dominated rows.

    values:     (n_points, n_objectives) objective values.
    directions: one of "maximize"/"minimize" per objective.
    returns:    (n_points,) bool.
    """
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise InputError(f"values must be a (points, objectives) array, got shape {arr.shape}")
    if len(directions) != arr.shape[1]:
        raise InputError(
            f"{len(directions)} direction(s) {list(directions)} for {arr.shape[1]} objective(s); "
            "give one 'maximize' or 'minimize' per column"
        )
    bad = [d for d in directions if d not in _DIRECTIONS]
    if bad:
        raise InputError(f"direction {bad[0]!r} is not one of {list(_DIRECTIONS)}")
    n = arr.shape[0]
    if n == 0:
        return np.zeros(0, dtype=bool)
    # Minimisation throughout: flip the maximised columns.
    sign = np.array([-1.0 if d == "maximize" else 1.0 for d in directions])
    loss = arr * sign  # (n, m)
    valid = ~np.isnan(loss).any(axis=1)  # (n,)
    others = loss[valid]  # (k, m): only known points can dominate
    on_front = np.zeros(n, dtype=bool)
    for start in range(0, n, _CHUNK):
        block = loss[start : start + _CHUNK]  # (b, m)
        no_worse = (others[None, :, :] <= block[:, None, :]).all(axis=2)  # (b, k)
        better = (others[None, :, :] < block[:, None, :]).any(axis=2)  # (b, k)
        dominated = (no_worse & better).any(axis=1)  # (b,)
        on_front[start : start + _CHUNK] = ~dominated
    return on_front & valid
