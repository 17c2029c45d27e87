"""Pareto front as a pure array function (Optuna's `_is_pareto_front` is the model).

A point is on the front when no other point is at least as good in every objective and
strictly better in one. Duplicates of a front point are all on the front (neither dominates
the other); +-inf compare as ordinary extremes; a row holding NaN is never on the front and
dominates nothing (its value is unknown).

Cost: one objective O(n); two objectives O(n log n) by sort-and-sweep (a search over 10^6
subnets is a 10^6-point front); more objectives a blocked filter over the points in
lexicographic order, which compares each block of `_CHUNK` points with the front found so far
only (O(n * front) time, O(_CHUNK * _CHUNK) memory; never an n x n matrix).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from dreams_nas.supernet.core.errors import InputError
from numpy.typing import ArrayLike, NDArray

_DIRECTIONS = ("maximize", "minimize")
_CHUNK = 1024  # k > 2 objectives: points compared at once (memory _CHUNK * _CHUNK * m bools)


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
    on_front = np.zeros(n, dtype=bool)
    if n == 0 or arr.shape[1] == 0:
        on_front[:] = arr.shape[1] == 0  # no objective: nothing is better than anything
        return on_front
    # Minimisation throughout: flip the maximised columns.
    sign = np.array([-1.0 if d == "maximize" else 1.0 for d in directions])
    loss = arr * sign  # (n, m)
    known = np.flatnonzero(~np.isnan(loss).any(axis=1))  # only known points can dominate
    if known.size == 0:
        return on_front
    sub = loss[known]  # (k, m)
    if sub.shape[1] == 1:
        on_front[known] = sub[:, 0] == sub[:, 0].min()
    elif sub.shape[1] == 2:
        on_front[known] = _front_2d(sub[:, 0], sub[:, 1])
    else:
        on_front[known] = _front_blocked(sub)
    return on_front


def _front_2d(first: NDArray[np.float64], second: NDArray[np.float64]) -> NDArray[np.bool_]:
    """Sort-and-sweep front of known points, both objectives minimised.

    first, second: (k,) without NaN. A point is dominated by a point of strictly smaller `first`
    and no larger `second`, or by a point of equal `first` and strictly smaller `second`; so in
    (first, second) order a point is on the front when its `second` is its group's smallest
    (the group: equal `first`) and strictly below the smallest `second` of the earlier groups.
    """
    order = np.lexsort((second, first))  # by first, then second
    a, b = first[order], second[order]
    starts = np.flatnonzero(np.r_[True, a[1:] != a[:-1]])  # (g,) each group's first index
    group = np.cumsum(np.r_[True, a[1:] != a[:-1]]) - 1  # (k,) group of each sorted point
    group_min = b[starts]  # (g,) sorted by second within a group
    earlier_min = np.minimum.accumulate(group_min)  # (g,) over groups 0..g
    beats_earlier = np.ones(len(starts), dtype=bool)  # group 0 has no earlier group
    beats_earlier[1:] = group_min[1:] < earlier_min[:-1]
    sorted_mask = (b == group_min[group]) & beats_earlier[group]
    mask = np.empty_like(sorted_mask)
    mask[order] = sorted_mask
    return mask


def _front_blocked(loss: NDArray[np.float64]) -> NDArray[np.bool_]:
    """Front of known points in k > 2 minimised objectives, in blocks of `_CHUNK`.

    loss: (k, m) without NaN. A dominator precedes the point it dominates in lexicographic
    order, and whoever dominates a dominated point dominates what it dominates, so each block
    needs comparing only with the front of the points before it and with itself.
    """
    order = np.lexsort(loss.T[::-1])  # by column 0, then 1, ...
    ranked = loss[order]  # (k, m)
    front = np.empty((0, loss.shape[1]))  # (f, m): non-dominated points so far
    sorted_mask = np.zeros(len(ranked), dtype=bool)
    for start in range(0, len(ranked), _CHUNK):
        block = ranked[start : start + _CHUNK]  # (b, m)
        keep = ~_dominated_by(block, front) & ~_dominated_by(block, block)
        sorted_mask[start : start + _CHUNK] = keep
        front = np.concatenate([front, block[keep]])
    mask = np.empty_like(sorted_mask)
    mask[order] = sorted_mask
    return mask


def _dominated_by(points: NDArray[np.float64], others: NDArray[np.float64]) -> NDArray[np.bool_]:
    """(b,) whether some row of `others` dominates each row of `points`; `others` compared
    `_CHUNK` rows at a time so memory stays O(b * _CHUNK)."""
    out = np.zeros(len(points), dtype=bool)
    for start in range(0, len(others), _CHUNK):
        part = others[start : start + _CHUNK]  # (c, m)
        no_worse = (part[None, :, :] <= points[:, None, :]).all(axis=2)  # (b, c)
        better = (part[None, :, :] < points[:, None, :]).any(axis=2)  # (b, c)
        out |= (no_worse & better).any(axis=1)
    return out
