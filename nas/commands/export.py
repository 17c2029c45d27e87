"""`dreams-nas export`: a searched spec folder as a self-contained folder to deploy."""

from __future__ import annotations

import argparse
from typing import Any

HELP = ("export a searched draft (specs/<spec_id>/) as a self-contained folder for "
        "transformers' model.generate(custom_generate=DIR)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC_DIR", help="a spec folder that `dreams-nas "
                        "search` wrote (<run>/specs/<spec_id>/)")
    parser.add_argument("--to", required=True, metavar="DIR",
                        help="a new or empty folder to write the export into")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from dreams_nas.nas.stages.export_folder import export_folder

    return export_folder(args.spec, args.to)
