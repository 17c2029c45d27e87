"""The Pareto front as a pure array function, for the front computed from the figures' axes.

The search has the same function (`nas.search.pareto.is_pareto_front`); reports imports no
other package, so this is a copy, and tests/test_copies_agree.py checks that the two give the
same mask. A point is on the front when no other point is at least as good in every objective
and strictly better in one. Duplicates of a front point are all on the front; +-inf compare as
ordinary extremes; a point holding NaN is never on the front and dominates nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

DIRECTIONS = ("maximize", "minimize")
_CHUNK = 1024  # points compared at once: bounds memory at _CHUNK * n * m booleans


def is_pareto_front(values: ArrayLike, directions: Sequence[str]) -> NDArray[np.bool_]:
    """Mask of the non-dominated points.

    values:     (n_points, n_objectives) objective values.
    directions: one of "maximize"/"minimize" per objective.
    returns:    (n_points,) bool.
    """
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise ValueError(f"values must be a (points, objectives) array, got shape {arr.shape}")
    if len(directions) != arr.shape[1]:
        raise ValueError(
            f"{len(directions)} direction(s) {list(directions)} for {arr.shape[1]} objective(s); "
            "give one 'maximize' or 'minimize' per column"
        )
    bad = [d for d in directions if d not in DIRECTIONS]
    if bad:
        raise ValueError(f"direction {bad[0]!r} is not one of {list(DIRECTIONS)}")
    # Minimisation throughout: flip the maximised columns.
    sign = np.array([-1.0 if d == "maximize" else 1.0 for d in directions])
    loss = arr * sign  # (n, m)
    known = ~np.isnan(loss).any(axis=1)  # (n,)
    others = loss[known]  # (k, m): only known points can dominate
    on_front = np.zeros(arr.shape[0], dtype=bool)
    for start in range(0, arr.shape[0], _CHUNK):
        block = loss[start : start + _CHUNK]  # (b, m)
        no_worse = (others[None, :, :] <= block[:, None, :]).all(axis=2)  # (b, k)
        better = (others[None, :, :] < block[:, None, :]).any(axis=2)  # (b, k)
        on_front[start : start + _CHUNK] = ~(no_worse & better).any(axis=1)
    return on_front & known


def pareto_mask(maximise: Sequence[float], minimise: Sequence[float]) -> list[bool]:
    """`is_pareto_front` of two objectives, one maximised and one minimised, as a list."""
    if len(maximise) != len(minimise):
        raise ValueError(
            f"pareto_mask needs equal lengths, got {len(maximise)} and {len(minimise)}"
        )
    values = np.column_stack((np.asarray(maximise, dtype=np.float64),
                              np.asarray(minimise, dtype=np.float64)))  # (n, 2)
    return is_pareto_front(values, DIRECTIONS).tolist()
