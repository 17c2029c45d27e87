"""The target's steps read from their own measurements (latency/target_steps.py)."""

from __future__ import annotations

import numpy as np
import pytest
from dreams_nas.latency.target_steps import TargetStepTable
from dreams_nas.supernet.core.errors import InputError


def _table(rows: list[tuple[int, int, float]], kind: str = "verify") -> TargetStepTable:
    X = np.array([(c, k) for c, k, _ in rows], dtype=float)
    return TargetStepTable(kind=kind).fit(X, np.array([ms for *_, ms in rows]))


def _at(table: TargetStepTable, context: float, k: int) -> float:
    return float(table.predict(np.array([[context, k]], dtype=float))[0])


def test_inside_the_range_it_interpolates_piecewise_linearly() -> None:
    # a step in the cost between 200 and 300 (a GPU tile boundary, say): no line fits it
    table = _table([(100, 2, 5.0), (200, 2, 6.0), (300, 2, 9.0), (400, 2, 10.0)])
    assert _at(table, 200, 2) == 6.0  # a measured point is its measurement
    assert _at(table, 150, 2) == pytest.approx(5.5)
    assert _at(table, 250, 2) == pytest.approx(7.5)
    assert _at(table, 375, 2) == pytest.approx(9.75)


def test_beyond_the_range_it_follows_that_ks_least_squares_line() -> None:
    rows = [(c, 3, 2.0 + 0.01 * c + (0.05 if c == 200 else 0.0)) for c in (100, 200, 300)]
    table = _table(rows)
    slope, intercept = np.polyfit([100, 200, 300], [r[2] for r in rows], 1)
    for context in (50, 1000, 5000):
        assert _at(table, context, 3) == pytest.approx(intercept + slope * context)
    # never below a tenth of the cheapest measurement of that k (a line could cross zero)
    falling = _table([(100, 2, 5.0), (200, 2, 3.0)])
    assert _at(falling, 10_000, 2) == pytest.approx(0.3)


def test_a_k_between_measured_ks_is_linear_in_k_and_beyond_them_refused() -> None:
    rows = [(c, k, 1.0 + 0.5 * k + 0.01 * c) for c in (100, 200) for k in (2, 4, 8)]
    table = _table(rows)
    assert _at(table, 150, 3) == pytest.approx(1.0 + 1.5 + 1.5)
    assert _at(table, 150, 6) == pytest.approx(1.0 + 3.0 + 1.5)
    assert table.k_range() == (2, 8)
    for k in (1, 9):
        with pytest.raises(InputError, match=rf"a verify step over k={k} positions was not "
                                              r"profiled \(profiled: k 2\.\.8\) and is not "
                                              r"extrapolated; rerun `dreams-nas profile`"):
            _at(table, 150, k)


def test_rows_of_one_point_timed_twice_are_averaged_and_one_context_is_flat() -> None:
    """Profiles of one hardware id from several machines merge by concatenation."""
    table = _table([(100, 1, 4.0), (100, 1, 6.0)], kind="decode")
    assert _at(table, 100, 1) == 5.0
    assert _at(table, 300, 1) == 5.0  # one context: nothing says how it scales
    with pytest.raises(ValueError, match="decode milliseconds must be positive"):
        _table([(100, 1, 0.0)], kind="decode")
