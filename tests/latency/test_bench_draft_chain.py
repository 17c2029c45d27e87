"""benchmarks/bench_draft_chain.py: the loop's recorded draft calls split into each cycle's
first step and its later ones (nothing is timed)."""

from __future__ import annotations

import bench_draft_chain


def test_each_cycle_opens_with_its_first_step_and_the_prompt_pass_is_no_step() -> None:
    recorder = bench_draft_chain._Recorder()
    recorder.calls = [
        ("forward", 50.0),  # the draft's pass over the prompt at `start`: not a step
        ("propose", 0.0), ("forward", 3.0), ("logits", 1.0),  # cycle 1: first step
        ("forward", 2.0), ("logits", 0.5), ("forward", 2.5), ("logits", 0.5),  # two later
        ("propose", 0.0), ("forward", 4.0), ("logits", 1.0),  # cycle 2: draft_len 1
        ("propose", 0.0), ("forward", 3.5), ("logits", 0.5), ("forward", 1.5),
        ("logits", 0.25),
    ]
    first, later = recorder.steps()
    assert first == [4.0, 5.0, 4.0]
    assert later == [2.5, 3.0, 1.75]


def test_a_recorded_call_returns_the_callees_value_and_its_time() -> None:
    recorder = bench_draft_chain._Recorder()
    draft = bench_draft_chain._TimedDraft(type("D", (), {
        "__call__": lambda self, x: x + 1, "logits": lambda self, x: x * 2, "size": 7})(),
        recorder)
    assert draft(1) == 2 and draft.logits(3) == 6 and draft.size == 7
    assert [name for name, _ in recorder.calls] == ["forward", "logits"]
    assert all(ms >= 0 for _, ms in recorder.calls)


def test_the_targets_verify_calls_are_recorded_by_their_positions() -> None:
    import torch

    recorder = bench_draft_chain._Recorder()
    adapter = type("A", (), {"verify": lambda self, tokens, layers=(): tokens.sum(),
                             "cache_len": 12})()
    target = bench_draft_chain._TimedTarget(adapter, recorder)
    assert target.verify(torch.ones(1, 8, dtype=torch.long), (3,)) == 8
    assert target.verify(torch.ones(1, 1, dtype=torch.long)) == 1
    assert target.cache_len == 12
    assert [n for n, _ in recorder.target] == [8, 1] and not recorder.calls
