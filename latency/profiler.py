"""Time every planned step on one device and append each row to the profile as it is measured.

The profiler knows nothing about models: a `StepBuilder` turns a `StepKey` into a callable
that runs that one step (state such as a prefilled KV cache is set up by the builder and
restored by the callable, so every repeat times the same work).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .hardware import HardwareInfo, NvmlDevice
from .plan import StepKey
from .store import ProfileStore, make_row
from .timing import measure

log = logging.getLogger("dreams_nas.latency")


class StepBuilder(Protocol):
    """Builds the callable that runs one step of `key` on the builder's device."""

    visual_tokens: int  # visual tokens in one prompt of the target (for featurisation)

    def build(self, key: StepKey) -> Callable[[], object]: ...


@dataclass(frozen=True)
class TimingSettings:
    warmup: int = 3
    min_repeats: int = 5
    repeats: int = 30  # at most this many timed repeats per step
    budget_s: float = 2.0  # ... or until this many seconds have passed
    threads: int | None = None  # CPU: fixed torch thread count (None: leave as is)
    clock: str = "wall"  # CPU: "wall" (perf_counter) or "cpu" (thread CPU time, threads=1)


@dataclass(frozen=True)
class ProfileResult:
    measured: int  # rows written by this call
    skipped: int  # keys already in the profile (resumed)
    failed: int  # rows written with status oom/failed


def _is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def run_profile(
    builder: StepBuilder,
    keys: Sequence[StepKey],
    store: ProfileStore,
    hw: HardwareInfo,
    settings: TimingSettings = TimingSettings(),
    *,
    show_progress: bool | None = None,
) -> ProfileResult:
    """Time each key not yet in `store` and append its row at once (kill-safe, resumable).

    A step that runs out of memory is recorded with status ``oom`` (``failed`` for other
    runtime errors) and profiling goes on.
    """
    from dreams_nas.supernet.progress import progress

    done = store.done_keys()
    todo = [k for k in keys if k.ident not in done]
    skipped = len(keys) - len(todo)
    if skipped:
        log.info("resuming: %d of %d measurements already in %s", skipped, len(keys), store.path)
    measured = failed = 0
    cuda_index = int(hw.device.split(":")[1]) if hw.kind == "cuda" else None
    with NvmlDevice(cuda_index) if cuda_index is not None else _NoProbe() as probe:
        bar = progress(total=len(todo), desc=f"profile {hw.hardware_id}", unit="step",
                       disable=None if show_progress is None else not show_progress)
        try:
            for key in todo:
                bar.set_postfix_str(f"{key.kind} {key.spec_id or ''} ctx={key.context_len} k={key.k}")
                row = _time_one(builder, key, hw, settings, probe)
                measured += store.append([row])
                failed += row["status"] != "ok"
                bar.update(1)
        finally:
            bar.close()
    return ProfileResult(measured=measured, skipped=skipped, failed=failed)


def _time_one(builder: StepBuilder, key: StepKey, hw: HardwareInfo, settings: TimingSettings,
              probe: NvmlDevice | None) -> dict:
    try:
        step = builder.build(key)
        timing = measure(step, device=hw.device, warmup=settings.warmup,
                         min_repeats=settings.min_repeats, max_repeats=settings.repeats,
                         budget_s=settings.budget_s, threads=settings.threads, probe=probe,
                         clock=settings.clock if hw.kind == "cpu" else "wall")
        del step
        return make_row(hw, key, timing, clock=settings.clock)
    except RuntimeError as exc:  # torch.OutOfMemoryError is a RuntimeError
        status = "oom" if _is_oom(exc) else "failed"
        log.warning("%s step %s at context %d, k=%d: %s (%s); recorded, continuing",
                    key.kind, key.spec_id, key.context_len, key.k, status, exc)
        _free_cuda(hw)
        return make_row(hw, key, None, status=status, error=f"{type(exc).__name__}: {exc}",
                        clock=settings.clock)


def _free_cuda(hw: HardwareInfo) -> None:
    if hw.kind == "cuda":
        import torch

        torch.cuda.empty_cache()


class _NoProbe:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
