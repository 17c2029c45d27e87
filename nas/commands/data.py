"""`dreams-nas data synth`: render the synthetic tasks as LLaVA-style JSONL + PNG files."""

from __future__ import annotations

import argparse
from typing import Any

from dreams_nas.nas.commands.options import whole

HELP = "synthetic multimodal data: `data synth --out DIR --n N --split train|eval`"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("synth",),
                        help="synth: render N samples (scene, count, ocr, chart, math) into "
                             "DIR/<split>.jsonl and DIR/images/; byte-identical for the same "
                             "--seed")
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder")
    parser.add_argument("--n", type=whole(1), default=None, metavar="N",
                       help="number of samples (default: 200)")
    parser.add_argument("--split", choices=("train", "eval"), default="train",
                       help="train and eval never share a sample seed (default: train)")
    parser.add_argument("--tasks", default=None, metavar="LIST",
                       help="comma-separated tasks of scene,count,ocr,chart,math, drawn in turn "
                            "(a task named k times is drawn k times as often; default: the "
                            "built-in split's mix: each once for eval, OCR three times in seven "
                            "for train)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from dreams_nas.supernet.data.prompts import split_tasks, write_synthetic

    n = 200 if args.n is None else args.n
    tasks = (split_tasks(args.split) if args.tasks is None
             else tuple(t.strip() for t in args.tasks.split(",") if t.strip()))
    jsonl = write_synthetic(args.out, n, args.split, seed=args.seed, tasks=tasks,
                            progress=not args.quiet)
    return {"jsonl": str(jsonl), "images": str(jsonl.parent / "images"), "n": n,
            "split": args.split, "seed": args.seed, "tasks": list(tasks)}
