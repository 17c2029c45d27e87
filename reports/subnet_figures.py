"""The figures of the searched subnets: speedup against draft latency and size, τ against
draft cost, and the front's per-position acceptance."""

from __future__ import annotations

import matplotlib
from dreams_nas.reports.plotting import (
    BEST_COLOR,
    DENSE_ABOVE,
    baseline,
    encoding_legend,
    frontier,
    make_axes,
    mark_best,
    scatter_subnets,
)
from dreams_nas.reports.values import ReportData
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


def pareto_params_figure(data: ReportData) -> Figure | None:
    if not any(s.draft_params for s in data.subnets):
        return None
    fig, ax = make_axes()
    baseline(ax, data)
    frontier(ax, data, lambda s: s.draft_params / 1e6 if s.draft_params else None,
             lambda s: s.speedup)
    scatter_subnets(ax, data, lambda s: s.draft_params / 1e6 if s.draft_params else None,
                    lambda s: s.speedup)
    ax.set_xlabel("draft parameters (millions)")
    ax.set_ylabel("expected speedup (×)")
    ax.set_title("Expected speedup vs draft size", loc="left")
    return fig


def tau_cost_figure(data: ReportData) -> Figure:
    fig, ax = make_axes()
    front = [s for s in data.front if s.tau_lo is not None and s.tau_hi is not None]
    if front:
        ax.errorbar([s.cycle_draft_ms for s in front], [s.tau for s in front],
                    yerr=[[s.tau - s.tau_lo for s in front], [s.tau_hi - s.tau for s in front]],
                    fmt="none", ecolor="#333", elinewidth=0.9, capsize=2.5, zorder=3)
    scatter_subnets(ax, data, lambda s: s.cycle_draft_ms, lambda s: s.tau)
    ax.set_xlabel("draft cost per cycle: draft_len × draft step (ms)")
    ax.set_ylabel("τ (tokens per target forward)")
    ax.set_title("τ vs draft cost (front with 95% interval)", loc="left")
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
    ax.legend(loc="upper right", fontsize=8)
    return fig
