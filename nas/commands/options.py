"""The options several commands share, declared once: one flag, one metavar, one default."""

from __future__ import annotations

import argparse


def add_device(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str) -> None:
    """``--device auto|cpu|cuda:N``; `what` says what runs there ("to time on")."""
    parser.add_argument("--device", default="auto", metavar="auto|cpu|cuda:N",
                        help=f"device {what} (default: auto = cuda:0 if present, else cpu)")


def add_threads(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str,
                default: str = "torch's own") -> None:
    """``--threads N``: torch CPU threads while `what` ("while scoring")."""
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help=f"CPU: torch threads {what} (default: {default})")


def add_data(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str) -> None:
    """``--data builtin|FILE.jsonl``; `what` names the prompts ("evaluation prompts")."""
    parser.add_argument("--data", default="builtin", metavar="builtin|FILE.jsonl",
                        help=f"{what}: the built-in synthetic set or a LLaVA-style JSONL")
