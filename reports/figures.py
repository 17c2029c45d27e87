"""Draw the report's figures from a `ReportData` (matplotlib, no pyplot, no global state).

Each figure function returns a `matplotlib.figure.Figure`, or None when the run lacks what it
shows (no Optuna history, one hardware id...). `render_figures` turns them into `RenderedFigure`
values: an inline SVG string for the page, and the figure itself for the PNG/SVG copies.
Encodings are the same in every subnet plot: colour = visual_keep, marker = heads, the search's
Pareto front drawn solid with a dark edge, everything else faint, the best subnet a red star.
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib
from dreams_nas.reports.data import pareto_mask
from dreams_nas.reports.values import ReportData, Subnet
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

HEAD_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h", "p", "<", ">")
BEST_COLOR = "#d62728"
FRONT_EDGE = "#1a1a1a"
INFEASIBLE = "#b0b0b0"
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


@dataclass(frozen=True)
class RenderedFigure:
    """One figure of the report."""

    name: str          # file stem of the static copies, e.g. "pareto_latency"
    title: str
    caption: str
    svg: str           # inline <svg> element (no XML prolog), scales with its container
    svg_file: str      # the standalone SVG document (the static copy)
    figure: Figure


# --- encodings ----------------------------------------------------------------------------
def _keep_colors(values: Sequence[float]) -> dict[float, tuple[float, float, float, float]]:
    cmap = matplotlib.colormaps["viridis"]
    keys = sorted(set(values))
    if len(keys) == 1:
        return {keys[0]: cmap(0.45)}
    return {k: cmap(0.08 + 0.82 * i / (len(keys) - 1)) for i, k in enumerate(keys)}


def _head_markers(values: Sequence[int]) -> dict[int, str]:
    return {h: HEAD_MARKERS[i % len(HEAD_MARKERS)] for i, h in enumerate(sorted(set(values)))}


def _encoding_legend(ax, data: ReportData, best: bool = True) -> None:
    """Colour and marker keys, outside the axes on the right so no point hides behind them."""
    colors = _keep_colors([s.visual_keep for s in data.subnets])
    markers = _head_markers([s.heads for s in data.subnets])
    handles = [Line2D([], [], ls="", marker="s", ms=7, color=c, label=f"keep {k:g}")
               for k, c in colors.items()]
    handles += [Line2D([], [], ls="", marker=m, ms=6, mfc="white", mec="#444",
                       label=f"{h} head{'' if h == 1 else 's'}") for h, m in markers.items()]
    handles += [Line2D([], [], ls="", marker="o", ms=6, mfc="#bbb", mec=FRONT_EDGE, mew=1.2,
                       label="Pareto front")]
    if best:
        handles += [Line2D([], [], ls="", marker="*", ms=12, mfc=BEST_COLOR, mec="white",
                           label="best")]
    if not all(s.feasible for s in data.subnets):
        handles += [Line2D([], [], ls="", marker="x", ms=6, color=INFEASIBLE,
                           label="infeasible (constraint)")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), handletextpad=0.3,
              borderaxespad=0.0, title="colour: visual_keep\nmarker: heads", title_fontsize=8.5,
              alignment="left")


def _scatter_subnets(ax, data: ReportData, x: Callable[[Subnet], float | None],
                     y: Callable[[Subnet], float | None]) -> None:
    """All subnets faint, the front solid with a dark edge, the best as a red star.

    Subnets that break the search's constraint (feasible = 0, e.g. over --max-draft-ms) are grey
    crosses: they were evaluated but could not be picked.
    """
    colors = _keep_colors([s.visual_keep for s in data.subnets])
    markers = _head_markers([s.heads for s in data.subnets])
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
    best = data.best_subnet
    if best is not None and x(best) is not None and y(best) is not None:
        ax.scatter([x(best)], [y(best)], s=340, marker="*", color=BEST_COLOR,
                   edgecolors="white", linewidths=1.0, zorder=6)


def _frontier(ax, data: ReportData, x: Callable[[Subnet], float | None],
              y: Callable[[Subnet], float | None]) -> None:
    """Staircase through the points not dominated in these two axes (max y, min x)."""
    pts = [(x(s), y(s)) for s in data.subnets if s.feasible and x(s) is not None and y(s) is not None]
    if len(pts) < 2:
        return
    mask = pareto_mask([p[1] for p in pts], [p[0] for p in pts])
    front = sorted({p for p, m in zip(pts, mask, strict=True) if m})
    xs, ys = zip(*front, strict=True)
    ax.step(xs, ys, where="post", color="#555", lw=1.0, ls="--", zorder=3, alpha=0.8)


def _baseline(ax, data: ReportData) -> None:
    """The 1x line (target alone), when the speedups come near enough for it to be useful."""
    if min(s.speedup for s in data.subnets) > 1.3:
        return
    ax.axhline(1.0, color="#888", lw=0.9, ls=":", zorder=1)
    ax.annotate("target alone (1×)", xy=(0.0, 1.0), xycoords=("axes fraction", "data"),
                xytext=(3, 3), textcoords="offset points", ha="left", va="bottom",
                fontsize=8, color="#777")


def _mark_best(ax, data: ReportData, x: float | None, y: float | None,
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


def _new(width: float = 6.4, height: float = 4.0) -> tuple[Figure, object]:
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()


# --- the figures --------------------------------------------------------------------------
def pareto_latency_figure(data: ReportData) -> Figure:
    fig, ax = _new(7.4, 4.6)
    _baseline(ax, data)
    _frontier(ax, data, lambda s: s.draft_ms, lambda s: s.speedup)
    _scatter_subnets(ax, data, lambda s: s.draft_ms, lambda s: s.speedup)
    b = data.best_subnet
    _mark_best(ax, data, b.draft_ms if b else None, b.speedup if b else None,
               [(s.draft_ms, s.speedup, 20.0 if s.on_front else 1.0)
                for s in data.subnets if s is not b])
    ax.set_xlabel("draft step latency (ms, predicted)")
    ax.set_ylabel("expected speedup over target alone (×)")
    ax.set_title(f"Expected speedup vs draft latency — {data.hardware_id}", loc="left")
    _encoding_legend(ax, data)
    return fig


def pareto_params_figure(data: ReportData) -> Figure | None:
    if not any(s.draft_params for s in data.subnets):
        return None
    fig, ax = _new()
    _baseline(ax, data)
    _frontier(ax, data, lambda s: s.draft_params / 1e6 if s.draft_params else None,
              lambda s: s.speedup)
    _scatter_subnets(ax, data, lambda s: s.draft_params / 1e6 if s.draft_params else None,
                     lambda s: s.speedup)
    ax.set_xlabel("draft parameters (millions)")
    ax.set_ylabel("expected speedup (×)")
    ax.set_title("Expected speedup vs draft size", loc="left")
    return fig


def tau_cost_figure(data: ReportData) -> Figure:
    fig, ax = _new()
    front = [s for s in data.front if s.tau_lo is not None and s.tau_hi is not None]
    if front:
        ax.errorbar([s.cycle_draft_ms for s in front], [s.tau for s in front],
                    yerr=[[s.tau - s.tau_lo for s in front], [s.tau_hi - s.tau for s in front]],
                    fmt="none", ecolor="#333", elinewidth=0.9, capsize=2.5, zorder=3)
    _scatter_subnets(ax, data, lambda s: s.cycle_draft_ms, lambda s: s.tau)
    ax.set_xlabel("draft cost per cycle: draft_len × draft step (ms)")
    ax.set_ylabel("τ (tokens per target forward)")
    ax.set_title("τ vs draft cost (front with 95% interval)", loc="left")
    return fig


def acceptance_figure(data: ReportData) -> Figure | None:
    if not data.acceptance:
        return None
    fig, ax = _new()
    cmap = matplotlib.colormaps["tab10"]
    palette = [cmap(k) for k in (0, 1, 2, 4, 5, 6, 7, 8, 9)]  # no red: red is the best
    for i, curve in enumerate(data.acceptance[:10]):
        is_best = curve.spec_id == data.best.spec_id
        positions = range(1, len(curve.rates) + 1)
        ax.plot(positions, curve.rates, marker="o", ms=4 if not is_best else 6,
                lw=2.6 if is_best else 1.3, color=BEST_COLOR if is_best else palette[i % len(palette)],
                label=f"{curve.spec_id}{'  (best)' if is_best else ''}", zorder=4 if is_best else 3)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.02)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title("Per-position acceptance, Pareto front"
                 + (f" ({data.acceptance_dataset})" if data.acceptance_dataset else ""), loc="left")
    ax.legend(loc="upper right", fontsize=8)
    return fig


def parity_figure(data: ReportData) -> Figure | None:
    pred = data.predictor
    if pred is None or not pred.holdout:
        return None
    fig, ax = _new()
    lo = min(min(p.measured_ms, p.predicted_ms) for p in pred.holdout)
    hi = max(max(p.measured_ms, p.predicted_ms) for p in pred.holdout)
    span = [lo * 0.85, hi * 1.15]
    ax.plot(span, span, color="#444", lw=1.0, zorder=2)
    ax.fill_between(span, [v * 0.9 for v in span], [v * 1.1 for v in span], color="#999",
                    alpha=0.15, lw=0, zorder=1, label="±10%")
    cmap = matplotlib.colormaps["tab10"]
    for i, kind in enumerate(sorted({p.kind for p in pred.holdout})):
        pts = [p for p in pred.holdout if p.kind == kind]
        ax.scatter([p.measured_ms for p in pts], [p.predicted_ms for p in pts], s=22,
                   color=cmap(i), label=kind, zorder=3, alpha=0.85)
    if hi / max(lo, 1e-9) > 5:  # draft steps and target steps differ by an order of magnitude
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(span)
    ax.set_ylim(span)
    ax.set_xlabel("measured (ms)")
    ax.set_ylabel("predicted (ms)")
    lines = [f"{pred.regressor}"]
    if pred.mape is not None:
        lines.append(f"MAPE {100 * pred.mape:.1f}%")
    if pred.kendall_tau is not None:
        lines.append(f"Kendall τ {pred.kendall_tau:.3f}")
    if pred.within_10pct is not None:
        lines.append(f"within 10%: {100 * pred.within_10pct:.0f}%")
    lines.append(f"{pred.n_holdout or len(pred.holdout)} held-out rows")
    ax.text(0.03, 0.97, "\n".join(lines), transform=ax.transAxes, va="top", fontsize=8.5,
            bbox={"boxstyle": "round,pad=0.4", "fc": "white", "ec": "#ccc"})
    ax.set_title(f"Latency predictor on held-out rows — {data.hardware_id}", loc="left")
    ax.legend(loc="lower right")
    return fig


def aifd_figure(data: ReportData) -> Figure | None:
    aifd = data.aifd
    if aifd is None:
        return None
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1.2])
    ax.plot(aifd.layers, aifd.ae, marker="o", ms=3.5, color="#1f77b4")
    ax.set_ylabel("attention entropy AE")
    ax2.bar(aifd.layers, aifd.delta_ae, color=["#1f77b4" if v >= 0 else "#ff7f0e"
                                               for v in aifd.delta_ae], width=0.7)
    ax2.axhline(0, color="#666", lw=0.7)
    ax2.set_ylabel("ΔAE")
    ax2.set_xlabel("target layer")
    for layer in aifd.chosen:
        for a in (ax, ax2):
            a.axvline(layer, color=BEST_COLOR, lw=1.4, ls="--", zorder=0)
        if layer in aifd.layers:
            ax.annotate(f"chosen: layer {layer}", xy=(layer, aifd.ae[aifd.layers.index(layer)]),
                        xytext=(8, 12), textcoords="offset points", color=BEST_COLOR,
                        fontweight="bold", fontsize=9)
    ax.set_title("AIFD: attention entropy per target layer", loc="left")
    return fig


def history_figure(data: ReportData) -> Figure | None:
    pts = [p for p in data.history if p.value is not None or p.best_so_far is not None]
    if not pts:
        return None
    fig, ax = _new()
    vals = [p for p in pts if p.value is not None]
    ax.scatter([p.number for p in vals], [p.value for p in vals], s=12, color="#1f77b4",
               alpha=0.45, label="trial", zorder=2)
    best = [p for p in pts if p.best_so_far is not None]
    ax.step([p.number for p in best], [p.best_so_far for p in best], where="post",
            color=BEST_COLOR, lw=1.8, label="best so far", zorder=3)
    ax.set_xlabel("trial")
    ax.set_ylabel("objective (expected speedup ×)")
    ax.set_title(f"Optuna search history ({len(pts)} trials)", loc="left")
    ax.legend(loc="lower right")
    return fig


def verified_figure(data: ReportData) -> Figure | None:
    if not data.verified:
        return None
    fig, ax = _new()
    pred = [v.predicted_speedup for v in data.verified]
    meas = [v.measured_speedup for v in data.verified]
    lo, hi = min(pred + meas), max(pred + meas)
    pad = 0.12 * (hi - lo) + 0.05
    span = [lo - pad, hi + pad]
    ax.plot(span, span, color="#444", lw=1.0, label="measured = predicted")
    ax.fill_between(span, [v * 0.85 for v in span], [v * 1.15 for v in span], color="#999",
                    alpha=0.15, lw=0, label="±15%")
    ordered = sorted(data.verified, key=lambda v: v.predicted_speedup)
    for k, v in enumerate(ordered):
        is_best = v.spec_id == data.best.spec_id
        ax.scatter([v.predicted_speedup], [v.measured_speedup], s=160 if is_best else 36,
                   marker="*" if is_best else "o", color=BEST_COLOR if is_best else "#1f77b4",
                   zorder=4, edgecolors="white" if is_best else "none")
        # Alternate above/below so neighbouring labels do not overprint each other.
        ax.annotate(v.spec_id, (v.predicted_speedup, v.measured_speedup),
                    xytext=(-6, 7 if k % 2 == 0 else -12), textcoords="offset points",
                    fontsize=8, ha="right", color=BEST_COLOR if is_best else "#333")
    ax.set_xlim(span)
    ax.set_ylim(span)
    ax.set_xlabel("predicted speedup (×)")
    ax.set_ylabel("measured speedup, decode phase (×)")
    ax.set_title("Verified subnets: measured vs predicted", loc="left")
    ax.legend(loc="upper left")
    return fig


def cross_hardware_figure(data: ReportData) -> Figure | None:
    cross = data.cross_hardware
    if cross is None:
        return None
    n = len(cross.hardware_ids)
    fig, ax = _new(max(5.6, 1.7 * n + 2.8), max(3.0, 0.85 * n + 1.6))
    # Colour: share of that column's own best, so machines with different speedup scales compare.
    rel = [[cross.relative(i, j) for j in range(n)] for i in range(n)]
    known = [v for row in rel for v in row if v is not None]
    low = min(known + [0.9])
    im = ax.imshow([[float("nan") if v is None else v for v in row] for row in rel],
                   cmap="Blues", vmin=low - 0.02, vmax=1.0)
    for i in range(n):
        for j in range(n):
            v, r = cross.speedup[i][j], rel[i][j]
            text = "not\nevaluated" if v is None else f"{v:.2f}×\n{100 * r:.1f}%"
            dark = r is not None and r > low + 0.6 * (1.0 - low)
            ax.text(j, i, text, ha="center", va="center", fontsize=8.5,
                    fontweight="bold" if i == j else "normal",
                    color="#777" if v is None else ("white" if dark else "#111"))
    ax.set_xticks(range(n), cross.hardware_ids, rotation=15, ha="right")
    ax.set_yticks(range(n), [f"{hw}\nbest {sid}" for hw, sid in
                             zip(cross.hardware_ids, cross.best_spec_ids, strict=True)])
    ax.set_xlabel("evaluated on")
    ax.set_ylabel("best subnet of")
    ax.grid(False)
    fig.colorbar(im, ax=ax, shrink=0.8, label="share of that hardware's best speedup")
    ax.set_title("The best draft depends on the hardware", loc="left")
    return fig


FIGURES: tuple[tuple[str, str, str, Callable[[ReportData], Figure | None]], ...] = (
    ("pareto_latency", "Pareto front: speedup vs draft latency",
     "Every evaluated subnet (faint) and the search's Pareto front (solid, dark edge); dashed: "
     "the frontier in these two axes. Colour = visual tokens kept, marker = heads, red star = "
     "best.", pareto_latency_figure),
    ("pareto_params", "Pareto front: speedup vs draft parameters",
     "Same points against the draft's parameter count.", pareto_params_figure),
    ("tau_cost", "τ vs draft cost",
     "Acceptance length against the draft time per cycle; bars: bootstrap 95% interval of τ "
     "for the front.", tau_cost_figure),
    ("acceptance", "Per-position acceptance",
     "Probability that the draft token at each position is accepted, for the front.",
     acceptance_figure),
    ("verified", "Measured vs predicted speedup",
     "End-to-end measurements of the verified subnets against the predicted speedup.",
     verified_figure),
    ("parity", "Latency predictor parity",
     "Predicted vs measured latency on rows held out from the predictor's training.",
     parity_figure),
    ("aifd", "AIFD attention entropy",
     "Mean attention entropy per target layer and its change; dashed red: the layer(s) whose "
     "features supervise the draft.", aifd_figure),
    ("history", "Search history",
     "Objective of each Optuna trial and the best so far.", history_figure),
    ("cross_hardware", "Cross-hardware",
     "Row: the best subnet found for that hardware; column: its expected speedup on each "
     "hardware (from that hardware's trials).", cross_hardware_figure),
)

_SVG_START = re.compile(r"<svg\b[^>]*>", re.S)
_ID = re.compile(r'\sid="([^"]+)"')
_ID_USE = re.compile(r'(\sid="|href="#|url\(#)([^"\)]+)(["\)])')


def figure_to_svg(fig: Figure, salt: str, label: str = "") -> tuple[str, str]:
    """The figure as (inline <svg> element that scales with its container, standalone document).

    Inline, every element id is prefixed with `salt` so ids stay unique across the figures of
    one page; `svg.hashsalt` and no date in the metadata make the output deterministic.
    """
    buf = io.StringIO()
    with matplotlib.rc_context({**STYLE, "svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    document = buf.getvalue()
    svg = document[document.index("<svg"):]
    ids = set(_ID.findall(svg))
    svg = _ID_USE.sub(lambda m: f"{m.group(1)}{salt}-{m.group(2)}{m.group(3)}"
                      if m.group(2) in ids else m.group(0), svg)
    head = _SVG_START.match(svg).group(0)
    new_head = re.sub(r'\s(width|height)="[^"]*"', "", head)
    new_head = new_head.replace(
        "<svg", f'<svg class="fig" role="img" data-figure="{salt}" aria-label="{html.escape(label)}"', 1)
    return new_head + svg[len(head):], document


def render_figures(data: ReportData) -> list[RenderedFigure]:
    """Every figure the run has data for, in page order."""
    out = []
    for name, title, caption, draw in FIGURES:
        with matplotlib.rc_context(STYLE):
            fig = draw(data)
        if fig is None:
            continue
        inline, document = figure_to_svg(fig, name, title)
        out.append(RenderedFigure(name, title, caption, inline, document, fig))
    return out


def save_figures(figures: Sequence[RenderedFigure], folder: Path, dpi: int = 200) -> list[Path]:
    """Static copies beside the report: <name>.svg and <name>.png for papers and slides.

    Copies of figures this run no longer has (e.g. an Optuna history from an earlier search)
    are removed so the folder matches the page.
    """
    folder.mkdir(parents=True, exist_ok=True)
    rendered = {f.name for f in figures}
    for name, *_ in FIGURES:
        if name not in rendered:
            for suffix in (".svg", ".png"):
                (folder / f"{name}{suffix}").unlink(missing_ok=True)
    paths = []
    for fig in figures:
        paths.append(_write_bytes_atomic(folder / f"{fig.name}.svg", fig.svg_file.encode()))
        buf = io.BytesIO()
        with matplotlib.rc_context(STYLE):
            fig.figure.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
        paths.append(_write_bytes_atomic(folder / f"{fig.name}.png", buf.getvalue()))
    return paths


def _write_bytes_atomic(path: Path, data: bytes) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path
