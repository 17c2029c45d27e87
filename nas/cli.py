"""The `dreams-nas` command line: a thin layer over library calls.

Each subcommand lives in `dreams_nas.nas.commands.<name>` and exposes ``HELP``,
``add_arguments(parser)`` and ``run(args) -> dict``. The dict is the command's summary: it is
printed as one JSON line with ``--json`` and logged otherwise. Command modules import heavy
libraries (torch, transformers, optuna) inside ``run`` so ``--help`` stays instant.
"""

from __future__ import annotations

import argparse
import errno
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
from dreams_nas.supernet.core.io import finite_or_null
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
    "export": "dreams_nas.nas.commands.export",
    "demo": "dreams_nas.nas.commands.demo",
}

# The commands that split their work over the ranks of a torchrun launch.
DISTRIBUTED = ("train", "score")

# Spellings retired by a rename (one name per idea, docs/glossary.md) -> what to write now.
RETIRED_OPTIONS: dict[str, str] = {
    "--run-dir": "--run DIR (under torchrun: `-m dreams_nas.nas.cli -- COMMAND --run DIR`)",
}
RETIRED_ACTIONS: dict[tuple[str, str], str] = {
    ("target", "build-demo"): "`dreams-nas target build-builtin`",
}


def retired_spelling(argv: Sequence[str]) -> str | None:
    """The one-line error for the first retired spelling in `argv` (an option as ``--old`` or
    ``--old=VALUE``; a command's action word right after the command), else None."""
    for i, arg in enumerate(argv):
        if arg == "--":
            return None
        old = arg.split("=", 1)[0]
        if old in RETIRED_OPTIONS:
            return f"{old} was renamed: write {RETIRED_OPTIONS[old]}"
        if i and (argv[i - 1], arg) in RETIRED_ACTIONS:
            return f"{argv[i - 1]} {arg} was renamed: write {RETIRED_ACTIONS[argv[i - 1], arg]}"
    return None


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2) instead of usage + message."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(2)


def _common_options() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    group = common.add_argument_group("common options")
    group.add_argument("--run", dest="run", default=None, metavar="DIR",
                       help=f"run folder holding every artefact (default: ./{DEFAULT_RUN_DIR}); "
                            "under torchrun put `--` after `-m dreams_nas.nas.cli` (torchrun's "
                            "own parser reads --run as its --run-path)")
    group.add_argument("--json", action="store_true",
                       help="print a one-line JSON summary on stdout (logs stay on stderr)")
    group.add_argument("-v", "--verbose", action="count", default=0,
                       help="more logging; with an error, show the traceback")
    group.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    group.add_argument("--seed", type=int, default=None, help="random seed (default: 0)")
    return common


def _command_module(name: str) -> ModuleType:
    return importlib.import_module(COMMANDS[name])


def package_version() -> str:
    """The installed distribution's version (pyproject.toml's), or a note that it is not
    installed (run from a bare checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dreams-nas")
    except PackageNotFoundError:
        return "unknown (the dreams-nas distribution is not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Hardware-aware NAS of speculative-decoding drafts for vision-language models.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {package_version()}")
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
        line = json.dumps(finite_or_null(summary), sort_keys=True, default=str, allow_nan=False)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    else:
        for key, value in summary.items():
            log.info("%s: %s", key, value)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns 0 on success, 2 on bad input, 1 on an internal error."""
    parser = build_parser()
    retired = retired_spelling(sys.argv[1:] if argv is None else argv)
    if retired is not None:
        sys.stderr.write(f"{PROG}: error: {retired}\n")
        return 2
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
    main_rank = True
    try:
        with _ranks(args) as main_rank, _library_bars(not args.quiet):
            summary = _command_module(args.command).run(args)
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted; rerun the same command to resume\n")
        return 130
    except InputError as exc:
        return _user_error(args, exc)
    except OSError as exc:
        if is_environment_error(exc):
            return _user_error(args, exc)
        return _internal_error(args, exc)
    except Exception as exc:  # noqa: BLE001 - the top level reports every failure
        return _internal_error(args, exc)
    if main_rank:  # under torchrun, rank 0 reports for all
        _finish(summary or {}, args.json)
    return 0


@contextmanager
def _ranks(args: argparse.Namespace) -> Iterator[bool]:
    """Under torchrun (several processes): join the process group for the command (train and
    score split their work by rank, `supernet.core.dist`); ranks other than 0 log warnings
    only and print no summary. Yields whether this process reports."""
    from dreams_nas.supernet.core import dist

    if not dist.launched():
        yield True
        return
    if args.command not in DISTRIBUTED:
        raise InputError(f"`{PROG} {args.command}` runs in one process; launch it without "
                         f"torchrun (only {' and '.join(DISTRIBUTED)} split their work by rank)")
    from dreams_nas.supernet.core.device import resolve_device

    with dist.process_group(resolve_device(getattr(args, "device", "auto"))) as world:
        if not world.is_main:
            args.quiet = True
            log.setLevel(logging.WARNING)
        yield world.is_main


def _user_error(args: argparse.Namespace, exc: Exception) -> int:
    """An expected failure (bad input, the user's disk): one line, the traceback with -v;
    exit 2."""
    if args.verbose:
        traceback.print_exc()
    sys.stderr.write(f"{PROG} {args.command}: error: {_user_message(exc)}\n")
    return 2


def _internal_error(args: argparse.Namespace, exc: BaseException) -> int:
    """A bug (or a failure nobody foresaw): its type and text, the traceback with -v; exit 1."""
    if args.verbose:
        traceback.print_exc()
    sys.stderr.write(
        f"{PROG} {args.command}: internal error: {type(exc).__name__}: {_one_line(exc)} "
        "(rerun with -v for the traceback)\n"
    )
    return 1


# OS errors that are the user's environment, not a bug, each with its fix: a read-only,
# protected or full disk, a path that is a folder where a file is wanted, or the reverse.
_ENVIRONMENT_ERRNOS: dict[int, str] = {
    errno.EROFS: "pass a folder on a writable disk (e.g. --run DIR)",
    errno.EACCES: "check its permissions, or pass another path (e.g. --run DIR)",
    errno.EPERM: "check its permissions, or pass another path (e.g. --run DIR)",
    errno.ENOSPC: "free some disk space, or pass a folder on another disk (e.g. --run DIR)",
    errno.EDQUOT: "free some of your disk quota, or pass a folder on another disk (--run DIR)",
    errno.EFBIG: "the file system refuses a file that large: pass a folder on another disk",
    errno.EISDIR: "it is a folder: pass the path of a file",
    errno.ENOTDIR: "a part of the path is a file, not a folder: pass another path",
    errno.ENOENT: "check the path",
    errno.ENAMETOOLONG: "use a shorter path",
    errno.ELOOP: "the path is a loop of symbolic links: pass the real path",
}


def is_environment_error(exc: OSError) -> bool:
    """Whether `exc` is the user's environment (a one-line error, exit 2) rather than a bug."""
    return (isinstance(exc, FileNotFoundError | NotADirectoryError | PermissionError
                       | IsADirectoryError)
            or exc.errno in _ENVIRONMENT_ERRNOS)


def _user_message(exc: BaseException) -> str:
    """One line for an expected failure: an InputError's own text; for an OS error with an
    errno, the path, the errno's text and the fix."""
    if isinstance(exc, InputError) or not isinstance(exc, OSError) or not exc.errno:
        return _one_line(exc)
    text = exc.strerror or errno.errorcode.get(exc.errno, f"errno {exc.errno}")
    name = errno.errorcode.get(exc.errno, str(exc.errno))
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    where = f"{' -> '.join(paths)}: " if paths else ""
    fix = _ENVIRONMENT_ERRNOS.get(exc.errno)
    return " ".join(f"{where}{text} ({name})".split()) + (f"; {fix}" if fix else "")


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())


if __name__ == "__main__":
    raise SystemExit(main())
