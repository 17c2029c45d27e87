"""dreams_nas.reports: the Pareto HTML report and its figures (pure rendering).

Compute, then render: `build_report_data` reads a run folder into a frozen `ReportData`;
`render_report` draws it into one self-contained HTML page plus PNG/SVG copies of each figure.
Of the rest of the project it imports `supernet.core` only (the run folder's paths, atomic
writes, the spec's fields, the Pareto front); it reads the files the other packages write.

    from dreams_nas.reports import write_report
    write_report("dreams-run")            # -> dreams-run/report.html (+ report_figures/)
"""

from __future__ import annotations

from pathlib import Path

from dreams_nas.reports.data import build_report_data
from dreams_nas.reports.errors import MissingResultsError, ReportError
from dreams_nas.reports.figures import RenderedFigure, render_figures, save_figures
from dreams_nas.reports.html import render_html
from dreams_nas.reports.search_results import searched_hardware_ids
from dreams_nas.reports.subnets import Subnet, SubnetTable
from dreams_nas.reports.values import (
    AcceptanceCurve,
    AifdInfo,
    BestSubnet,
    CrossHardware,
    HistoryPoint,
    PredictorInfo,
    ReportData,
    TrainingCurve,
    Verified,
)
from dreams_nas.supernet.core.io import atomic_write_text
from dreams_nas.supernet.core.runfolder import RunFolder

__all__ = [
    "AcceptanceCurve", "AifdInfo", "BestSubnet", "CrossHardware", "HistoryPoint",
    "MissingResultsError", "PredictorInfo", "RenderedFigure", "ReportData", "ReportError",
    "Subnet", "SubnetTable", "TrainingCurve", "Verified", "build_report_data", "figure_folder",
    "render_figures", "render_html", "render_report", "searched_hardware_ids", "write_report",
]


def figure_folder(out_path: str | Path) -> Path:
    """Where the figure copies of the report at `out_path` go: `<stem>_figures/` beside it."""
    out_path = Path(out_path)
    return out_path.with_name(f"{out_path.stem}_figures")


def render_report(data: ReportData, out_path: str | Path) -> Path:
    """Write the HTML page to `out_path` and the figure copies beside it; return the page's path."""
    out_path = Path(out_path)
    if out_path.suffix.lower() not in {".html", ".htm"}:
        raise ReportError(f"report path {out_path} must end in .html; pass e.g. --out report.html")
    figures = render_figures(data)
    folder = figure_folder(out_path)
    save_figures(figures, folder)
    page = render_html(data, figures, figure_folder=folder.name)
    return atomic_write_text(out_path, page)


def write_report(run_dir: str | Path, out: str | Path | None = None,
                 hardware_id: str | None = None) -> Path:
    """Build and render the report of a run folder (default page: `<run_dir>/report.html`)."""
    data = build_report_data(run_dir, hardware_id=hardware_id)
    return render_report(data, Path(out) if out is not None else RunFolder(run_dir).report_html)
