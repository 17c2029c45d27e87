"""The target's steps read from their own measurements (latency/model/target_table.py)."""

from __future__ import annotations

import numpy as np
import pytest
from dreams_nas.latency.model.target_table import TargetTable
from dreams_nas.supernet.core.errors import InputError


def _table(rows: list[tuple[int, int, float]], kind: str = "verify") -> TargetTable:
    X = np.array([(c, k) for c, k, _ in rows], dtype=float)
    return TargetTable(kind=kind).fit(X, np.array([ms for *_, ms in rows]))


def _at(table: TargetTable, context: float, k: int) -> float:
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


# --- the surface, chosen when it predicts left-out rows clearly better --------------------------
def _cost(context: float, k: int) -> float:
    return 3.0 + 0.3 * k + 0.002 * context + 0.0002 * k * context


def _noisy_grid(noise: float, seed: int = 0, cost=_cost) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = np.array([(c, k) for c in (45, 62, 80, 98, 115) for k in range(2, 9)], dtype=float)
    y = np.array([cost(c, int(k)) for c, k in X]) * np.exp(rng.normal(0, noise, len(X)))
    return X, y


def test_noisy_rows_of_the_cost_shape_are_predicted_by_the_surface() -> None:
    """At the noise of a shared 2-vCPU VM (10 % per row) the table passes every row's noise on;
    the surface, fitted to all rows, lands nearer the true cost, and leave-one-out says so."""
    X, y = _noisy_grid(noise=0.10)
    model = TargetTable().fit(X, y)
    assert model.choice_ == "surface"
    assert model.loo_["surface"] < 0.9 * model.loo_["interpolated"]
    truth = np.array([_cost(c, int(k)) for c, k in X])
    table = TargetTable().fit_table(X, y)
    surface_error = np.mean(np.abs(model.predict(X) - truth) / truth)
    table_error = np.mean(np.abs(table.predict(X) - truth) / truth)
    assert surface_error < 0.6 * table_error
    # a verify over one more position costs its small per-position part, not the noise between
    # two rows: the step the search's choice of draft_len turns on
    step = _at(model, 62, 8) - _at(model, 62, 7)
    assert step == pytest.approx(0.3 + 0.0002 * 62, abs=0.15)


def test_precise_rows_with_a_step_keep_the_table() -> None:
    """A GPU-like cost, flat in k up to a tile boundary and 60 % dearer past it, measured to
    0.5 %: the surface cannot bend there, the table can, and leave-one-out keeps the table."""
    def tiled(context: float, k: int) -> float:
        return (4.0 + 0.001 * context) * (1.6 if k > 5 else 1.0)

    X, y = _noisy_grid(noise=0.005, cost=tiled)
    model = TargetTable().fit(X, y)
    assert model.choice_ == "interpolated"
    assert _at(model, 80, 6) == pytest.approx(tiled(80, 6), rel=0.02)


def test_the_surface_still_refuses_a_k_never_profiled() -> None:
    X, y = _noisy_grid(noise=0.10)
    model = TargetTable().fit(X, y)
    assert model.choice_ == "surface"
    with pytest.raises(InputError, match="k=12 positions was not profiled"):
        _at(model, 80, 12)


def test_too_few_rows_to_score_a_surface_keep_the_table() -> None:
    X = np.array([(100, 2), (200, 2), (100, 3), (200, 3)], dtype=float)
    model = TargetTable().fit(X, np.array([4.0, 5.0, 4.5, 5.5]))
    assert model.choice_ == "interpolated" and model.loo_ == {}
