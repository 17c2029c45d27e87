"""The figures that say how far to trust the search: measured against predicted speedup, the
latency predictor's parity, the AIFD entropy curve, the Optuna history and the best subnets
across hardware. Each returns None when the run lacks what it shows."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import matplotlib
from dreams_nas.reports.plotting import BEST_COLOR, make_axes
from dreams_nas.reports.values import KindAccuracy, ReportData
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter


def parity_figure(data: ReportData) -> Figure | None:
    """Measured against predicted step time on the held-out rows, one colour per step kind,
    with the predictor's summary and each kind's accuracy in a panel beside the plot (a space
    with trees and elastic depth has eight kinds: their lines do not fit inside the axes)."""
    pred = data.predictor
    if pred is None or not pred.holdout:
        return None
    fig = Figure(figsize=(9.6, 4.6), layout="constrained")
    ax, side = fig.subplots(1, 2, width_ratios=[1.15, 1])
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
                   color=cmap(i % cmap.N), label=kind, zorder=3, alpha=0.85)
    if hi / max(lo, 1e-9) > 5:  # draft steps and target steps differ by an order of magnitude
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(span)
    ax.set_ylim(span)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel("measured (ms)")
    ax.set_ylabel("predicted (ms)")
    ax.set_title(f"Latency predictor on held-out rows — {data.hardware_id}", loc="left")
    side.axis("off")
    side.text(0.0, 1.0, parity_summary(data), transform=side.transAxes, va="top",
              fontsize=8.5, family="monospace")
    handles, labels = ax.get_legend_handles_labels()
    side.legend(handles, labels, loc="lower left", ncols=2, frameon=False, fontsize=8.5,
                borderaxespad=0.0)
    return fig


def parity_summary(data: ReportData) -> str:
    """The parity panel's text: the regressor (wrapped), the pooled held-out accuracy and
    each step kind's."""
    pred = data.predictor
    assert pred is not None
    lines = textwrap.wrap(pred.regressor, width=46) or ["?"]
    if pred.mape is not None:
        lines.append(f"MAPE {100 * pred.mape:.1f}%")
    if pred.kendall_tau is not None:
        lines.append(f"Kendall τ {pred.kendall_tau:.3f}")
    if pred.within_10pct is not None:
        lines.append(f"within 10%: {100 * pred.within_10pct:.0f}%")
    if pred.transfer:
        lines[:0] = [*textwrap.wrap(f"prices {pred.transfer}", width=46), ""]
        lines.append(f"{len(pred.holdout)} measured steps, each left out of the transfer")
    else:
        lines.append(f"{pred.n_holdout or len(pred.holdout)} held-out rows")
    if pred.by_kind:
        lines.append("")
    lines += [kind_line(k) for k in pred.by_kind]
    return "\n".join(lines)


def kind_line(acc: KindAccuracy) -> str:
    """One kind's held-out quality: ``verify (14): MAPE 1.2%, ±10% 100%, τ 0.95``."""
    parts = [f"MAPE {100 * acc.mape:.1f}%" if acc.mape is not None else None,
             f"±10% {100 * acc.within_10pct:.0f}%" if acc.within_10pct is not None else None,
             f"τ {acc.kendall_tau:.2f}" if acc.kendall_tau is not None else None]
    count = f" ({acc.n})" if acc.n is not None else ""
    return f"{acc.kind}{count}: " + ", ".join(p for p in parts if p)


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


def training_figure(data: ReportData) -> Figure | None:
    curve = data.training
    if curve is None:
        return None
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=[1.2, 2])
    ax.plot(curve.steps, curve.loss, color="#999", lw=0.8)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel("training loss")
    if curve.warmup_steps:
        for a in (ax, ax2):
            a.axvline(curve.warmup_steps, color="#666", lw=0.8, ls=":", zorder=0)
        ax.annotate("phase 2", xy=(curve.warmup_steps, 1), xycoords=("data", "axes fraction"),
                    xytext=(4, -12), textcoords="offset points", fontsize=8, color="#666")
    if curve.eval_steps:
        ax2.plot(curve.eval_steps, curve.tau_full, marker="o", ms=3, label="largest subnet")
        small = [(s, v) for s, v in zip(curve.eval_steps, curve.tau_smallest, strict=True)
                 if v is not None]
        if small:
            ax2.plot([s for s, _ in small], [v for _, v in small], marker="o", ms=3,
                     label="smallest subnet")
        if curve.best_step is not None:
            ax2.axvline(curve.best_step, color=BEST_COLOR, lw=1.4, ls="--", zorder=0)
            label = f"kept: step {curve.best_step}"
            if curve.best_score is not None:
                label += f", mean τ {curve.best_score:.2f}"
            ax2.annotate(label, xy=(curve.best_step, 0.04), xycoords=("data", "axes fraction"),
                         xytext=(-6, 0), textcoords="offset points", ha="right",
                         color=BEST_COLOR, fontweight="bold", fontsize=9)
        ax2.set_ylabel(f"held-out τ (γ = {curve.draft_len or '?'})")
        ax2.legend(loc="upper left")
    else:
        ax2.text(0.5, 0.5, "no held-out evaluation (trained to the step cap)",
                 transform=ax2.transAxes, ha="center", va="center", color="#666")
    ax2.set_xlabel("step")
    stop = f" — stopped: {curve.stopped}" if curve.stopped else ""
    ax.set_title(f"Supernet training{stop}", loc="left")
    return fig


def history_figure(data: ReportData) -> Figure | None:
    pts = [p for p in data.history if p.value is not None or p.best_so_far is not None]
    if not pts:
        return None
    fig, ax = make_axes()
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
    fig, ax = make_axes()
    pred = [v.predicted_speedup for v in data.verified]
    meas = [v.measured_speedup for v in data.verified]
    lo, hi = min(pred + meas), max(pred + meas)
    pad = 0.12 * (hi - lo) + 0.05
    span = [lo - pad, hi + pad]
    ax.plot(span, span, color="#444", lw=1.0, label="measured = predicted")
    ax.fill_between(span, [v * 0.85 for v in span], [v * 1.15 for v in span], color="#999",
                    alpha=0.15, lw=0, label="±15%")
    height_pt = 0.8 * fig.get_figheight() * 72  # the axes' height, about, in points
    offsets = label_offsets([(m - span[0]) / (span[1] - span[0]) * height_pt for m in meas],
                            gap=10.0)
    for v, dy in zip(data.verified, offsets, strict=True):
        is_best = v.spec_id == data.best.spec_id
        ax.scatter([v.predicted_speedup], [v.measured_speedup], s=160 if is_best else 36,
                   marker="*" if is_best else "o", color=BEST_COLOR if is_best else "#1f77b4",
                   zorder=4, edgecolors="white" if is_best else "none")
        # Beside the point, on the side with room (the left half's labels run right), moved
        # up or down as `label_offsets` spaced them so that close points' labels do not overprint.
        left = (v.predicted_speedup - span[0]) < 0.6 * (span[1] - span[0])
        ax.annotate(v.spec_id, (v.predicted_speedup, v.measured_speedup),
                    xytext=(8 if left else -8, dy - 3), textcoords="offset points",
                    fontsize=8, ha="left" if left else "right",
                    color=BEST_COLOR if is_best else "#333")
    ax.set_xlim(span)
    ax.set_ylim(span)
    ax.set_xlabel("predicted speedup (×)")
    ax.set_ylabel("measured speedup, decode phase (×)")
    ax.set_title("Verified subnets: measured vs predicted", loc="left")
    ax.legend(loc="upper left")
    return fig


def label_offsets(heights: Sequence[float], gap: float) -> list[float]:
    """Vertical offsets (points) that put each label at least `gap` points from the others,
    near its own point's height (`heights`, points): in height order each label is pushed up
    past the one below; a run of pushed labels is then moved down by its mean push (so a
    cluster spreads around its points rather than above them), and a last pass restores the
    gap where that move closed it."""
    order = sorted(range(len(heights)), key=lambda i: heights[i])
    placed = [0.0] * len(heights)
    last = float("-inf")
    for i in order:
        last = max(heights[i], last + gap)
        placed[i] = last
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and placed[order[end]] - placed[order[end - 1]] <= gap + 1e-9:
            end += 1
        run = order[start:end]
        mean = sum(placed[i] - heights[i] for i in run) / len(run)
        for i in run:
            placed[i] -= mean
        start = end
    last = float("-inf")
    for i in order:
        placed[i] = max(placed[i], last + gap)
        last = placed[i]
    return [placed[i] - heights[i] for i in range(len(heights))]


def cross_hardware_figure(data: ReportData) -> Figure | None:
    cross = data.cross_hardware
    if cross is None:
        return None
    n = len(cross.hardware_ids)
    fig, ax = make_axes(max(5.6, 1.7 * n + 2.8), max(3.0, 0.85 * n + 1.6))
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
