"""dreams_nas.reports: the Pareto HTML report and its figures (pure rendering).

Compute, then render: `build_report_data` reads a run folder into a frozen `ReportData`;
`render_report` draws it into one self-contained HTML page plus PNG/SVG copies of each figure.
This package imports none of the other dreams-nas packages; it reads the files they write.

    from dreams_nas.reports import write_report
    write_report("dreams-run")            # -> dreams-run/report.html (+ report_figures/)
"""

from __future__ import annotations

from pathlib import Path

from dreams_nas.reports import layout
from dreams_nas.reports.data import build_report_data
from dreams_nas.reports.figures import RenderedFigure, render_figures, save_figures
from dreams_nas.reports.files import write_text_atomic
from dreams_nas.reports.html import render_html
from dreams_nas.reports.pareto import pareto_mask
from dreams_nas.reports.search_results import searched_hardware_ids
from dreams_nas.reports.values import (
    AcceptanceCurve,
    AifdInfo,
    BestSubnet,
    CrossHardware,
    HistoryPoint,
    MissingResultsError,
    PredictorInfo,
    ReportData,
    ReportError,
    Subnet,
    SubnetTable,
    TrainingCurve,
    Verified,
)

__all__ = [
    "AcceptanceCurve", "AifdInfo", "BestSubnet", "CrossHardware", "HistoryPoint",
    "MissingResultsError", "PredictorInfo", "RenderedFigure", "ReportData", "ReportError",
    "Subnet", "SubnetTable", "TrainingCurve", "Verified", "build_report_data", "figure_folder",
    "pareto_mask",
    "render_figures", "render_html", "render_report", "searched_hardware_ids", "write_report",
    "write_text_atomic",
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
    return write_text_atomic(out_path, page)


def write_report(run_dir: str | Path, out: str | Path | None = None,
                 hardware_id: str | None = None) -> Path:
    """Build and render the report of a run folder (default page: `<run_dir>/report.html`)."""
    data = build_report_data(run_dir, hardware_id=hardware_id)
    return render_report(data, Path(out) if out is not None else layout.report_html(Path(run_dir)))
