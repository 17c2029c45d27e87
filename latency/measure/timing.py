"""Timing one step done right: warm-up, repeats within a time budget, the right clock.

* CUDA: kernels run asynchronously, so a wall clock around the call measures only the launch.
  Each repeat records a CUDA event before and after the step on the current stream and
  synchronises on the end event; ``elapsed_time`` is the GPU time between them.
* CPU: ``time.perf_counter_ns`` around the call with torch's intra-op thread count fixed for the
  whole measurement (and restored after), since the thread count changes the latency.
  ``clock="cpu"`` instead reads the calling thread's CPU time (``time.thread_time_ns``): with one
  thread, that is the step's compute time without the time the scheduler gave to other
  processes -- the figure a quiet machine would show, measurable on a shared one. It is only
  valid with ``threads=1`` (other threads' work would be missed) and is recorded as such.

`prepare` (optional) runs untimed before every warm-up call and every timed sample, to put the
machine in the state the step meets in real use (e.g. the target's verify pass before the first
draft step of a cycle, which evicts the draft's weights from the CPU caches). On CUDA the
device is synchronised after it, so its kernels are not in the step's time.

`excluded` (optional) is what a sample leaves out: called after each timed call with the
clock's name (``wall``, ``cpu`` or ``cuda``), it returns the milliseconds of that call which
another kind of step already prices -- the model forwards inside a timed speculative cycle
(`dreams_nas.latency.measure.cycle`) -- read on the same clock, and the sample is the rest.

The raw samples are kept; the summary is the median with the 10th and 90th percentiles, and a
flag when the clock dropped or the driver reported a slowdown reason during the sample.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from dreams_nas.supernet.core.device import torch_threads


class ClockProbe(Protocol):
    """Reads the chip's state between repeats (NVML on a GPU)."""

    def sm_clock_mhz(self) -> int | None: ...

    def throttle_mask(self) -> int: ...


@dataclass(frozen=True)
class Timing:
    """Samples of one step in milliseconds and their summary."""

    samples_ms: tuple[float, ...]
    warmup: int
    throttled: bool
    clock_mhz: tuple[int, ...] = ()  # clocks read during the samples (empty when unknown)

    @property
    def n_samples(self) -> int:
        return len(self.samples_ms)

    @property
    def median_ms(self) -> float:
        return float(np.median(self.samples_ms))

    @property
    def p10_ms(self) -> float:
        return float(np.percentile(self.samples_ms, 10))

    @property
    def p90_ms(self) -> float:
        return float(np.percentile(self.samples_ms, 90))


# A timing is flagged throttled when the SM clock fell more than this share below its highest.
CLOCK_DROP = 0.10


@dataclass(frozen=True)
class Repeats:
    """How often a step is timed: `warmup` untimed calls, then repeats until `max_repeats` or
    until `budget_s` seconds have passed (but at least `min_repeats`)."""

    warmup: int = 3
    min_repeats: int = 5
    max_repeats: int = 50
    budget_s: float = 1.0


def measure(step: Callable[[], object], repeats: Repeats = Repeats(), *, device: str = "cpu",
            threads: int | None = None, clock: str = "wall", probe: ClockProbe | None = None,
            prepare: Callable[[], object] | None = None,
            excluded: Callable[[str], float] | None = None) -> Timing:
    """Time `step()` `repeats` times (`Repeats`).

    `probe` (NVML) is read after every repeat; the timing is flagged `throttled` when a slowdown
    reason was set or the SM clock fell more than `CLOCK_DROP` below the highest clock seen.
    `prepare`, when given, runs untimed before every warm-up call and every sample;
    `excluded`, when given, is subtracted from every sample (module docstring).
    """
    warmup, min_repeats, max_repeats, budget_s = (repeats.warmup, repeats.min_repeats,
                                                  repeats.max_repeats, repeats.budget_s)
    if min_repeats < 1 or max_repeats < min_repeats:
        raise ValueError(
            f"repeats must satisfy 1 <= min_repeats ({min_repeats}) <= max_repeats ({max_repeats})"
        )
    if warmup < 0 or budget_s <= 0:
        raise ValueError(f"warmup={warmup} must be >= 0 and budget_s={budget_s} > 0")
    on_cuda = str(device).startswith("cuda")
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock={clock!r} must be 'wall' or 'cpu'")
    if clock == "cpu" and (on_cuda or threads != 1):
        raise ValueError(
            f"clock='cpu' (thread CPU time) needs the CPU with threads=1, got device={device!r}, "
            f"threads={threads}; use clock='wall'"
        )
    timer = _time_thread if clock == "cpu" else _time_cpu
    with torch_threads(None if on_cuda else threads):
        for _ in range(warmup):
            _prepare(prepare, on_cuda, device)
            step()
        if on_cuda:
            import torch

            torch.cuda.synchronize(device)
        samples: list[float] = []
        clocks: list[int] = []
        throttled = False
        deadline = time.perf_counter() + budget_s
        while len(samples) < max_repeats:
            _prepare(prepare, on_cuda, device)
            sample = _time_cuda(step, device) if on_cuda else timer(step)
            if excluded is not None:
                sample -= excluded("cuda" if on_cuda else clock)
            samples.append(sample)
            if probe is not None:
                throttled |= bool(probe.throttle_mask())
                mhz = probe.sm_clock_mhz()
                if mhz:
                    clocks.append(int(mhz))
            if len(samples) >= min_repeats and time.perf_counter() >= deadline:
                break
    if clocks and min(clocks) < (1.0 - CLOCK_DROP) * max(clocks):
        throttled = True
    return Timing(samples_ms=tuple(samples), warmup=warmup, throttled=throttled,
                  clock_mhz=tuple(clocks))


def _prepare(prepare: Callable[[], object] | None, on_cuda: bool, device: str) -> None:
    if prepare is None:
        return
    prepare()
    if on_cuda:
        import torch

        torch.cuda.synchronize(device)  # the preparation's kernels are not the step's time


def _time_cpu(step: Callable[[], object]) -> float:
    start = time.perf_counter_ns()
    step()
    return (time.perf_counter_ns() - start) / 1e6


def _time_thread(step: Callable[[], object]) -> float:
    start = time.thread_time_ns()
    step()
    return (time.thread_time_ns() - start) / 1e6


def _time_cuda(step: Callable[[], object], device: str) -> float:
    import torch

    with torch.cuda.device(device):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))
