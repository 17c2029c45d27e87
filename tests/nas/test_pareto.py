from __future__ import annotations

import math

import numpy as np
import pytest
from dreams_nas.nas.search.pareto import is_pareto_front
from dreams_nas.supernet.core.errors import InputError

MAX_MIN = ("maximize", "minimize")
inf, nan = math.inf, math.nan

CASES = [
    # (values, directions, expected mask)
    ([[1, 1]], MAX_MIN, [True]),
    # (2, 1) dominates (1, 1) and (2, 2); (3, 5) trades off
    ([[1, 1], [2, 1], [2, 2], [3, 5]], MAX_MIN, [False, True, False, True]),
    # duplicates of a front point are all on the front
    ([[2, 1], [2, 1], [1, 1]], MAX_MIN, [True, True, False]),
    # ties in one objective: the better in the other wins
    ([[2, 3], [2, 1], [2, 2]], MAX_MIN, [False, True, False]),
    # infinities are extremes: +inf speedup dominates everything with no lower cost
    ([[inf, 5], [3, 5], [3, 1]], MAX_MIN, [True, False, True]),
    ([[-inf, 0], [1, 0]], MAX_MIN, [False, True]),
    ([[inf, inf], [inf, inf]], MAX_MIN, [True, True]),
    # a NaN row is never on the front and does not hide the others
    ([[nan, 0], [1, 1], [0, 2]], MAX_MIN, [False, True, False]),
    ([[1, nan]], MAX_MIN, [False]),
    # one objective: only the maxima (all of them, if tied)
    ([[1], [3], [3], [2]], ("maximize",), [False, True, True, False]),
    ([[1], [3], [0]], ("minimize",), [False, False, True]),
    # three objectives
    ([[1, 1, 1], [1, 1, 2], [0, 0, 0]], ("maximize", "minimize", "minimize"),
     [True, False, True]),
]


@pytest.mark.parametrize(("values", "directions", "expected"), CASES)
def test_table(values, directions, expected) -> None:
    got = is_pareto_front(np.array(values, dtype=float), directions)
    assert got.dtype == bool
    assert got.tolist() == expected


def _brute_force(values: np.ndarray, directions) -> list[bool]:
    sign = np.array([-1 if d == "maximize" else 1 for d in directions])
    loss = values * sign
    out = []
    for i, a in enumerate(loss):
        if np.isnan(a).any():
            out.append(False)
            continue
        dominated = any(
            not np.isnan(b).any() and (b <= a).all() and (b < a).any()
            for j, b in enumerate(loss) if j != i
        )
        out.append(not dominated)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_matches_brute_force_on_random_points_with_ties(seed) -> None:
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 6, size=(300, 2)).astype(float)  # many ties and duplicates
    values[rng.random(300) < 0.05, 0] = nan
    directions = ("maximize", "minimize")
    assert is_pareto_front(values, directions).tolist() == _brute_force(values, directions)


def test_chunking_does_not_change_the_answer(monkeypatch) -> None:
    from dreams_nas.nas.search import pareto

    rng = np.random.default_rng(7)
    values = rng.integers(0, 9, size=(200, 3)).astype(float)
    directions = ("maximize", "minimize", "maximize")
    whole = is_pareto_front(values, directions)
    monkeypatch.setattr(pareto, "_CHUNK", 7)
    assert is_pareto_front(values, directions).tolist() == whole.tolist()
    assert whole.tolist() == _brute_force(values, directions)


def test_empty() -> None:
    assert is_pareto_front(np.zeros((0, 2)), MAX_MIN).shape == (0,)


@pytest.mark.parametrize(
    ("values", "directions", "match"),
    [
        ([[1, 2]], ("maximize",), r"1 direction\(s\) .* for 2 objective"),
        ([[1, 2]], ("maximize", "up"), r"direction 'up' is not one of"),
        (np.zeros((2, 2, 2)), MAX_MIN, r"must be a \(points, objectives\) array"),
    ],
)
def test_bad_input(values, directions, match) -> None:
    with pytest.raises(InputError, match=match):
        is_pareto_front(values, directions)
