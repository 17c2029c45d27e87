"""Time every planned step on one device and append each row to the profile as it is measured.

The profiler knows nothing about models: a `StepBuilder` turns a `StepKey` into a `Step`
whose ``run`` runs that one step (state such as a prefilled KV cache is set up by the builder
and restored by ``run``, so every repeat times the same work); its optional ``prepare`` runs
untimed before every repeat (see `timing.measure`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from dreams_nas.latency.measure.hardware import CpuFreqProbe, HardwareInfo, cpu_throttle_probe
from dreams_nas.latency.measure.nvml import NvmlDevice
from dreams_nas.latency.measure.order import blocks, timing_order
from dreams_nas.latency.measure.passes import PassJournal, journal_path
from dreams_nas.latency.measure.plan import StepKey
from dreams_nas.latency.measure.profile_store import ProfileStore, make_row
from dreams_nas.latency.measure.timing import Repeats, Timing, measure

log = logging.getLogger("dreams_nas.latency")


@dataclass(frozen=True)
class Step:
    """One timed step: ``run`` is timed; ``prepare`` (optional) runs untimed before each repeat;
    ``excluded`` (optional) gives, per clock, the milliseconds of the last ``run`` that the
    sample leaves out (`timing.measure`)."""

    run: Callable[[], object]
    prepare: Callable[[], object] | None = None
    excluded: Callable[[str], float] | None = None


class StepBuilder(Protocol):
    """Builds the `Step` of `key` on the builder's device."""

    visual_tokens: int  # visual tokens in one prompt of the target (for featurisation)

    def build(self, key: StepKey) -> Step: ...


@dataclass(frozen=True)
class TimingSettings:
    warmup: int = 3
    min_repeats: int = 5
    repeats: int = 30  # at most this many timed repeats per step
    budget_s: float = 2.0  # ... or until this many seconds have passed
    threads: int | None = None  # CPU: fixed torch thread count (None: leave as is)
    clock: str = "wall"  # CPU: "wall" (perf_counter) or "cpu" (thread CPU time, threads=1)
    passes: int = 1  # > 1: interleave the repeats of `chunk` keys over this many passes
    chunk: int = 16  # keys timed together (and appended together) when passes > 1; 0: all

    @property
    def n_passes(self) -> int:
        """The passes actually run: at most `repeats` (every pass times at least one repeat)."""
        return max(1, min(self.passes, self.repeats))

    def signature(self) -> dict:
        """What a (step, pass) timing depends on (`passes.PassJournal`)."""
        return {"warmup": self.warmup, "min_repeats": self.min_repeats,
                "repeats": self.repeats, "budget_s": self.budget_s, "threads": self.threads,
                "clock": self.clock, "passes": self.n_passes}


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
    shuffle_seed: int | None = 0,
) -> ProfileResult:
    """Time each key not yet in `store` and append its row at once (kill-safe, resumable).

    With ``settings.passes > 1`` keys are timed in blocks of ``settings.chunk`` (0: all of
    them) whose repeats are interleaved over the passes (see `_time_block`); a block's rows are
    appended together when its last pass ends. Each (key, pass) timing is journaled as it is
    measured (`passes.PassJournal`), so a kill loses at most the step in flight: a rerun takes
    the journaled passes back and the journal goes once every key's row is written.

    The keys are timed in an order shuffled by `shuffle_seed` (None: as given, each context's
    target steps gathered where the first of them is), so that a slow
    drift of the machine (other load, heat) spreads over the grid as noise instead of
    correlating with one axis of it; the target's steps of one context are shuffled as one unit
    and timed side by side, so that the ratios between them, which every speedup divides, come
    from the same seconds (`order.timing_order`); a block never splits a unit.

    A step that runs out of memory is recorded with status ``oom`` (``failed`` for other
    runtime errors) and profiling goes on.
    """
    from dreams_nas.supernet.core.progress import progress

    done = store.done_keys()
    units = timing_order([k for k in keys if k.ident not in done], shuffle_seed)
    todo = [key for unit in units for key in unit]
    skipped = len(keys) - len(todo)
    if skipped:
        log.info("resuming: %d of %d measurements already in %s", skipped, len(keys), store.path)
    measured = failed = 0
    passes = settings.n_passes
    journal = PassJournal(journal_path(store.path), settings.signature())
    journaled = journal.load()
    if journaled:
        log.info("resuming: %d timed passes of unfinished steps in %s", journaled, journal.path)
    cuda_index = int(hw.device.split(":")[1]) if hw.kind == "cuda" else None
    cpu_probe = CpuFreqProbe() if cpu_throttle_probe() is not None else None
    with NvmlDevice(cuda_index) if cuda_index is not None else _NoProbe(cpu_probe) as probe:
        bar = progress(total=len(todo) * passes, desc=f"profile {hw.hardware_id}",
                       unit="pass", disable=None if show_progress is None else not show_progress)

        def tick(key: StepKey) -> None:
            bar.set_postfix_str(f"{key.kind} {key.spec_id or ''} "
                                f"ctx={key.context_len} k={key.k}", refresh=False)
            bar.update(1)

        try:
            size = 1 if passes <= 1 else (settings.chunk or max(1, len(todo)))
            for block in blocks(units, size):
                rows = _time_block(builder, block, hw, settings, probe, journal, tick)
                measured += store.append(rows)
                failed += sum(row["status"] != "ok" for row in rows)
        finally:
            bar.close()
    if {k.ident for k in keys} <= store.done_keys():
        journal.close()  # every row written: the journal has nothing left to give
    return ProfileResult(measured=measured, skipped=skipped, failed=failed)


def _time_block(builder: StepBuilder, block: Sequence[StepKey], hw: HardwareInfo,
                settings: TimingSettings, probe: NvmlDevice | CpuFreqProbe | None,
                journal: PassJournal | None = None,
                tick: Callable[[StepKey], None] | None = None) -> list[dict]:
    """Rows of `block`: each key timed in `settings.passes` interleaved passes (a pass times
    every key of the block once with its share of the repeats), so that the machine's drift
    over the block's time spreads over all its keys; the samples of the passes are pooled.
    A (key, pass) in `journal` is taken from it; one timed here is added to it."""
    passes = settings.n_passes
    timings: dict[tuple, list[Timing]] = {k.ident: [] for k in block}
    failures: dict[tuple, dict] = {}
    for p in range(passes):
        share = TimingSettings(  # the repeats split over the passes: they add up to `repeats`
            warmup=settings.warmup, min_repeats=max(1, _part(settings.min_repeats, passes, p)),
            repeats=_part(settings.repeats, passes, p), budget_s=settings.budget_s / passes,
            threads=settings.threads, clock=settings.clock)
        for key in (block if p % 2 == 0 else block[::-1]):
            kept = journal.get(key.ident, p) if journal is not None else None
            if kept is not None:
                timings[key.ident].append(kept)
            elif key.ident not in failures:
                result = _time_one(builder, key, hw, share, probe)
                if isinstance(result, dict):
                    failures[key.ident] = result
                else:
                    timings[key.ident].append(result)
                    if journal is not None:
                        journal.add(key.ident, p, result)
            if tick is not None:
                tick(key)
    rows = []
    for key in block:
        if key.ident in failures:
            rows.append(failures[key.ident])
            continue
        parts = timings[key.ident]
        pooled = Timing(samples_ms=tuple(s for t in parts for s in t.samples_ms),
                        warmup=sum(t.warmup for t in parts),
                        throttled=any(t.throttled for t in parts),
                        clock_mhz=tuple(c for t in parts for c in t.clock_mhz))
        rows.append(make_row(hw, key, pooled, clock=settings.clock))
    return rows


def _part(total: int, parts: int, index: int) -> int:
    """Pass `index`'s share of `total` split over `parts` passes (the shares sum to `total`)."""
    return total // parts + (1 if index < total % parts else 0)


def _time_one(builder: StepBuilder, key: StepKey, hw: HardwareInfo, settings: TimingSettings,
              probe: NvmlDevice | CpuFreqProbe | None) -> Timing | dict:
    """The step's timing, or the row recording why it could not be timed."""
    try:
        step = builder.build(key)
        repeats = Repeats(warmup=settings.warmup, min_repeats=settings.min_repeats,
                          max_repeats=settings.repeats, budget_s=settings.budget_s)
        timing = measure(step.run, repeats,
                         device=hw.device, threads=settings.threads, probe=probe,
                         clock=settings.clock if hw.kind == "cpu" else "wall", prepare=step.prepare,
                         excluded=step.excluded)
        del step
        return timing
    except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        status = "oom" if isinstance(exc, MemoryError) or _is_oom(exc) else "failed"
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
    """Stands in for the NVML context on the CPU (yields the cpufreq probe, if any)."""

    def __init__(self, probe: CpuFreqProbe | None = None) -> None:
        self.probe = probe

    def __enter__(self) -> CpuFreqProbe | None:
        return self.probe

    def __exit__(self, *exc: object) -> None:
        return None
