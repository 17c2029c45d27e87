"""The `dreams-nas` command line: a thin layer over library calls.

Each subcommand lives in `dreams_nas.nas.commands.<name>` and exposes ``HELP``,
``add_arguments(parser)`` and ``run(args) -> dict``. The dict is the command's summary: it is
printed as one JSON line with ``--json`` and logged otherwise. Command modules import heavy
libraries (torch, transformers, optuna) inside ``run`` so ``--help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any, NoReturn

from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.runfolder import DEFAULT_RUN_DIR

PROG = "dreams-nas"
log = logging.getLogger("dreams_nas")

# Subcommand name -> its module. Each feature adds its line here.
COMMANDS: dict[str, str] = {
    "data": "dreams_nas.nas.commands.data",
    "target": "dreams_nas.nas.commands.target",
    "generate": "dreams_nas.nas.commands.generate",
    "train": "dreams_nas.nas.commands.train",
    "profile": "dreams_nas.nas.commands.profile",
    "score": "dreams_nas.nas.commands.score",
    "search": "dreams_nas.nas.commands.search",
    "report": "dreams_nas.nas.commands.report",
    "demo": "dreams_nas.nas.commands.demo",
}


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2) instead of usage + message."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(2)


def _common_options() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    group = common.add_argument_group("common options")
    group.add_argument("--run", default=None, metavar="DIR",
                       help=f"run folder holding every artefact (default: ./{DEFAULT_RUN_DIR})")
    group.add_argument("--json", action="store_true",
                       help="print a one-line JSON summary on stdout (logs stay on stderr)")
    group.add_argument("-v", "--verbose", action="count", default=0,
                       help="more logging; with an error, show the traceback")
    group.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    group.add_argument("--seed", type=int, default=None, help="random seed (default: 0)")
    return common


def _command_module(name: str) -> ModuleType:
    return importlib.import_module(COMMANDS[name])


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Hardware-aware NAS of speculative-decoding drafts for vision-language models.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    common = _common_options()
    for name in COMMANDS:
        module = _command_module(name)
        child = sub.add_parser(name, help=module.HELP, description=module.HELP, parents=[common])
        module.add_arguments(child)
    return parser


def _setup_logging(verbose: int, quiet: bool) -> None:
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


@contextmanager
def _library_bars(shown: bool) -> Iterator[None]:
    """-q silences the libraries' progress bars too (Hugging Face's weight loading and shard
    writing): only warnings and errors reach stderr. Restored afterwards."""
    if shown:
        yield
        return
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def _finish(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(summary, sort_keys=True, default=str) + "\n")
        sys.stdout.flush()
    else:
        for key, value in summary.items():
            log.info("%s: %s", key, value)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns 0 on success, 2 on bad input, 1 on an internal error."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if getattr(args, "command", None) is None:
        parser.print_help(sys.stderr)
        return 2
    if args.seed is None:
        args.seed = 0
    if args.run is None:
        args.run = DEFAULT_RUN_DIR
    _setup_logging(args.verbose, args.quiet)
    try:
        with _library_bars(not args.quiet):
            summary = _command_module(args.command).run(args)
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted; rerun the same command to resume\n")
        return 130
    except (InputError, FileNotFoundError, NotADirectoryError, PermissionError) as exc:
        if args.verbose:
            traceback.print_exc()
        sys.stderr.write(f"{PROG} {args.command}: error: {_one_line(exc)}\n")
        return 2
    except Exception as exc:  # noqa: BLE001 - the top level reports every failure
        if args.verbose:
            traceback.print_exc()
        sys.stderr.write(
            f"{PROG} {args.command}: internal error: {type(exc).__name__}: {_one_line(exc)} "
            "(rerun with -v for the traceback)\n"
        )
        return 1
    _finish(summary or {}, args.json)
    return 0


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())


if __name__ == "__main__":
    raise SystemExit(main())
