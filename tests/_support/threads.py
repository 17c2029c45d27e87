"""One torch thread for the tiny models of the tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Tiny models on a shared 2-core machine: one intra-op thread avoids OpenMP
    oversubscription (40x slower steps under load); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
