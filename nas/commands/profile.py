"""`dreams-nas profile`: time the draft subnets and the target's steps here, fit the predictor."""

from __future__ import annotations

import argparse
from typing import Any

from dreams_nas.nas.commands.options import (
    add_compile,
    add_data,
    add_device,
    add_dtype,
    add_threads,
    real,
    whole,
)

HELP = ("time draft subnets and the target's decode/verify steps on this device; "
        "fit the latency predictor")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default=None, metavar="builtin|proxy-llava|PATH",
                        help="target VLM checkpoint folder, builtin (the built-in target) or "
                             "proxy-llava (the real-shaped random-weight proxy) (default: the "
                             "run's target, else builtin)")
    add_device(parser, "to time on")
    add_dtype(parser)
    add_compile(parser, "time the steps compiled (a hardware id of its own, <id>-compiled)")
    parser.add_argument("--batch-sizes", type=whole(1, 4096), nargs="+", default=None,
                        metavar="B",
                        help="requests decoded together in every timed step, one profile each "
                             "(B > 1: a hardware id of its own, <id>-b<B>; chains only) "
                             "(default: 1 on the CPU, 1 4 16 on a GPU)")
    parser.add_argument("--budget", default=None, metavar="N|FRACTION",
                        help="draft measurements: a count or a fraction of the grid, chosen "
                             "space-filling (default: the whole grid); with --transfer-from, "
                             "the steps measured here (default: 10)")
    parser.add_argument("--transfer-from", action="append", default=[], metavar="DIR",
                        help="price this device from another device's full profile "
                             "(<run>/latency/<hardware-id>; repeat for several) and --budget "
                             "steps measured here, the most informative ones, instead of "
                             "timing the whole grid; a later profile without it times the rest "
                             "and replaces the transferred prices")
    parser.add_argument("--context-lengths", type=whole(1), nargs="+", default=None, metavar="N",
                        help="prompt lengths in tokens, image included (default: five "
                             "from the shortest evaluation prompt of --data to the longest "
                             "plus --max-new-tokens); span the contexts you will search at: "
                             "`search` refuses one outside them by more than a tenth of "
                             "their span")
    add_data(parser, "evaluation prompts whose visual tokens and lengths set the contexts")
    parser.add_argument("--limit", type=whole(1), default=None, metavar="N",
                        help="use the first N evaluation prompts (builtin default: 32)")
    parser.add_argument("--max-new-tokens", type=whole(1), default=64, metavar="N",
                        help="answer length the context grid allows for (default: 64)")
    parser.add_argument("--repeats", type=whole(1), default=100,
                        help="timed repeats per step, at most (default: 100; fewer past 2 s)")
    parser.add_argument("--warmup", type=whole(0), default=3, metavar="N",
                        help="untimed runs of a step before each pass's timed repeats "
                             "(default: 3)")
    add_threads(parser, "fixed while timing", default="physical cores")
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                        help="CPU clock: wall (perf_counter) or cpu (thread CPU time, needs "
                             "--threads 1; for shared machines)")
    parser.add_argument("--passes", type=whole(1), default=10,
                        help="spread each step's repeats over this many visits, interleaved with "
                             "the other steps of its block, so that a slow drift of the machine "
                             "(other load, heat, clocks) hits every step alike; at most "
                             "--repeats (default: 10)")
    parser.add_argument("--chunk", type=whole(0), default=256,
                        help="steps per interleaved block, 0 for the whole grid (default: 256; a "
                             "block ends with a whole unit of one context's target steps); "
                             "every step's pass is journaled as it is timed, so a kill loses at "
                             "most the step in flight")
    parser.add_argument("--stat", default="p10", choices=["p10", "median"],
                        help="the statistic of each step's samples the predictor fits: p10 (the "
                             "fastest tenth, least touched by other load; default) or median")
    parser.add_argument("--holdout", type=real(0.0, 1.0, high_open=True), default=0.2,
                        help="share of the grid points held out to measure the predictor, "
                             "each point's rows together (default: 0.2)")
    parser.add_argument("--fit-only", action="store_true",
                        help="refit the predictor on the existing profile without timing anything")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from dataclasses import replace

    from dreams_nas.nas.stages.profile import ProfileOptions, profile
    from dreams_nas.supernet.core.device import resolve_device
    from dreams_nas.supernet.core.runfolder import RunFolder

    options = ProfileOptions(
        target=args.target, device=args.device, dtype=args.dtype, budget=args.budget,
        context_lengths=args.context_lengths, data=args.data, limit=args.limit,
        max_new_tokens=args.max_new_tokens, repeats=args.repeats, warmup=args.warmup,
        threads=args.threads,
        clock=args.clock, passes=args.passes, chunk=args.chunk, holdout=args.holdout,
        stat=f"{args.stat}_ms", fit_only=args.fit_only,
        transfer_from=tuple(args.transfer_from), compile=args.compile,
        seed=args.seed,
        show_progress=False if args.quiet else None,
    )
    sizes = args.batch_sizes or batch_sizes_for(resolve_device(args.device))
    sizes = list(dict.fromkeys(sizes))  # each once, in the order given
    run_folder = RunFolder(args.run)
    summaries = [profile(run_folder, replace(options, batch=b)) for b in sizes]
    if len(summaries) == 1:
        return summaries[0]
    return {"batch_sizes": sizes, "hardware_ids": [s["hardware_id"] for s in summaries],
            "profiles": summaries}


# `--batch-sizes` when none is given: a CPU serves one request at a time; on a GPU a verify of
# a few positions is nearly free at batch 1 and costs real work at 16, so the search's answer
# moves between them (a profile per size: three times the work of one).
DEFAULT_BATCH_SIZES = {"cpu": (1,), "cuda": (1, 4, 16)}


def batch_sizes_for(device: str) -> list[int]:
    return list(DEFAULT_BATCH_SIZES.get(device.split(":")[0], (1,)))
