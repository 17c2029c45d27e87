from __future__ import annotations

import math

import numpy as np
import pytest
from dreams_nas.supernet.core import pareto
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.pareto import is_pareto_front
from hypothesis import given, settings
from hypothesis import strategies as st

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


# --- property: the sort-and-sweep / blocked front is the brute-force O(n^2) one -----------
# Few distinct values (ties and duplicates everywhere), the infinities and NaN, and -0.0
# (equal to 0.0, so a duplicate under another bit pattern).
_VALUE = st.sampled_from([0.0, -0.0, 1.0, 2.0, 2.5, -1.0, inf, -inf, nan])
_DIRECTION = st.sampled_from(("maximize", "minimize"))


@st.composite
def _problems(draw, max_objectives: int = 4):
    m = draw(st.integers(1, max_objectives))
    n = draw(st.integers(0, 40))
    flat = draw(st.lists(_VALUE, min_size=n * m, max_size=n * m))
    values = np.array(flat, dtype=np.float64).reshape(n, m)
    if n and draw(st.booleans()):  # exact duplicates of whole rows
        picks = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n))
        values = np.concatenate([values, values[picks]])
    directions = tuple(draw(st.lists(_DIRECTION, min_size=m, max_size=m)))
    return values, directions


@settings(max_examples=400, deadline=None)
@given(_problems())
def test_property_equals_brute_force(problem) -> None:
    values, directions = problem
    got = is_pareto_front(values, directions)
    assert got.dtype == bool and got.shape == (len(values),)
    assert got.tolist() == _brute_force(values, directions)


@settings(max_examples=150, deadline=None)
@given(_problems(max_objectives=4), st.integers(1, 5))
def test_property_blocks_do_not_change_the_answer(problem, chunk) -> None:
    # The k > 2 filter in blocks smaller than the input: every block boundary is exercised.
    values, directions = problem
    old = pareto._CHUNK
    pareto._CHUNK = chunk
    try:
        got = is_pareto_front(values, directions)
    finally:
        pareto._CHUNK = old
    assert got.tolist() == _brute_force(values, directions)


def test_property_is_invariant_to_row_order() -> None:
    # The sweep sorts; the mask must come back in the caller's order.
    rng = np.random.default_rng(3)
    values = rng.integers(0, 4, size=(500, 2)).astype(float)
    perm = rng.permutation(500)
    assert (is_pareto_front(values[perm], MAX_MIN).tolist()
            == is_pareto_front(values, MAX_MIN)[perm].tolist())


def test_two_objectives_scale_like_n_log_n() -> None:
    # 10^5 points would take the old pairwise filter about 7 min; the sweep well under 1 s.
    import time

    rng = np.random.default_rng(0)
    values = rng.random((100_000, 2))
    start = time.perf_counter()
    mask = is_pareto_front(values, MAX_MIN)
    assert time.perf_counter() - start < 5.0
    # the front of (max x, min y): x above the running max of every cheaper point
    order = np.argsort(values[:, 1])
    best = np.maximum.accumulate(values[order, 0])
    expected = np.zeros(len(values), dtype=bool)
    expected[order] = values[order, 0] >= best
    assert mask.tolist() == expected.tolist()
