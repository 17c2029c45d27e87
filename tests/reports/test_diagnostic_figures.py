"""The diagnostic figures' layout. The predictor's parity figure: a profile of a space with
trees and elastic depth has eight step kinds and a long regressor description; the figure keeps
them beside the plot (inside the axes they collapsed the layout), and tree levels' draft rows
are coloured as `metrics_by_kind` counts them. The verified subnets' labels keep apart when
points are close."""

from __future__ import annotations

import dataclasses
import io
import json
import warnings
from pathlib import Path

import matplotlib
from dreams_nas.reports import build_report_data
from dreams_nas.reports.diagnostic_figures import label_offsets, parity_figure, parity_summary
from dreams_nas.reports.diagnostics import holdout_kind, load_predictor
from dreams_nas.reports.figures import STYLE
from dreams_nas.reports.values import HoldoutPoint, KindAccuracy, PredictorInfo
from dreams_nas.supernet.core.runfolder import RunFolder
from hypothesis import given
from hypothesis import strategies as st

from .fixtures import CPU, make_run

KINDS = ("cycle", "cycle_tree", "decode", "draft", "draft_first", "draft_tree", "verify",
         "verify_tree")
REGRESSOR = ("draft linear, draft_first linear; target steps decode interpolated, verify "
             "interpolated, verify_tree surface, cycle surface, cycle_tree surface")


def _eight_kinds() -> PredictorInfo:
    points = tuple(HoldoutPoint(kind, None, 0.8 * (i + 1) * (1 + j / 10),
                                0.8 * (i + 1) * (1 + j / 9))
                   for i, kind in enumerate(KINDS) for j in range(4))
    accuracy = tuple(KindAccuracy(kind, 4, 0.1, 0.6, 0.5) for kind in KINDS)
    return PredictorInfo(REGRESSOR, 0.084, None, 0.72, 0.883, 200, len(points), points,
                         accuracy)


def test_eight_kinds_and_a_long_regressor_lay_out(tmp_path: Path) -> None:
    data = dataclasses.replace(build_report_data(make_run(tmp_path / "run")),
                               predictor=_eight_kinds())
    with matplotlib.rc_context(STYLE):
        fig = parity_figure(data)
        assert fig is not None
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "constrained_layout not applied ..." fails here
            fig.savefig(io.BytesIO(), format="png", dpi=80)
    plot = fig.axes[0]
    width, height = plot.get_window_extent().width, plot.get_window_extent().height
    assert width > 150 and height > 150  # the plot keeps its room
    labels = plot.get_legend_handles_labels()[1]
    assert set(labels) == {"±10%", *KINDS}
    text = parity_summary(data)
    assert all(len(line) <= 60 for line in text.splitlines())
    assert "draft_tree (4): MAPE 10.0%" in text and "Kendall τ 0.883" in text


def test_a_tree_levels_draft_rows_are_labelled_draft_tree(tmp_path: Path) -> None:
    assert holdout_kind({"kind": "draft", "k": 3}) == "draft_tree"
    assert holdout_kind({"kind": "draft", "k": 1}) == "draft"
    assert holdout_kind({"kind": "verify", "k": 5}) == "verify"
    run = make_run(tmp_path / "run")
    path = run / "latency" / CPU.hardware_id / "predictor.json"
    raw = json.loads(path.read_text())
    raw["holdout"].append({"kind": "draft", "spec_id": raw["holdout"][0]["spec_id"],
                           "context_len": 640, "k": 3, "measured_ms": 1.0,
                           "predicted_ms": 1.1})
    path.write_text(json.dumps(raw))
    pred = load_predictor(RunFolder(run), CPU.hardware_id)
    assert pred is not None and pred.holdout[-1].kind == "draft_tree"


def test_labels_of_close_points_spread_around_them() -> None:
    assert label_offsets([100.0], gap=10.0) == [0.0]
    assert label_offsets([5.0, 0.0], gap=10.0) == [2.5, -2.5]  # a pair 5 apart: 10 apart
    assert label_offsets([0.0, 1.0, 2.0, 50.0], gap=10.0) == [-9.0, 0.0, 9.0, 0.0]


@given(st.lists(st.floats(0, 300), min_size=1, max_size=12))
def test_labels_keep_the_gap(heights: list[float]) -> None:
    offsets = label_offsets(heights, gap=10.0)
    placed = sorted(h + o for h, o in zip(heights, offsets, strict=True))
    assert all(b - a >= 10.0 - 1e-6 for a, b in zip(placed, placed[1:], strict=False))
    assert all(abs(o) <= 10.0 * len(heights) for o in offsets)  # near their own points
