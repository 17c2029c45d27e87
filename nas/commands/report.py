"""`dreams-nas report`: the self-contained Pareto HTML report of a run folder."""

from __future__ import annotations

import argparse
from typing import Any

from dreams_nas.supernet.core.errors import InputError, MissingArtefactError

HELP = "write the self-contained HTML report (Pareto front, best subnet, figures) of a run"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, metavar="FILE",
                        help="where to write the page (default: <run>/report.html); PNG/SVG "
                             "copies of the figures go to <FILE stem>_figures/ beside it")
    parser.add_argument("--hardware", default=None, metavar="ID",
                        help="hardware id whose search to report (default: the latest search)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    # matplotlib is imported here, not at module top, so `--help` stays instant.
    from dreams_nas.nas.stages.inputs import check_run_folder
    from dreams_nas.reports import (
        MissingResultsError,
        ReportError,
        build_report_data,
        figure_folder,
        render_report,
    )
    from dreams_nas.supernet.core.runfolder import RunFolder

    check_run_folder(RunFolder(args.run))
    try:
        data = build_report_data(args.run, hardware_id=args.hardware)
        out = args.out if args.out is not None else data.run_dir / "report.html"
        path = render_report(data, out)
    except MissingResultsError as exc:
        raise MissingArtefactError(str(exc)) from None
    except ReportError as exc:
        raise InputError(str(exc)) from None
    figures = sorted(p.name for p in figure_folder(path).glob("*.svg"))
    return {"report": str(path), "figures_dir": str(figure_folder(path)),
            "figures": figures, **data.summary()}
