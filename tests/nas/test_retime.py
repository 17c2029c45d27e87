"""`nas.stages.retime`: the best subnet's steps timed again beside the verification."""

from __future__ import annotations

import pytest
from dreams_nas.latency.measure.timing import Timing
from dreams_nas.nas.search.candidate import Candidate
from dreams_nas.nas.search.speedup import expected_speedup
from dreams_nas.nas.stages.retime import Retimer, retime_lines
from dreams_nas.supernet.core.spec import SubnetSpec

SPEC = SubnetSpec(2, 1.0, 4, 5)


def _candidate(**parts) -> Candidate:
    base = {"draft_ms": 1.0, "first_draft_ms": 2.0, "verify_ms": 8.0, "decode_ms": 6.0,
            "cycle_overhead_ms": 0.5}
    base.update(parts)
    speedup = float(expected_speedup(5.0, SPEC.draft_len, base["draft_ms"], base["verify_ms"],
                                     base["decode_ms"], first_draft_ms=base["first_draft_ms"],
                                     cycle_overhead_ms=base["cycle_overhead_ms"]))
    return Candidate(spec=SPEC, tau=5.0, tau_ci=(4.5, 5.5), speedup=speedup, draft_params=1,
                     feasible=True, **base)


class _Steps:
    """Records the keys built; every step's timing comes from `now` (by kind)."""

    def __init__(self) -> None:
        self.keys = []

    def build(self, key):
        from dreams_nas.latency.measure.profiler import Step

        self.keys.append(key)
        return Step(lambda: None)


@pytest.fixture
def timed(monkeypatch):
    now = {"decode": 6.6, "verify": 8.0, "draft": 1.5, "draft_first": 2.0, "cycle": 0.5}
    calls = []

    def fake_measure(run, repeats, **kwargs):
        calls.append({**kwargs, "max_repeats": repeats.max_repeats})
        return Timing(samples_ms=(now[fake_measure.kind],) * repeats.max_repeats, warmup=0,
                      throttled=False)

    real_build = _Steps.build

    def build(self, key):
        fake_measure.kind = key.kind
        return real_build(self, key)

    monkeypatch.setattr(_Steps, "build", build)
    monkeypatch.setattr("dreams_nas.latency.measure.timing.measure", fake_measure)
    return now, calls


def test_the_parts_are_the_profiles_keys_and_the_formula_prices_them(timed) -> None:
    now, calls = timed
    steps, cand = _Steps(), _candidate()
    retimer = Retimer(steps, cand, context_len=80, max_draft_len=7, repeats=4, threads=1)
    retimer(0)
    retimer(1)
    kinds = [(k.kind, k.context_len, k.k, k.spec and k.spec.draft_len) for k in steps.keys[:5]]
    assert kinds == [("decode", 80, 1, None), ("verify", 80, 6, None), ("draft", 80, 1, 7),
                     ("draft_first", 80, 1, 7), ("cycle", 80, 6, None)]
    assert len(steps.keys) == 10 and {c["threads"] for c in calls} == {1}
    out = retimer.summary(measured_speedup=2.0)
    assert out["samples"] == 8 and out["context_len"] == 80
    assert out["drift_pct"] == {"decode_ms": 10.0, "verify_ms": 0.0, "draft_ms": 50.0,
                                "first_draft_ms": 0.0, "cycle_overhead_ms": 0.0}
    expected = 5.0 * 6.6 / (4 * 1.5 + 2.0 + 8.0 + 0.5)
    assert out["speedup"] == pytest.approx(expected)
    assert out["gap_pct"] == pytest.approx((2.0 - expected) / expected * 100)
    line, stale = retime_lines(out, cand)
    assert "draft 1.5 ms (+50%)" in line and f"{expected:.2f}x" in line
    assert stale is not None and "draft step now takes +50%" in stale
    assert "rerun `dreams-nas profile`" in stale


def test_an_unpriced_cycle_is_not_retimed_and_a_steady_machine_is_not_stale(timed) -> None:
    now, _ = timed
    now.update(decode=6.0, draft=1.0)
    steps, cand = _Steps(), _candidate(cycle_overhead_ms=0.0)
    retimer = Retimer(steps, cand, context_len=80, max_draft_len=5, repeats=3)
    retimer(0)
    assert [k.kind for k in steps.keys] == ["decode", "verify", "draft", "draft_first"]
    out = retimer.summary(measured_speedup=cand.speedup)
    assert out["ms"]["cycle_overhead_ms"] == 0.0 and "cycle_overhead_ms" not in out["drift_pct"]
    assert out["speedup"] == pytest.approx(cand.speedup) and out["gap_pct"] == pytest.approx(0)
    assert retime_lines(out, cand)[1] is None
