from __future__ import annotations

import time

import pytest
import torch
from dreams_nas.latency.measure.timing import Repeats, measure
from dreams_nas.supernet.core.device import torch_threads
from dreams_nas.supernet.core.errors import InputError


def test_repeats_stop_at_the_budget_but_not_below_min_repeats() -> None:
    calls = []
    timing = measure(lambda: (calls.append(1), time.sleep(0.02)),
                     Repeats(warmup=2, min_repeats=3, max_repeats=100, budget_s=0.05))
    assert 3 <= timing.n_samples < 10
    assert len(calls) == timing.n_samples + 2  # warm-up calls are not timed
    assert all(s >= 19.0 for s in timing.samples_ms)
    assert timing.p10_ms <= timing.median_ms <= timing.p90_ms
    assert 19.0 <= timing.median_ms < 60.0


def test_max_repeats_caps_the_samples() -> None:
    assert measure(lambda: None,
                   Repeats(warmup=0, min_repeats=1, max_repeats=7, budget_s=10)).n_samples == 7


def test_cpu_timing_uses_the_fixed_thread_count_and_restores_it() -> None:
    before = torch.get_num_threads()
    seen = []
    measure(lambda: seen.append(torch.get_num_threads()),
            Repeats(warmup=1, min_repeats=3, max_repeats=3), threads=1)
    assert set(seen) == {1}
    assert torch.get_num_threads() == before
    with pytest.raises(InputError, match="--threads 0 must be at least 1"):
        with torch_threads(0):
            pass


class _Probe:
    def __init__(self, clocks, masks):
        self.clocks, self.masks = list(clocks), list(masks)

    def sm_clock_mhz(self):
        return self.clocks.pop(0)

    def throttle_mask(self):
        return self.masks.pop(0)


def test_throttle_flag_from_reasons_or_a_clock_drop() -> None:
    steady = measure(lambda: None, Repeats(warmup=0, min_repeats=3, max_repeats=3),
                     probe=_Probe([1980, 1980, 1975], [0, 0, 0]))
    assert not steady.throttled and steady.clock_mhz == (1980, 1980, 1975)
    reason = measure(lambda: None, Repeats(warmup=0, min_repeats=3, max_repeats=3),
                     probe=_Probe([1980] * 3, [0, 0x40, 0]))
    assert reason.throttled
    dropped = measure(lambda: None, Repeats(warmup=0, min_repeats=3, max_repeats=3),
                      probe=_Probe([1980, 1500, 1980], [0, 0, 0]))
    assert dropped.throttled


def test_prepare_runs_untimed_before_every_warmup_call_and_sample(monkeypatch) -> None:
    class FakeClock:  # prepare takes 1 s, the step 2 ms: only the step may be in a sample
        now = 0

        def perf_counter_ns(self) -> int:
            return self.now

        def perf_counter(self) -> float:
            return self.now / 1e9

    clock = FakeClock()
    monkeypatch.setattr("dreams_nas.latency.measure.timing.time", clock)
    events: list[str] = []

    def prepare() -> None:
        events.append("prepare")
        clock.now += 1_000_000_000

    def step() -> None:
        events.append("step")
        clock.now += 2_000_000

    timing = measure(step, Repeats(warmup=2, min_repeats=3, max_repeats=4, budget_s=10.0),
                     prepare=prepare)
    assert timing.n_samples == 4 and timing.samples_ms == (2.0,) * 4
    assert events == ["prepare", "step"] * (2 + 4)


def test_bad_repeat_settings_are_refused() -> None:
    with pytest.raises(ValueError, match=r"1 <= min_repeats \(5\) <= max_repeats \(2\)"):
        measure(lambda: None, Repeats(min_repeats=5, max_repeats=2))


@pytest.mark.cuda
def test_cuda_events_time_the_kernel_not_the_launch() -> None:
    x = torch.randn(4096, 4096, device="cuda")
    timing = measure(lambda: x @ x, Repeats(warmup=3, max_repeats=10), device="cuda:0")
    torch.cuda.synchronize()
    start = time.perf_counter()
    x @ x  # no synchronize: a wall clock sees only the launch
    launch_ms = (time.perf_counter() - start) * 1e3
    torch.cuda.synchronize()
    start = time.perf_counter()
    x @ x
    torch.cuda.synchronize()
    synced_ms = (time.perf_counter() - start) * 1e3
    assert timing.median_ms > 3 * launch_ms
    assert 0.5 * synced_ms < timing.median_ms < 2 * synced_ms
