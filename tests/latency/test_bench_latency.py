"""benchmarks/bench_latency.py: its 30 % / 70 % split, fit and per-kind metrics, on synthetic
profile rows (nothing is timed)."""

from __future__ import annotations

import bench_latency
import numpy as np
import pytest
from _support.profiles import DEPTHS, HEADS, KEEPS, VISUAL_TOKENS, linear_profile_rows
from dreams_nas.latency.kinds import DRAFT_KINDS
from dreams_nas.latency.measure.plan import build_plan
from dreams_nas.latency.model.validation import METRIC_KINDS, grid_groups, metric_kinds
from dreams_nas.supernet.core.space import SearchSpace

CONTEXTS = (100, 200, 300, 400, 500)


def _plan_points(fraction: float, seed: int) -> set[tuple]:
    """The draft points `dreams-nas profile --budget fraction` plans for the synthetic grid's
    space (any inject_layer and draft_len: they do not change what is timed)."""
    space = SearchSpace(heads=HEADS, visual_keep=KEEPS, inject_layer=(1, 2),
                        draft_len=(1, 2, 3), depth=DEPTHS)
    return {(k.spec.heads, round(k.spec.visual_keep, 6), k.spec.depth, round(k.spec.mlp, 6),
             round(k.spec.draft_vocab, 6), k.context_len)
            for k in build_plan(space, CONTEXTS, budget=fraction, seed=seed)
            if k.kind == "draft" and k.k == 1}


@pytest.mark.parametrize("tree_holdout", [0.0, 0.5])
@pytest.mark.parametrize("seed", range(3))
def test_the_split_keeps_grid_points_whole_and_every_target_k_fitted(seed, tree_holdout) -> None:
    rows = linear_profile_rows(CONTEXTS)
    train = bench_latency.training_mask(rows, 0.3, seed, tree_holdout)
    groups = grid_groups(rows)
    assert not set(groups[train]) & set(groups[~train])  # no grid point on both sides

    drafted = rows.kind.isin(DRAFT_KINDS).to_numpy()
    points = bench_latency.draft_points(rows[drafted])
    fitted = {p for p, t in zip(points, train[drafted], strict=True) if t}
    planned = _plan_points(0.3, seed)
    levels = metric_kinds(rows) == "draft_tree"
    if tree_holdout == 0:
        assert fitted == planned  # exactly the points `--budget 0.3` times
        assert train[levels].all()  # the plan always times the extremes' tree levels
    else:
        held = planned - fitted
        assert fitted <= planned and held
        assert (~train[levels]).any()
        # only tree-level points move, never a context end: each extreme keeps >= 2 contexts
        level_points = set(bench_latency.draft_points(rows[levels]))
        assert held <= level_points
        assert all(p[-1] not in (CONTEXTS[0], CONTEXTS[-1]) for p in held)

    target = rows[~drafted].assign(train=train[~drafted])
    for (kind, k), sub in target.groupby(["kind", "k"]):
        contexts = set(sub.loc[sub.train, "context_len"])
        assert len(contexts) >= 2, (kind, k)  # interpolated per k: never refused
        assert (~sub.train).any(), (kind, k)  # and some of them predicted
    # verify and verify_tree share k = 4 and 7 and every context: split apart, each kept
    assert {("verify", 4), ("verify_tree", 4), ("verify_tree", 7), ("decode", 1)} <= set(
        target.groupby(["kind", "k"]).groups)


def test_fit_and_metrics_per_kind_on_the_predicted_rows() -> None:
    rows = linear_profile_rows(CONTEXTS)
    train = bench_latency.training_mask(rows, 0.3, 0, tree_holdout=0.5)
    pred, report = bench_latency.evaluate(rows, train, "synthetic", stat="median_ms",
                                          visual_tokens=VISUAL_TOKENS, seed=0)
    kinds = metric_kinds(rows)
    assert list(report) == ["overall", *METRIC_KINDS]  # every kind, pooled first
    assert report["overall"]["n"] == int((~train).sum())
    for name in METRIC_KINDS:
        m = report[name]
        assert m["n"] == int((~train & (kinds == name)).sum()) > 0
        assert {"mape", "within_10pct", "kendall_tau", "rmse"} <= set(m)
    # costs exactly linear in the context: the per-kind models recover them
    assert report["overall"]["mape"] < 0.02
    assert report["overall"]["within_10pct"] == 1.0
    # the largest verify k is predicted, not refused: its contexts were kept for training
    assert pred.target_ms("verify", [8], 250)[0] > pred.target_ms("verify", [2], 250)[0]

    lines = bench_latency.report_lines(rows, train, "median_ms", report)
    assert [line.split()[0] for line in lines[1:]] == ["overall", *METRIC_KINDS]
    summary = bench_latency.split_summary(rows, train)
    assert summary["train_rows"] + summary["holdout_rows"] == len(rows)
    # 2 contexts per kind and k: decode, 7 verify, 2 verify_tree, 3 cycle, 2 cycle_tree
    assert summary["target_points_train"] == 2 * (1 + 7 + 2 + 3 + 2)


def test_without_tree_holdout_draft_tree_is_reported_as_fitted_only() -> None:
    rows = linear_profile_rows(CONTEXTS, noise=0.02, seed=1)
    train = bench_latency.training_mask(rows, 0.3, 1)
    _, report = bench_latency.evaluate(rows, train, "synthetic", visual_tokens=VISUAL_TOKENS)
    assert "draft_tree" not in report
    assert set(report) == {"overall", *(set(METRIC_KINDS) - {"draft_tree"})}
    lines = bench_latency.report_lines(rows, train, "median_ms", report)
    assert any(line.startswith("draft_tree") and "all 20 rows in training" in line
               for line in lines)
    assert np.isfinite(report["verify"]["kendall_tau"])


def test_bad_fractions_are_refused_before_anything_is_timed() -> None:
    with pytest.raises(SystemExit):
        bench_latency.main(["--train-fraction", "1.5"])
    with pytest.raises(SystemExit):
        bench_latency.main(["--tree-holdout", "1"])
