"""What every figure of the report shares: the style, the encodings, and the drawing of subnets.

matplotlib without pyplot and without global state: figures are built as `Figure` objects and
drawn under `matplotlib.rc_context(STYLE)`. Encodings are the same in every subnet plot:
colour = visual_keep, marker = heads, the search's Pareto front drawn solid with a dark edge,
everything else faint, the best subnet a red star.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import matplotlib
import numpy as np
from dreams_nas.reports.subnets import SubnetTable
from dreams_nas.reports.values import ReportData
from dreams_nas.supernet.core.pareto import is_pareto_front
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

HEAD_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h", "p", "<", ">")
BEST_COLOR = "#d62728"
FRONT_EDGE = "#1a1a1a"
INFEASIBLE = "#b0b0b0"
# Above this many subnets the ones off the front are drawn as a density, not as points.
DENSE_ABOVE = 3000
DENSITY_GRID = 48
LEGEND_KEYS = 6  # dense figures: at most this many colour keys and this many marker keys
# A plotted figure of the subnets: given a Subnet its value (None when unknown), given a
# SubnetTable the same figure's column (NaN when unknown). E.g. `lambda s: s.draft_ms`.
Axis = Callable[[Any], Any]
STYLE = {
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Helvetica", "Arial", "sans-serif"],
    "font.size": 9.5,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e4e4e4",
    "grid.linewidth": 0.7,
    "legend.fontsize": 8.5,
    "legend.frameon": False,
    "svg.fonttype": "none",      # real <text>: small, crisp, searchable in the page
    "svg.image_inline": True,
}


def keep_colors(values: Sequence[float]) -> dict[float, tuple[float, float, float, float]]:
    cmap = matplotlib.colormaps["viridis"]
    keys = sorted(set(values))
    if len(keys) == 1:
        return {keys[0]: cmap(0.45)}
    return {k: cmap(0.08 + 0.82 * i / (len(keys) - 1)) for i, k in enumerate(keys)}


def head_markers(values: Sequence[int]) -> dict[int, str]:
    return {h: HEAD_MARKERS[i % len(HEAD_MARKERS)] for i, h in enumerate(sorted(set(values)))}


def _encodings(data: ReportData) -> tuple[dict, dict]:
    """Colour by visual_keep and marker by heads, over every subnet's values."""
    cols = data.columns
    return (keep_colors(np.unique(cols.visual_keep).tolist()),
            head_markers(np.unique(cols.heads).tolist()))


def _some(keys: dict, most: int = LEGEND_KEYS) -> dict:
    """At most `most` of `keys`, evenly spread from the first to the last."""
    if len(keys) <= most:
        return keys
    items = list(keys.items())
    picks = sorted({round(i * (len(items) - 1) / (most - 1)) for i in range(most)})
    return dict(items[i] for i in picks)


def column(axis: Axis, table: SubnetTable) -> np.ndarray:
    """An axis's values for every row of `table`, NaN where unknown."""
    return np.asarray(axis(table), dtype=np.float64)


def encoding_legend(ax, data: ReportData, best: bool = True) -> None:
    """Colour and marker keys, outside the axes on the right so no point hides behind them.

    Above DENSE_ABOVE subnets only the front is drawn as points: the keys are the front's."""
    colors, markers = _encodings(data)
    title = "colour: visual_keep\nmarker: heads"
    if len(data.subnets) > DENSE_ABOVE:
        colors = _some({k: c for k, c in colors.items()
                        if k in {s.visual_keep for s in data.front}})
        markers = _some({h: m for h, m in markers.items() if h in {s.heads for s in data.front}})
        title = "colour: visual_keep\nmarker: heads\n(values on the front;\na few when many)"
    handles = [Line2D([], [], ls="", marker="s", ms=7, color=c, label=f"keep {k:g}")
               for k, c in colors.items()]
    handles += [Line2D([], [], ls="", marker=m, ms=6, mfc="white", mec="#444",
                       label=f"{h} head{'' if h == 1 else 's'}") for h, m in markers.items()]
    handles += [Line2D([], [], ls="", marker="o", ms=6, mfc="#bbb", mec=FRONT_EDGE, mew=1.2,
                       label="Pareto front")]
    if best:
        handles += [Line2D([], [], ls="", marker="*", ms=12, mfc=BEST_COLOR, mec="white",
                           label="best")]
    if not data.columns.feasible.all() and len(data.subnets) <= DENSE_ABOVE:
        handles += [Line2D([], [], ls="", marker="x", ms=6, color=INFEASIBLE,
                           label="infeasible (constraint)")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), handletextpad=0.3,
              borderaxespad=0.0, title=title, title_fontsize=8.5,
              alignment="left")


def scatter_subnets(ax, data: ReportData, x: Axis, y: Axis) -> None:
    """All subnets faint, the front solid with a dark edge, the best as a red star.

    Subnets that break the search's constraint (feasible = 0, e.g. over --max-draft-ms) are grey
    crosses: they were evaluated but could not be picked.
    """
    colors, markers = _encodings(data)
    if len(data.subnets) > DENSE_ABOVE:
        _density(ax, data, x, y)
        _front_and_best(ax, data, x, y, colors, markers)
        return
    bad = [(x(s), y(s)) for s in data.subnets
           if not s.feasible and x(s) is not None and y(s) is not None]
    if bad:
        ax.scatter(*zip(*bad, strict=True), s=18, marker="x", color=INFEASIBLE, linewidths=0.9,
                   zorder=2)
    for front in (False, True):
        for (heads, keep) in sorted({(s.heads, s.visual_keep) for s in data.subnets}):
            pts = [(x(s), y(s)) for s in data.subnets
                   if s.on_front == front and s.heads == heads and s.visual_keep == keep
                   and (s.feasible or s.on_front) and x(s) is not None and y(s) is not None]
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            if front:
                ax.scatter(xs, ys, s=58, marker=markers[heads], color=colors[keep],
                           edgecolors=FRONT_EDGE, linewidths=1.1, zorder=4)
            else:
                ax.scatter(xs, ys, s=22, marker=markers[heads], color=colors[keep], alpha=0.28,
                           linewidths=0, zorder=2)
    _best_star(ax, data, x, y)


def _best_star(ax, data: ReportData, x: Axis, y: Axis) -> None:
    """The best subnet as a red star, over everything else."""
    best = data.best_subnet
    if best is not None and x(best) is not None and y(best) is not None:
        ax.scatter([x(best)], [y(best)], s=340, marker="*", color=BEST_COLOR,
                   edgecolors="white", linewidths=1.0, zorder=6)


def _density(ax, data: ReportData, x: Axis, y: Axis) -> None:
    """Every subnet off the front as a 2-D histogram (hexagons, log count): past a few
    thousand points a scatter is a blot and an inline SVG of them weighs megabytes."""
    cols = data.columns
    xs, ys = column(x, cols), column(y, cols)
    keep = ~cols.on_front & np.isfinite(xs) & np.isfinite(ys)
    if not keep.any():
        return
    cells = ax.hexbin(xs[keep], ys[keep], gridsize=DENSITY_GRID, bins="log", mincnt=1,
                      cmap="Greys", linewidths=0, zorder=1)
    ax.figure.colorbar(cells, ax=ax, pad=0.01, fraction=0.04, label="subnets per cell")


def _front_and_best(ax, data: ReportData, x: Axis, y: Axis, colors: dict, markers: dict
                    ) -> None:
    """The front's points (solid, dark edge) and the best (red star) over the density."""
    groups: dict[tuple[int, float], list[tuple[float, float]]] = {}
    for s in data.front:
        if x(s) is not None and y(s) is not None:
            groups.setdefault((s.heads, s.visual_keep), []).append((x(s), y(s)))
    for (heads, keep), pts in groups.items():
        xs, ys = zip(*pts, strict=True)
        ax.scatter(xs, ys, s=58, marker=markers[heads], color=colors[keep],
                   edgecolors=FRONT_EDGE, linewidths=1.1, zorder=4)
    _best_star(ax, data, x, y)


def frontier(ax, data: ReportData, x: Axis, y: Axis) -> None:
    """Staircase through the points not dominated in these two axes (max y, min x)."""
    cols = data.columns
    xs, ys = column(x, cols), column(y, cols)
    keep = cols.feasible & ~np.isnan(xs) & ~np.isnan(ys)
    if keep.sum() < 2:
        return
    xs, ys = xs[keep], ys[keep]
    on = is_pareto_front(np.column_stack([ys, xs]), ("maximize", "minimize"))
    front = sorted(set(zip(xs[on].tolist(), ys[on].tolist(), strict=True)))
    fx, fy = zip(*front, strict=True)
    ax.step(fx, fy, where="post", color="#555", lw=1.0, ls="--", zorder=3, alpha=0.8)


def baseline(ax, data: ReportData) -> None:
    """The 1x line (target alone), when the speedups come near enough for it to be useful."""
    if float(data.columns.speedup.min()) > 1.3:
        return
    ax.axhline(1.0, color="#888", lw=0.9, ls=":", zorder=1)
    ax.annotate("target alone (1×)", xy=(0.0, 1.0), xycoords=("axes fraction", "data"),
                xytext=(3, 3), textcoords="offset points", ha="left", va="bottom",
                fontsize=8, color="#777")


def mark_best(ax, data: ReportData, x: float | None, y: float | None,
              others: Sequence[tuple[float, float, float]] = ()) -> None:
    """Label the best subnet's star where it hides the least: `others` are (x, y, weight)."""
    if x is None or y is None:
        return
    fig = ax.figure
    to_px = ax.transData.transform
    bx, by = to_px((x, y))
    pts = [(*to_px((px, py)), wt) for px, py, wt in others]
    scale = fig.dpi / 72.0
    w, h = 175 * scale, 34 * scale        # the two-line label's size, with a margin
    x0, y0 = to_px((ax.get_xlim()[0], ax.get_ylim()[0]))
    x1, y1 = to_px((ax.get_xlim()[1], ax.get_ylim()[1]))
    best_choice, best_cost = None, None
    for dx, dy in ((-18, -18), (18, -18), (-18, -60), (18, -60), (-18, 18), (18, 18)):
        left = bx + dx * scale - (w if dx < 0 else 0)
        top = by + dy * scale + (h if dy > 0 else 0)
        box = (left, top - h, left + w, top)
        inside = box[0] >= x0 and box[2] <= x1 and box[1] >= y0 and box[3] <= y1
        covered = sum(wt for px, py, wt in pts
                      if box[0] <= px <= box[2] and box[1] <= py <= box[3])
        cost = covered + (0 if inside else 1000)
        if best_cost is None or cost < best_cost:
            best_choice, best_cost = (dx, dy), cost
    dx, dy = best_choice
    ax.annotate(f"best {data.best.spec_id}\n{data.best.predicted_speedup:.2f}× predicted",
                xy=(x, y), xytext=(dx, dy), textcoords="offset points",
                ha="right" if dx < 0 else "left", va="top" if dy < 0 else "bottom", fontsize=9,
                fontweight="bold", color=BEST_COLOR, zorder=7,
                bbox={"boxstyle": "round,pad=0.25", "fc": "white", "ec": "none", "alpha": 0.85},
                arrowprops={"arrowstyle": "-", "color": BEST_COLOR, "lw": 0.8})


def make_axes(width: float = 6.4, height: float = 4.0) -> tuple[Figure, object]:
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()

