"""Which device and dtype a command runs in: ``--device auto|cpu|cuda|cuda:N`` and
``--dtype auto|float32|float16|bfloat16`` resolved against this machine.

torch is imported only when a device is resolved, so that `supernet.core` stays light.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dreams_nas.supernet.core.errors import InputError

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(?::(\d+))?)$")
DTYPES = ("float32", "float16", "bfloat16")
# bfloat16 runs natively (tensor cores, no emulation) from compute capability 8.0 on: A100,
# H100, L4, RTX 30xx/40xx; V100 (7.0), T4 and the RTX8000 (Turing, 7.5) have fp16 only.
BF16_MIN_CAPABILITY = (8, 0)


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


def native_bf16(device: str) -> bool:
    """Whether `device` (``cuda:N``) runs bfloat16 natively (compute capability 8.0+)."""
    import torch

    index = int(device.split(":", 1)[1]) if ":" in device else 0
    return tuple(torch.cuda.get_device_capability(index)) >= BF16_MIN_CAPABILITY


def resolve_dtype(name: str | None, device: str) -> str:
    """``--dtype`` (None or ``auto``: float32 on the CPU; on a GPU bfloat16 where it runs
    natively, else float16) -> one of `DTYPES`; a one-line error for anything else."""
    value = "auto" if name is None else str(name).strip().lower().removeprefix("torch.")
    if value == "auto":
        if not device.startswith("cuda"):
            return "float32"
        return "bfloat16" if native_bf16(device) else "float16"
    if value not in DTYPES:
        raise InputError(f"--dtype {name!r} is not supported; use auto or one of {list(DTYPES)}")
    return value


def torch_dtype(name: str) -> Any:
    """The torch dtype of one of `DTYPES` (``"bfloat16"`` -> ``torch.bfloat16``)."""
    import torch

    if name not in DTYPES:
        raise InputError(f"dtype {name!r} is not one of {list(DTYPES)}")
    return getattr(torch, name)


COMPILE_CHOICES = ("auto", "on", "off")


def resolve_compile(choice: str | None, device: str) -> str:
    """``--compile auto|on|off`` -> how the target's decoding steps run
    (`TargetAdapter.use_steps`): ``compiled`` (a static cache, each step compiled once per
    shape) or ``dynamic`` (HF's growing cache, eager). ``auto`` is what measured faster for the
    device's kind, compilation included: compiled on CUDA (CUDA graphs: seconds a shape, the
    step a fraction of its launches), eager on the CPU, where inductor's compilation (5-20 s a
    shape) outweighs what a request's steps save (BENCHMARKS.md, 'Compiled steps')."""
    choice = "auto" if choice is None else choice
    if choice not in COMPILE_CHOICES:
        raise InputError(f"--compile {choice!r} is not one of {', '.join(COMPILE_CHOICES)}; "
                         "give auto, on or off")
    if choice == "auto":
        choice = "on" if device.startswith("cuda") else "off"
    return "dynamic" if choice == "off" else "compiled"
