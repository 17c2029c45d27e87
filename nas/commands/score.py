"""`dreams-nas score`: acceptance length tau of subnets on an evaluation set (cached, resumable)."""

from __future__ import annotations

import argparse
from typing import Any

from dreams_nas.nas.commands.options import (
    add_data,
    add_device,
    add_dtype,
    add_threads,
    real,
    whole,
)

HELP = "measure the acceptance length tau of subnets on evaluation prompts (cached per supernet)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data(parser, "evaluation prompts")
    parser.add_argument("--specs", default="all", metavar="all|FILE",
                        help="which subnets: all of the space, or a file of ids (one per line)")
    parser.add_argument("--temperature", type=real(0.0), default=0.0, metavar="T",
                        help="0 (default): teacher-forced, every draft length at once; "
                             "> 0: seeded real sampled runs")
    parser.add_argument("--limit", type=whole(1), default=None, metavar="N",
                        help="use the first N prompts (builtin default: 32)")
    parser.add_argument("--max-new-tokens", type=whole(1), default=64, metavar="N",
                        help="tokens generated per prompt (default 64)")
    add_device(parser, "to score on")
    add_dtype(parser)
    add_threads(parser, "while scoring")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from dreams_nas.nas.stages.score import ScoreOptions, score_run
    from dreams_nas.supernet.core.runfolder import RunFolder
    from dreams_nas.supernet.data.prompts import check_data

    check_data(args.data)  # every line now: a bad file fails before any model loads

    options = ScoreOptions(
        data=args.data, specs=args.specs, temperature=args.temperature, limit=args.limit,
        max_new_tokens=args.max_new_tokens, device=args.device, dtype=args.dtype,
        threads=args.threads,
        seed=args.seed, show_progress=False if args.json or args.quiet else None)
    return score_run(RunFolder(args.run), options)
