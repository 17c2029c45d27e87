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
    if len(maximise) != len(minimise):
        raise ValueError(
            f"pareto_mask needs equal lengths, got {len(maximise)} and {len(minimise)}"
        )
    gain = np.asarray(maximise, dtype=np.float64)  # (n,)
    cost = np.asarray(minimise, dtype=np.float64)  # (n,)
    known = np.flatnonzero(~(np.isnan(gain) | np.isnan(cost)))
    # Cheapest first; at equal cost the largest gain first.
    order = known[np.lexsort((-gain[known], cost[known]))]
    mask = [False] * len(gain)
    best_cheaper: float | None = None  # the largest gain among strictly cheaper points
    start = 0
    while start < len(order):
        end = start
        while end < len(order) and cost[order[end]] == cost[order[start]]:
            end += 1
        top = float(gain[order[start]])  # the group's largest gain
        for i in order[start:end]:
            # Dominated by a cheaper point at least as good, or by an equally cheap better one.
            mask[i] = gain[i] == top and (best_cheaper is None or best_cheaper < gain[i])
        best_cheaper = top if best_cheaper is None else max(best_cheaper, top)
        start = end
    return mask
