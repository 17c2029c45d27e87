"""`dreams-nas search`: expected speedup of every subnet (or an Optuna study), Pareto front,
deployable specs, then the best subnets measured end to end."""

from __future__ import annotations

import argparse
import re
from typing import Any

from dreams_nas.nas.commands.options import (
    add_data,
    add_device,
    add_dtype,
    add_threads,
    real,
    whole,
)

HELP = "search the subnets for the best expected speedup on one profiled hardware id"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--objective", choices=("speedup", "pareto"), default="speedup",
                        help="speedup (maximise it) or pareto (optimise the --front pair, both "
                             "objectives at once); either way the front of --front is recorded")
    parser.add_argument("--front", choices=("tau-latency", "speedup-memory", "speedup-params"),
                        default="tau-latency",
                        help="the Pareto front's pair: tau-latency (acceptance tau vs the "
                             "cycle's latency, the default), speedup-memory (speedup vs the "
                             "draft's weights + KV at the context) or speedup-params (speedup "
                             "vs draft parameters)")
    parser.add_argument("--method", choices=("exhaustive", "optuna"), default="exhaustive",
                        help="every subnet, or an Optuna TPE study")
    parser.add_argument("--trials", type=whole(1), default=None, metavar="N",
                        help="optuna: distinct subnets to evaluate in the study, reruns and "
                             "workers together (default: a quarter of the space)")
    parser.add_argument("--storage", default=None, metavar="URL",
                        help="Optuna storage shared by workers: a database URL "
                             "(postgresql+psycopg2://user@host/db; its password from PGPASSWORD or "
                             "~/.pgpass rather than the command line) or journal:PATH (a file "
                             "journal, several processes without a server; a path ending .log "
                             "or .journal too). Default: $DREAMS_NAS_STORAGE, else for optuna "
                             "SQLite study.db in the run folder. Passwords are never printed")
    parser.add_argument("--study-name", default=None, metavar="NAME",
                        help="study name in the storage (default: derived from the run)")
    parser.add_argument("--hardware", default=None, metavar="ID",
                        help="hardware id whose latency profile to use (default: the only one)")
    parser.add_argument("--compile", default=None, choices=("on", "off"),
                        help="the profile of compiled steps (on: the id ending in -compiled, "
                             "as `profile --compile on` names it) or of eager ones (off), when "
                             "the run holds both; the search prices and verifies in those steps")
    parser.add_argument("--batch-size", type=whole(1, 4096), default=None, metavar="B",
                        help="search for B requests decoded together: the profile of batch B "
                             "(`profile --batch-sizes`, the id ending in -b<B>); the objective "
                             "is throughput at B over plain batched decoding at B, chains only "
                             "(default: 1, or the batch --hardware was profiled at)")
    parser.add_argument("--max-draft-ms", type=real(0.0, low_open=True), default=None, metavar="X",
                        help="constraint: a draft step must take at most X ms")
    add_data(parser, "evaluation prompts whose acceptance is scored (as `score`)")
    parser.add_argument("--limit", type=whole(1), default=None, metavar="N",
                        help="use the first N evaluation prompts (builtin default: 32)")
    parser.add_argument("--max-new-tokens", type=whole(1), default=64, metavar="N",
                        help="tokens per prompt when scoring and verifying (default 64)")
    parser.add_argument("--verify", type=whole(0), default=3, metavar="K",
                        help="measure the best subnet and the top K-1 of the front end to end "
                             "(0 skips it; default 3)")
    parser.add_argument("--verify-prompts", type=whole(1), default=None, metavar="N",
                        help="evaluation prompts decoded for the verification (default: all the "
                             "scored ones, so measured and scored tau come from the same prompts)")
    parser.add_argument("--verify-repeats", type=whole(1), default=3, metavar="R",
                        help="passes over those prompts, each prompt decoded plainly and by "
                             "every chosen subnet in turn; the measured speedup is the median "
                             "of the passes' speedups, with their range (default 3)")
    parser.add_argument("--no-retime", action="store_true",
                        help="do not time the best subnet's steps again among the prompts "
                             "(by default they are, to split the gap to the prediction into "
                             "the formula's error and the machine's change since the profile)")
    parser.add_argument("--no-report", action="store_true",
                        help="do not write report.html (e.g. on all but one of several "
                             "workers; `dreams-nas report` writes it later)")
    add_device(parser, "to score and verify on")
    add_dtype(parser)
    add_threads(parser, "while scoring missing rows; verification always uses the profiled "
                "thread count")
    group = parser.add_argument_group(
        "when the run holds no trained supernet", "search trains one first, with `dreams-nas "
        "train`'s defaults on the built-in train split unless these say otherwise")
    group.add_argument("--train-prompts", type=whole(1), default=None, metavar="N",
                       help="training prompts (default 384)")
    group.add_argument("--train-steps", type=whole(0), default=None, metavar="N",
                       help="steps of each training phase (default 300 + 300)")


def storage_of(args: argparse.Namespace) -> str | None:
    """--storage, else $DREAMS_NAS_STORAGE (a URL with a password stays off the command line,
    where `ps` and the shell history would show it), else None (the stage's default)."""
    import os

    from dreams_nas.nas.search.storage import ENV

    if args.storage is not None:
        return args.storage
    return os.environ.get(ENV) or None


def run(args: argparse.Namespace) -> dict[str, Any]:
    from dreams_nas.nas.stages.search import SearchOptions, search_run
    from dreams_nas.nas.stages.train import TrainOptions
    from dreams_nas.supernet.core.runfolder import RunFolder
    from dreams_nas.supernet.data.prompts import check_data

    check_data(args.data)  # every line now: a bad file fails before any model loads

    show = False if args.json or args.quiet else None
    train = TrainOptions(n_train=args.train_prompts, warmup_steps=args.train_steps,
                         multires_steps=args.train_steps, max_new_tokens=args.max_new_tokens)
    options = SearchOptions(
        objective=args.objective, front=args.front, method=args.method, trials=args.trials,
        storage=storage_of(args),
        study_name=args.study_name,
        hardware=hardware_of(args.run, args.hardware, args.compile, args.batch_size),
        max_draft_ms=args.max_draft_ms,
        data=args.data, limit=args.limit, max_new_tokens=args.max_new_tokens, verify=args.verify,
        verify_prompts=args.verify_prompts, verify_repeats=args.verify_repeats,
        retime=not args.no_retime, device=args.device, dtype=args.dtype,
        threads=args.threads,
        seed=args.seed, show_progress=show, write_report=not args.no_report, train=train)
    return search_run(RunFolder(args.run), options)


def hardware_of(run: str, hardware: str | None, compile: str | None,
                batch: int | None = None) -> str | None:
    """--hardware, or the one profiled id of compiled (--compile on) or eager (off) steps and
    of batch `batch` (--batch-size; an id of batch B > 1 ends in -b<B>)."""
    if compile is None and batch is None:
        return hardware
    from dreams_nas.nas.stages.inputs import profiled_hardware
    from dreams_nas.supernet.core.errors import InputError
    from dreams_nas.supernet.core.runfolder import RunFolder

    want = None if compile is None else compile == "on"
    kind = {None: "", True: "compiled ", False: "eager "}[want]
    size = 1 if batch is None else batch

    def fits(hw_id: str) -> bool:
        base, b = split_batch(hw_id)
        return b == size and (want is None or base.endswith(COMPILED) == want)

    if hardware is not None:
        if not fits(hardware):
            asked = " ".join(x for x in (f"--compile {compile}" if compile else "",
                                         f"--batch-size {batch}" if batch else "") if x)
            raise InputError(f"--hardware {hardware} is not a profile of {kind}steps at batch "
                             f"{size} ({asked}); give one of them")
        return hardware
    ids = [h for h in profiled_hardware(RunFolder(run)) if fits(h)]
    if len(ids) != 1:
        how = " ".join(x for x in (f"--compile {compile}" if compile else "",
                                   f"--batch-sizes {size}" if size != 1 else "") if x)
        pick = "--hardware" + (" or --compile on|off" if want is None and ids else "")
        raise InputError(f"{len(ids)} profiles of {kind}steps at batch {size} in {run} "
                         f"({', '.join(ids) or 'none'}); pick one with {pick}, or profile "
                         f"with `dreams-nas profile{' ' + how if how else ''}`")
    return ids[0]


def split_batch(hardware_id: str) -> tuple[str, int]:
    """(the id without its batch, the batch): ``cpu-x-1t-compiled-b8`` -> (``cpu-x-1t-compiled``,
    8); an id without ``-b<B>`` is batch 1 (`latency.measure.hardware.detect_hardware`)."""
    match = re.search(r"-b(\d+)$", hardware_id)
    return (hardware_id, 1) if match is None else (hardware_id[:match.start()],
                                                   int(match.group(1)))


COMPILED = "-compiled"  # a profile of compiled steps: `latency.measure.hardware.detect_hardware`
