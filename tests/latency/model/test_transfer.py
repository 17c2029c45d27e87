"""Few-shot latency transfer on synthetic devices whose costs are known transformations of a
source's: the transfer must recover them from five measured steps it chooses itself."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from _support.profiles import linear_profile_rows
from dreams_nas.latency.model.transfer import (
    ENGINES,
    LatencyTransfer,
    choose_rows,
    leave_one_out,
)
from dreams_nas.latency.model.validation import metric_kinds
from scipy.stats import kendalltau

CONTEXTS = (40, 80, 160)


@pytest.fixture(scope="module")
def source() -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
    """(kinds, the source's prices, rows) of every kind of step at three contexts."""
    rows = linear_profile_rows(CONTEXTS)
    return metric_kinds(rows), rows["median_ms"].to_numpy(), rows


def _engine(kinds: np.ndarray, scales: dict[str, float]) -> np.ndarray:
    return np.array([scales[ENGINES[k]] for k in kinds])


def _transfer(kinds, x, y, n=5, sources=None):
    """Fit on the n steps `choose_rows` picks; every candidate's relative error."""
    prices = x if sources is None else sources
    pick = choose_rows(kinds, prices, n)
    model = LatencyTransfer.fit(kinds, prices, kinds[pick], prices[pick], y[pick])
    predicted = model.predict(kinds, prices)
    return np.abs(predicted - y) / y, predicted, model


@pytest.mark.parametrize("name", ["scale", "offset", "scale and offset", "fixed overhead",
                                  "engines", "engines and offset"])
def test_five_rows_recover_a_device_transformed_from_the_source(source, name) -> None:
    kinds, x, _ = source
    y = {"scale": 3.0 * x, "offset": x + 0.5,
         "fixed overhead": 0.3 * x + 4.0,  # a launch-bound device: the offset dominates
         "scale and offset": 0.5 * x + 0.7,
         "engines": x * _engine(kinds, {"draft": 0.5, "target": 2.0, "host": 1.0}),
         "engines and offset": x * _engine(kinds, {"draft": 0.7, "target": 1.6, "host": 1.0})
         + 0.2}[name]
    error, predicted, model = _transfer(kinds, x, y)
    assert model.n == 5
    # exact structure: a scale (and offset) on everything is recovered exactly; per engine,
    # with five rows over three engines, within a few per cent on every step of the grid
    exact = not name.startswith("engines")
    assert error.mean() < (0.005 if exact else 0.03), error.mean()
    assert error.max() < (0.02 if exact else 0.12), error.max()
    drafts = np.isin(kinds, ("draft", "draft_first"))
    assert kendalltau(y[drafts], predicted[drafts]).statistic > 0.95


def test_per_kind_scales_of_a_chain_space_from_two_rows_of_each_kind(source) -> None:
    """A chain-only space has five kinds of step, each here with its own scale. Five rows take
    one of each kind but cannot tell a kind's scale from its offset (an engine's can be: the
    test above); ten take two of each -- the cheapest and the dearest -- and recover them."""
    kinds, x, _ = source
    chain = np.isin(kinds, ("draft", "draft_first", "decode", "verify", "cycle"))
    kinds, x = kinds[chain], x[chain]
    scale = {"draft": 0.6, "draft_first": 0.9, "decode": 1.8, "verify": 1.4, "cycle": 1.1}
    y = x * np.array([scale[k] for k in kinds])
    assert sorted(kinds[choose_rows(kinds, x, 5)]) == sorted(scale)  # one step of each kind
    pick = choose_rows(kinds, x, 10)
    assert sorted(kinds[pick]) == sorted([*scale, *scale])
    error, _, _ = _transfer(kinds, x, y, n=10)
    assert error.max() < 0.05, error.max()
    assert _transfer(kinds, x, y, n=5)[0].mean() > 0.05  # what five rows leave open


def test_several_sources_blend(source) -> None:
    """A device that behaves like a mix of two profiled ones is priced from both."""
    kinds, x, _ = source
    other = x * _engine(kinds, {"draft": 0.4, "target": 3.0, "host": 0.8}) + 0.1
    y = 0.7 * x + 0.3 * other
    both = np.column_stack([x, other])
    error, _, model = _transfer(kinds, x, y, sources=both)
    assert error.mean() < 0.01 and error.max() < 0.05, (error.mean(), error.max())
    assert model.summary()["source_weights"][0] > 0 and len(model.summary()["source_weights"]) == 2


def test_noisy_measurements_keep_the_ranking(source) -> None:
    """Measurements 3 % noisy (a shared machine's p10s): ten rows still rank the draft steps."""
    kinds, x, _ = source
    y = x * _engine(kinds, {"draft": 0.8, "target": 0.6, "host": 1.0})
    rng = np.random.default_rng(0)
    pick = choose_rows(kinds, x, 10)
    noisy = y[pick] * np.exp(rng.normal(0.0, 0.03, len(pick)))
    predicted = LatencyTransfer.fit(kinds, x, kinds[pick], x[pick], noisy).predict(kinds, x)
    drafts = np.isin(kinds, ("draft", "draft_first"))
    assert np.mean(np.abs(predicted - y) / y) < 0.05
    assert kendalltau(y[drafts], predicted[drafts]).statistic > 0.9


def test_the_choice_spans_the_engines_and_is_repeatable(source) -> None:
    kinds, x, _ = source
    pick = choose_rows(kinds, x, 5)
    assert pick == choose_rows(kinds, x, 5) and len(set(pick)) == 5
    assert {ENGINES[k] for k in kinds[pick]} == {"draft", "target", "host"}
    # the extremes first: the cheapest step of the grid is among them
    assert int(np.argmin(x)) in choose_rows(kinds, x, 10)
    more = choose_rows(kinds, x, 3, taken=pick)
    assert len(more) == 3 and not set(more) & set(pick)
    # never a step excluded (one that failed on the device), no more than there are
    assert not set(choose_rows(kinds, x, 5, exclude=pick)) & set(pick)
    assert sorted(choose_rows(kinds[:4], x[:4], 10, taken=[0, 1])) == [2, 3]


def test_leave_one_out_and_bad_input(source) -> None:
    kinds, x, _ = source
    pick = choose_rows(kinds, x, 6)
    loo = leave_one_out(kinds, x, kinds[pick], x[pick], 2.0 * x[pick])
    assert np.allclose(loo, 2.0 * x[pick], rtol=1e-3)  # a pure scale: each left out is exact
    assert np.isnan(leave_one_out(kinds, x, kinds[:1], x[:1], x[:1])).all()
    with pytest.raises(ValueError, match="positive"):
        LatencyTransfer.fit(kinds, x, kinds[:2], np.array([1.0, -1.0]), [1.0, 1.0])
    from dreams_nas.supernet.core.errors import InputError

    with pytest.raises(InputError, match="positive measured"):
        LatencyTransfer.fit(kinds, x, kinds[:2], x[:2], [1.0, 0.0])


def test_the_terms_are_chosen_by_leave_one_out(source) -> None:
    """Terms the measurements cannot tell from noise are not fitted: a device that differs by a
    scale gets the global map alone, one whose engines differ gets the engines' terms, and the
    summary says which and why."""
    from dreams_nas.latency.model.transfer import select_levels

    kinds, x, _ = source
    pick = choose_rows(kinds, x, 10)
    rng = np.random.default_rng(1)
    noisy = 1.5 * x[pick] * np.exp(rng.normal(0.0, 0.03, len(pick)))
    assert select_levels(kinds, x, kinds[pick], x[pick], noisy)[0] == ("global",)
    y = x * _engine(kinds, {"draft": 0.5, "target": 2.0, "host": 1.0})
    levels, errors = select_levels(kinds, x, kinds[pick], x[pick], y[pick])
    assert "engine" in levels and errors["global"] > 5 * errors["global+engine"]
    model = LatencyTransfer.fit(kinds, x, kinds[pick], x[pick], y[pick])
    assert model.summary()["levels"] == list(levels) and "levels_loo" in model.summary()
    assert select_levels(kinds, x, kinds[:2], x[:2], x[:2])[0] == ("global",)  # too few to tell
