"""The report's Pareto front of two objectives (one maximised, one minimised), by a sweep.

The search computes its fronts with `nas.search.pareto.is_pareto_front` (any number of
objectives, pairwise). reports imports no other package, so it computes the two-objective front
its figures need itself, with a sort-and-sweep; tests/test_copies_agree.py checks that both give
the same mask. A point is on the front when no other point is at least as good in both
objectives and strictly better in one: duplicates of a front point are all on it, +-inf compare
as ordinary extremes, and a point holding NaN is never on it and dominates nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def pareto_mask(maximise: Sequence[float], minimise: Sequence[float]) -> list[bool]:
    """For each point (maximise[i], minimise[i]): whether no other point dominates it."""
    return pareto_mask_array(maximise, minimise).tolist()


def pareto_mask_array(maximise: Sequence[float] | np.ndarray,
                      minimise: Sequence[float] | np.ndarray) -> np.ndarray:
    """`pareto_mask` as an (n,) bool array; O(n log n), no Python loop over the points."""
    if len(maximise) != len(minimise):
        raise ValueError(
            f"pareto_mask needs equal lengths, got {len(maximise)} and {len(minimise)}"
        )
    gain = np.asarray(maximise, dtype=np.float64).reshape(-1)  # (n,)
    cost = np.asarray(minimise, dtype=np.float64).reshape(-1)  # (n,)
    mask = np.zeros(len(gain), dtype=bool)
    known = np.flatnonzero(~(np.isnan(gain) | np.isnan(cost)))
    if not known.size:
        return mask
    # Cheapest first; at equal cost the largest gain first.
    order = known[np.lexsort((-gain[known], cost[known]))]
    g, c = gain[order], cost[order]  # (k,)
    starts = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])  # each equal-cost group's first
    group = np.cumsum(np.r_[True, c[1:] != c[:-1]]) - 1  # (k,) each point's group
    top = g[starts]  # (groups,) each group's largest gain
    # The largest gain among strictly cheaper points (none for the cheapest group).
    cheaper = np.r_[-np.inf, np.maximum.accumulate(top)[:-1]]
    # Dominated by a cheaper point at least as good, or by an equally cheap better one.
    mask[order] = (g == top[group]) & ((group == 0) | (cheaper[group] < g))
    return mask
