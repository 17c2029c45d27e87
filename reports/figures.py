"""The report's figures, in page order: draw each from a `ReportData` and keep its copies.

`render_figures` turns the figure functions (subnet_figures, diagnostic_figures) into
`RenderedFigure` values: an inline SVG string for the page, and the figure itself for the
PNG/SVG copies `save_figures` writes. A figure function returns None when the run lacks what it
shows (no Optuna history, one hardware id...).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib
from dreams_nas.reports.diagnostic_figures import (
    aifd_figure,
    cross_hardware_figure,
    history_figure,
    parity_figure,
    training_figure,
    verified_figure,
)
from dreams_nas.reports.plotting import STYLE
from dreams_nas.reports.subnet_figures import (
    acceptance_figure,
    cross_front_figure,
    pareto_latency_figure,
    pareto_memory_figure,
    pareto_params_figure,
    tau_cost_figure,
)
from dreams_nas.reports.svg import figure_to_svg
from dreams_nas.reports.values import ReportData
from dreams_nas.supernet.core.io import atomic_write_bytes
from matplotlib.figure import Figure


@dataclass(frozen=True)
class RenderedFigure:
    """One figure of the report."""

    name: str          # file stem of the static copies, e.g. "pareto_latency"
    title: str
    caption: str
    svg: str           # inline <svg> element (no XML prolog), scales with its container
    svg_file: str      # the standalone SVG document (the static copy)
    figure: Figure


FIGURES: tuple[tuple[str, str, str, Callable[[ReportData], Figure | None]], ...] = (
    ("pareto_latency", "Pareto front: speedup vs draft latency",
     "Every evaluated subnet (faint) and the search's Pareto front (solid, dark edge); dashed: "
     "the frontier in these two axes. Colour = visual tokens kept, marker = heads, red star = "
     "best.", pareto_latency_figure),
    ("pareto_params", "Pareto front: speedup vs draft parameters",
     "Same points against the draft's parameter count.", pareto_params_figure),
    ("pareto_memory", "Pareto front: speedup vs draft memory",
     "Against the draft's memory at the decode context (weights + KV, estimated from shapes); "
     "dashed: the frontier in these two axes.", pareto_memory_figure),
    ("tau_cost", "τ vs cycle latency",
     "Acceptance length (model quality) against the cycle's latency, draft steps plus the "
     "target's verify (hardware cost); dashed: the frontier in these two axes; bars: bootstrap "
     "95% interval of τ for the search's front.", tau_cost_figure),
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
    ("training", "Supernet training",
     "Training loss per step (top) and the held-out acceptance length of the largest and "
     "smallest subnet at each evaluation (bottom); dashed red: the evaluation whose weights "
     "the supernet keeps.", training_figure),
    ("history", "Search history",
     "Objective of each Optuna trial and the best so far.", history_figure),
    ("cross_front", "Cross-hardware front",
     "Every subnet scored on both machines: its expected speedup here against on the other "
     "searched hardware; solid: the subnets no other beats on both.", cross_front_figure),
    ("cross_hardware", "Cross-hardware",
     "Row: the best subnet found for that hardware; column: its expected speedup on each "
     "hardware (from that hardware's trials).", cross_hardware_figure),
)


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
        paths.append(atomic_write_bytes(folder / f"{fig.name}.svg", fig.svg_file.encode()))
        buf = io.BytesIO()
        with matplotlib.rc_context(STYLE):
            fig.figure.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
        paths.append(atomic_write_bytes(folder / f"{fig.name}.png", buf.getvalue()))
    return paths
