"""Grid-point groups, the grouped hold-out split, grouped CV folds and metrics per kind
(latency/model/validation.py, latency/model/draft_regression.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from _support.profiles import VISUAL_TOKENS, linear_profile_rows
from dreams_nas.latency.model.draft_regression import CVSelectedRegressor, DraftFeatures
from dreams_nas.latency.model.validation import (
    grid_groups,
    holdout_split,
    metric_kinds,
    metrics_by_kind,
)
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.linear_model import LinearRegression


def test_a_grid_point_is_an_architecture_at_one_context() -> None:
    rows = linear_profile_rows([100, 200])
    groups = grid_groups(rows)
    drafts = rows.kind.isin(["draft", "draft_first"]).to_numpy()
    # every draft kind and tree width of one (heads, visual_keep, depth, mlp, context): one
    point = rows[drafts].groupby(["heads", "visual_keep", "depth", "mlp", "context_len"])
    assert all(len(set(groups[drafts][idx])) == 1 for idx in point.indices.values())
    assert len(set(groups[drafts])) == point.ngroups
    assert groups[0] == "arch h1 v0.25 d1 m1 n1 @ 100"
    target = groups[~drafts]
    assert len(set(target)) == len(target)  # each target step is its own point
    assert "verify k5 @ 200" in set(target)
    # rows without depth and mlp (profiled before them) are depth 1, mlp 1
    old = rows[drafts].drop(columns=["depth", "mlp"]).head(1)
    assert grid_groups(old)[0] == "arch h1 v0.25 d1 m1 n1 @ 100"


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("fraction", [0.2, 0.5])
def test_the_hold_out_never_splits_a_grid_point(seed, fraction) -> None:
    rows = linear_profile_rows([100, 150, 200, 250, 300])
    train, hold = holdout_split(rows, fraction, seed)
    assert (train ^ hold).all() and hold.any()
    groups = grid_groups(rows)
    # no grid point on both sides: a held-out draft_first row's draft row is held out too
    assert not set(groups[train]) & set(groups[hold])
    kinds = rows.kind.to_numpy()
    for point in set(groups[hold]):
        here = groups == point
        if "draft_first" in set(kinds[here]):
            assert "draft" in set(kinds[here]) and hold[here].all()
    # every target (kind, k) keeps at least two contexts to learn from; draft too
    kept = rows[train]
    for (kind, k), sub in kept[~kept.kind.isin(["draft", "draft_first"])].groupby(["kind", "k"]):
        assert sub.context_len.nunique() >= 2, (kind, k)
    assert (kept.kind == "draft_first").any() and ((kept.kind == "draft") & (kept.k > 1)).any()
    # the share of points held out is the one asked for, within each stratum's rounding
    share = len(set(groups[hold])) / len(set(groups))
    assert share == pytest.approx(fraction, abs=0.1)


def test_a_holdout_keeps_strata_too_small_to_split() -> None:
    rows = linear_profile_rows([100, 200])  # two contexts: every target k has two points
    train, hold = holdout_split(rows, 0.5, seed=0)
    target = ~rows.kind.isin(["draft", "draft_first"]).to_numpy()
    assert not hold[target].any()
    with pytest.raises(ValueError, match="holdout fraction 1.0 must be in"):
        holdout_split(rows, 1.0, 0)


class _Recorder(RegressorMixin, BaseEstimator):
    """A linear regression that records the rows it is fitted on and asked about."""

    log: list = []

    def fit(self, X, y):
        self.model_ = LinearRegression().fit(X, y)
        _Recorder.log.append(("fit", X.copy()))
        return self

    def predict(self, X):
        _Recorder.log.append(("predict", X.copy()))
        return self.model_.predict(X)


def test_cross_validation_folds_never_split_a_grid_point() -> None:
    """A draft point's hot step and its tree levels (one group) stay in one fold."""
    rows = linear_profile_rows([100, 200, 300])
    drafts = rows[rows.kind == "draft"]
    X = DraftFeatures(VISUAL_TOKENS).fit(drafts).transform(drafts)
    groups = grid_groups(drafts)
    point_of = {tuple(x): g for x, g in zip(X, groups, strict=True)}
    _Recorder.log = []
    selector = CVSelectedRegressor([("a", _Recorder()), ("b", LinearRegression())], cv=4,
                                   error="relative_rmse")
    selector.fit(X, drafts["median_ms"], groups=groups)
    fits = [x for what, x in _Recorder.log if what == "fit"]
    tests = [x for what, x in _Recorder.log if what == "predict"]
    assert len(tests) == 4  # one per fold (the refit on all rows predicts nothing)
    for fitted, tested in zip(fits, tests, strict=False):
        seen = {point_of[tuple(x)] for x in fitted}
        asked = {point_of[tuple(x)] for x in tested}
        assert asked and not seen & asked
    assert set(selector.cv_scores_) == {"a", "b"}
    with pytest.raises(ValueError, match="one group per row"):
        selector.fit(X, drafts["median_ms"], groups=groups[:-1])


def test_metrics_by_kind_has_every_held_out_kind_with_its_count() -> None:
    rows = linear_profile_rows([100, 200])
    measured = rows["median_ms"].to_numpy()
    predicted = measured * np.where(rows.kind == "verify", 1.2, 1.0)
    out = metrics_by_kind(rows, measured, predicted)
    labels = metric_kinds(rows)
    assert list(out) == ["draft", "draft_tree", "draft_first", "decode", "verify", "verify_tree",
                         "cycle", "cycle_tree"]
    for kind, m in out.items():
        assert m["n"] == int((labels == kind).sum())
    assert out["verify"]["mape"] == pytest.approx(0.2) and out["verify"]["within_10pct"] == 0
    assert out["draft"]["mape"] == 0 and out["decode"]["within_10pct"] == 1
    one = metrics_by_kind(rows.head(1), measured[:1], predicted[:1])
    assert np.isnan(one["draft"]["kendall_tau"]) and one["draft"]["n"] == 1
    assert metrics_by_kind(pd.DataFrame(rows.head(0)), [], []) == {}
