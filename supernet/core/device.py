"""Which device a command runs on: ``--device auto|cpu|cuda|cuda:N`` resolved against this machine.

torch is imported only when a device is resolved, so that `supernet.core` stays light.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from dreams_nas.supernet.core.errors import InputError

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(?::(\d+))?)$")


def available_devices() -> list[str]:
    """Devices torch can run on here, e.g. ``["cpu", "cuda:0"]``."""
    import torch

    return ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def resolve_device(text: str | None) -> str:
    """``auto|cpu|cuda|cuda:N`` (None: auto) -> a device that exists here, as a string like
    ``"cuda:0"``; else a one-line error naming the devices that do."""
    text = "auto" if text is None else text
    match = _DEVICE_RE.match(str(text).strip().lower())
    if match is None:
        raise InputError(
            f"--device {text!r} is not a device; use auto, cpu or cuda:N "
            f"(this machine has: {', '.join(available_devices())})"
        )
    value = match.group(1)
    existing = available_devices()
    if value == "auto":
        return "cuda:0" if "cuda:0" in existing else "cpu"
    if value == "cuda":
        value = "cuda:0"
    if value not in existing:
        seen = ("torch sees no CUDA device" if len(existing) == 1
                else f"torch sees {len(existing) - 1} CUDA device(s)")
        raise InputError(
            f"--device {value} does not exist on this machine; the devices here are: "
            f"{', '.join(existing)} ({seen}); pick one of them (or --device auto)"
        )
    return value


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run with exactly `threads` torch intra-op CPU threads (None: leave as is), restoring the
    previous count afterwards.

    Small models on a busy CPU often run faster on one thread: OpenMP workers spin waiting for
    each other when other processes hold the cores."""
    if threads is None:
        yield
        return
    if threads < 1:
        raise InputError(f"--threads {threads} must be at least 1")
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)
