"""The speculative cycle's own cost: the ``cycle`` and ``cycle_tree`` steps of the profile.

The expected-speedup formula prices a cycle's draft steps and the target's verify pass from
their own timings. A real cycle does more: acceptance (the greedy comparison, or the
sampling rule), the target's cache rollback (a crop for a chain, the KV compaction of the
accepted path for a tree), the draft's cache crop and the queueing of the accepted tokens,
building the next inputs, the loop's bookkeeping. This module times that rest, on the real
code path:

* one timed repeat runs `supernet.decoding.loop.cycle` -- the very function `generate` runs
  per cycle -- with the real target adapter and a real draft extracted from the supernet (the
  profile's largest subnet, as the verify steps are prepared with), a chain of draft_len = k - 1
  drafts or the space's tree of k - 1 nodes, at temperature 0;
* the target's ``verify`` / ``verify_tree`` calls and the draft's forward and ``logits``
  calls run inside a `ForwardTimer` (through thin wrappers around the adapter and the
  draft module), and the sample is the cycle's time less the time inside them
  (`timing.measure`'s ``excluded``), read on the same clock;
* before every repeat (untimed) the target's cache is cut back to the prompt and the drafter
  restarted on it (`DreamDrafter.start`), so every repeat runs the same cycle.

On CUDA the cycle is timed with CUDA events (as every step) and each forward between two
events recorded on the stream around it: the sample is the GPU time of the cycle not spent in
the forwards' kernels -- the gaps where the GPU waits for the host (acceptance's copy to the
host, the loop's Python, launches) plus the bookkeeping's own small kernels. No synchronisation
is added beyond the loop's own, so the host work that overlaps queued kernels in real decoding
overlaps them here too and is not counted.

The row is exactly what the step kinds do not price, with one small double count: the draft
and verify steps are timed with their argmax and a cache crop, which here fall in the cycle's
rest. The profile's draft is untrained, so its cycles accept few drafts; the bookkeeping's cost
barely depends on how many.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from dreams_nas.latency.measure.plan import StepKey
from dreams_nas.latency.measure.profiler import Step


class ForwardTimer:
    """Time spent inside the priced forwards of the last timed cycle, on each clock the
    profiler reads: ``wall`` (perf_counter), ``cpu`` (thread CPU time) and ``cuda`` (CUDA
    events recorded around each forward; read after the cycle's end event was waited on)."""

    def __init__(self, device: torch.device | str) -> None:
        self.on_cuda = torch.device(device).type == "cuda"
        self.reset()

    def reset(self) -> None:
        self.wall_ns = 0
        self.cpu_ns = 0
        self.calls = 0
        self._events: list[tuple[Any, Any]] = []

    @contextmanager
    def inside(self) -> Iterator[None]:
        self.calls += 1
        if self.on_cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._events.append((start, end))
            return
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        try:
            yield
        finally:
            self.cpu_ns += time.thread_time_ns() - cpu
            self.wall_ns += time.perf_counter_ns() - wall

    def ms(self, clock: str) -> float:
        """Milliseconds inside the forwards since the last `reset`, on `clock`."""
        if clock == "cuda":
            return float(sum(start.elapsed_time(end) for start, end in self._events))
        if clock not in ("wall", "cpu"):
            raise ValueError(f"clock={clock!r} must be wall, cpu or cuda")
        return (self.cpu_ns if clock == "cpu" else self.wall_ns) / 1e6


class TimedTarget:
    """The target adapter with its forward passes (`verify`, `verify_tree`) timed; every other
    attribute is the adapter's."""

    def __init__(self, adapter: Any, timer: ForwardTimer) -> None:
        self._adapter, self._timer = adapter, timer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._adapter, name)

    def verify(self, *args: Any, **kwargs: Any) -> Any:
        with self._timer.inside():
            return self._adapter.verify(*args, **kwargs)

    def verify_tree(self, *args: Any, **kwargs: Any) -> Any:
        with self._timer.inside():
            return self._adapter.verify_tree(*args, **kwargs)


class TimedSteps:
    """A drafter's `DraftSteps` with its steps (`run`, `first`, `pick`: each a draft forward
    and its logits, eager or compiled) timed; every other attribute is the steps'."""

    def __init__(self, steps: Any, timer: ForwardTimer) -> None:
        self._steps, self._timer = steps, timer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._steps, name)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        with self._timer.inside():
            return self._steps.run(*args, **kwargs)

    def first(self, *args: Any, **kwargs: Any) -> Any:
        with self._timer.inside():
            return self._steps.first(*args, **kwargs)

    def pick(self, *args: Any, **kwargs: Any) -> Any:
        with self._timer.inside():
            return self._steps.pick(*args, **kwargs)


def cycle_step(adapter: Any, draft: Any, key: StepKey, prompt: torch.Tensor,
               last_token: torch.Tensor, tree: Any = None, pre: Any = None) -> Step:
    """The ``cycle`` / ``cycle_tree`` step of `key`: one `loop.cycle` with `draft` (an extracted
    `DreamDraft` subnet) drafting a chain of k - 1 tokens, or `tree` (a `TokenTree` of k - 1
    nodes), on `adapter` after the `prompt` (1, context_len) ids; `last_token` (1, 1) is the
    cycle's newest token. `pre`: the adapter's prefill output when its cache already holds
    the context (with the draft's layer's hidden states), else the prompt is prefilled here.
    Its sample excludes the forwards' time (module docstring)."""
    from dreams_nas.supernet.decoding.dream import DreamDrafter
    from dreams_nas.supernet.decoding.loop import cycle
    from dreams_nas.supernet.decoding.sampling import SamplingConfig

    timer = ForwardTimer(adapter.device)
    drafter = DreamDrafter(draft, draft.config.spec)
    drafter.steps = TimedSteps(drafter.steps, timer)  # type: ignore[assignment]
    target = TimedTarget(adapter, timer)
    sampling = SamplingConfig()
    draft_len = tree.draft_len if tree is not None else key.k - 1  # drafts it whole
    if pre is None:
        with torch.inference_mode():
            pre = adapter.prefill({"input_ids": prompt}, layers=drafter.required_layers)
    context = adapter.cache_len
    assert context == key.context_len

    @torch.inference_mode()
    def restart() -> None:  # the same cycle every repeat: the prompt in both caches
        adapter.rollback(adapter.cache_len - context)
        drafter.start(adapter, pre)

    @torch.inference_mode()
    def run() -> object:
        timer.reset()
        return cycle(target, drafter, last_token, draft_len, tree, sampling, None)  # type: ignore[arg-type]

    return Step(run, prepare=restart, excluded=timer.ms)
