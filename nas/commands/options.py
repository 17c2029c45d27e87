"""The options several commands share, declared once: one flag, one metavar, one default."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable


def add_device(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str) -> None:
    """``--device auto|cpu|cuda:N``; `what` says what runs there ("to time on")."""
    parser.add_argument("--device", default="auto", metavar="auto|cpu|cuda:N",
                        help=f"device {what} (default: auto = cuda:0 if present, else cpu)")


DTYPE_CHOICES = ("auto", "float32", "float16", "bfloat16")


def add_dtype(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
              default: str = "the run's dtype, else auto") -> None:
    """``--dtype auto|float32|float16|bfloat16``: the one dtype of target and draft."""
    parser.add_argument("--dtype", default=None, choices=DTYPE_CHOICES,
                        help=f"dtype of target and draft (default: {default}; auto = float32 "
                             "on the CPU, bfloat16 on GPUs that run it natively (compute "
                             "capability 8.0+), else float16)")


def add_compile(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                what: str = "") -> None:
    """``--compile auto|on|off``: the decoding steps compiled over static caches; `what` says
    what else it does in this command."""
    parser.add_argument("--compile", default="auto", choices=("auto", "on", "off"),
                        help="run the target's and the draft's steps over static KV caches, "
                             "each shape compiled once (torch.compile: CUDA graphs on a GPU, "
                             "inductor on the CPU; the first call of a shape compiles it, "
                             f"seconds){'; ' + what if what else ''}. auto (default) = on for "
                             "CUDA, off for the CPU, where compiling takes longer than it "
                             "saves a request")


def add_threads(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str,
                default: str = "torch's own") -> None:
    """``--threads N``: torch CPU threads while `what` ("while scoring")."""
    parser.add_argument("--threads", type=threads, default=None, metavar="N",
                        help=f"CPU: torch threads {what}, at most this machine's logical "
                             f"cores (default: {default})")


def threads(text: str) -> int:
    """An argparse type: a thread count from 1 to this machine's logical cores
    (`os.cpu_count()`). More threads than cores only time-share them, and a profile taken so
    would be recorded as another machine (its hardware id carries the thread count)."""
    value = whole(1)(text)
    cores = os.cpu_count()
    if cores is not None and value > cores:
        raise argparse.ArgumentTypeError(
            f"{value} threads is more than this machine's {cores} logical cores: give at most "
            f"{cores}")
    return value


def add_data(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str) -> None:
    """``--data builtin|FILE.jsonl``; `what` names the prompts ("evaluation prompts")."""
    parser.add_argument("--data", default="builtin", metavar="builtin|FILE.jsonl",
                        help=f"{what}: the built-in synthetic set or a LLaVA-style JSONL")


def whole(minimum: int = 1, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number in [minimum, maximum], else a one-line usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
            raise argparse.ArgumentTypeError(f"{value} is out of range: give a number {bound}")
        return value

    return parse


def real(low: float, high: float = math.inf, *, low_open: bool = False,
         high_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in the interval from `low` to `high` (open ends as
    asked), else a one-line usage error."""
    left, right = ("(" if low_open else "["), (")" if high_open else "]")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        inside = ((value > low if low_open else value >= low)
                  and (value < high if high_open else value <= high))
        if not math.isfinite(value) or not inside:
            bound = (f"{'>' if low_open else '>='} {low:g}" if math.isinf(high)
                     else f"in {left}{low:g}, {high:g}{right}")
            raise argparse.ArgumentTypeError(
                f"{value:g} is out of range: give a finite number {bound}")
        return value

    return parse

