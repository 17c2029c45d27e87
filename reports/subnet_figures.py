"""The figures of the searched subnets: speedup against draft latency and size, τ against
draft cost, and the front's per-position acceptance."""

from __future__ import annotations

import matplotlib
import numpy as np
from dreams_nas.reports.plotting import (
    BEST_COLOR,
    DENSE_ABOVE,
    FRONT_EDGE,
    baseline,
    encoding_legend,
    frontier,
    make_axes,
    mark_best,
    scatter_subnets,
)
from dreams_nas.reports.subnets import Subnet, SubnetTable
from dreams_nas.reports.values import ReportData
from dreams_nas.supernet.core.pareto import is_pareto_front
from matplotlib.figure import Figure


def pareto_latency_figure(data: ReportData) -> Figure:
    fig, ax = make_axes(7.4, 4.6)
    baseline(ax, data)
    frontier(ax, data, lambda s: s.draft_ms, lambda s: s.speedup)
    scatter_subnets(ax, data, lambda s: s.draft_ms, lambda s: s.speedup)
    b = data.best_subnet
    near = data.front if len(data.subnets) > DENSE_ABOVE else data.subnets  # what a label hides
    mark_best(ax, data, b.draft_ms if b else None, b.speedup if b else None,
              [(s.draft_ms, s.speedup, 20.0 if s.on_front else 1.0)
               for s in near if s is not b])
    ax.set_xlabel("draft step latency (ms, predicted)")
    ax.set_ylabel("expected speedup over target alone (×)")
    ax.set_title(f"Expected speedup vs draft latency — {data.hardware_id}", loc="left")
    encoding_legend(ax, data)
    return fig


def _millions(name: str):
    """An axis of a size column (`draft_params`, `draft_bytes`) in millions (unknown: 0)."""
    def axis(s: Subnet | SubnetTable) -> float | None | np.ndarray:
        value = getattr(s, name)
        if isinstance(s, SubnetTable):
            return np.where(value > 0, value / 1e6, np.nan)
        return value / 1e6 if value else None
    return axis


def _speedup_against_size(data: ReportData, name: str, xlabel: str, title: str
                          ) -> Figure | None:
    """Expected speedup against a size column in millions, with its front; None when no
    subnet records that column (a search written before it was recorded)."""
    if not (getattr(data.columns, name) > 0).any():
        return None
    x = _millions(name)
    fig, ax = make_axes()
    baseline(ax, data)
    frontier(ax, data, x, lambda s: s.speedup)
    scatter_subnets(ax, data, x, lambda s: s.speedup)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("expected speedup (×)")
    ax.set_title(title, loc="left")
    return fig


def pareto_params_figure(data: ReportData) -> Figure | None:
    return _speedup_against_size(data, "draft_params", "draft parameters (millions)",
                                 "Expected speedup vs draft size")


def _cycle_ms(s: Subnet | SubnetTable) -> float | None | np.ndarray:
    return s.cycle_ms


def tau_cost_figure(data: ReportData) -> Figure:
    """The tau-latency front: acceptance (model quality) against the cycle's latency
    (hardware cost), with the front's 95% intervals."""
    fig, ax = make_axes()
    front = [s for s in data.front if s.tau_lo is not None and s.tau_hi is not None
             and s.cycle_ms is not None]
    if front:
        ax.errorbar([s.cycle_ms for s in front], [s.tau for s in front],
                    yerr=[[s.tau - s.tau_lo for s in front], [s.tau_hi - s.tau for s in front]],
                    fmt="none", ecolor="#333", elinewidth=0.9, capsize=2.5, zorder=3)
    frontier(ax, data, _cycle_ms, lambda s: s.tau)
    scatter_subnets(ax, data, _cycle_ms, lambda s: s.tau)
    ax.set_xlabel("cycle latency: draft steps + target verify (ms, predicted)")
    ax.set_ylabel("τ (tokens per target forward)")
    ax.set_title("τ vs cycle latency (model quality vs hardware cost)", loc="left")
    return fig


def pareto_memory_figure(data: ReportData) -> Figure | None:
    """The speedup-memory front (absent for a search written before memory was estimated)."""
    return _speedup_against_size(data, "draft_bytes",
                                 "draft memory at the decode context: weights + KV (MB)",
                                 "Expected speedup vs draft memory")


def cross_front_figure(data: ReportData) -> Figure | None:
    """Every subnet's speedup here against on another hardware id, and the front of the two
    (the drafts no other beats on both machines)."""
    paired = data.paired
    if paired is None or len(paired.spec_id) < 2:
        return None
    fig, ax = make_axes()
    on = is_pareto_front(np.column_stack([paired.here, paired.there]), ("maximize", "maximize"))
    if len(paired.spec_id) > DENSE_ABOVE:
        cells = ax.hexbin(paired.here[~on], paired.there[~on], gridsize=48, bins="log",
                          mincnt=1, cmap="Greys", linewidths=0, zorder=1)
        fig.colorbar(cells, ax=ax, pad=0.01, fraction=0.04, label="subnets per cell")
    else:
        ax.scatter(paired.here[~on], paired.there[~on], s=18, color="#7a8fa6", alpha=0.35,
                   linewidths=0, zorder=2)
    order = np.argsort(paired.here[on])
    ax.plot(paired.here[on][order], paired.there[on][order], color="#555", lw=1.0, ls="--",
            zorder=3)
    ax.scatter(paired.here[on], paired.there[on], s=50, color="#1f77b4", edgecolors=FRONT_EDGE,
               linewidths=1.1, zorder=4, label="front on both")
    best = np.flatnonzero(paired.spec_id == data.best.spec_id)
    if best.size:
        ax.scatter(paired.here[best], paired.there[best], s=300, marker="*", color=BEST_COLOR,
                   edgecolors="white", linewidths=1.0, zorder=6, label="best here")
    ax.set_xlabel(f"expected speedup on {data.hardware_id} (×)")
    ax.set_ylabel(f"expected speedup on {paired.other_id} (×)")
    ax.set_title("Speedup on one machine vs another", loc="left")
    ax.legend(loc="lower right", fontsize=8)
    return fig


def acceptance_figure(data: ReportData) -> Figure | None:
    if not data.acceptance:
        return None
    fig, ax = make_axes()
    cmap = matplotlib.colormaps["tab10"]
    palette = [cmap(k) for k in (0, 1, 2, 4, 5, 6, 7, 8, 9)]  # no red: red is the best
    for i, curve in enumerate(data.acceptance[:10]):
        is_best = curve.spec_id == data.best.spec_id
        positions = range(1, len(curve.rates) + 1)
        ax.plot(positions, curve.rates, marker="o", ms=4 if not is_best else 6,
                lw=2.6 if is_best else 1.3,
                color=BEST_COLOR if is_best else palette[i % len(palette)],
                label=f"{curve.spec_id}{'  (best)' if is_best else ''}", zorder=4 if is_best else 3)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.02)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title("Per-position acceptance, Pareto front"
                 + (f" ({data.acceptance_dataset})" if data.acceptance_dataset else ""), loc="left")
    ax.legend(loc="best", fontsize=8)  # the curves fall from ~1: usually lower left
    return fig
