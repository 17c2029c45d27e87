"""The cycle steps: the real loop's per-cycle work, timed without the models' forwards."""

from __future__ import annotations

import time

from dreams_nas.latency.measure.plan import StepKey
from dreams_nas.latency.measure.steps import ModelSteps, build_supernet
from dreams_nas.supernet.core.device import resolve_dtype, torch_dtype
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.core.tree import TokenTree

SPACE = SearchSpace(heads=(1, 4), visual_keep=(0.5, 1.0), inject_layer=(1, 2), draft_len=(1, 3),
                    trees=((2, 1),))


def _steps(tiny_llava: str) -> ModelSteps:
    from dreams_nas.supernet.target.adapter import TargetAdapter

    adapter = TargetAdapter.load(tiny_llava, device="cpu",
                                 dtype=torch_dtype(resolve_dtype("auto", "cpu")))
    supernet = build_supernet(adapter.model, SPACE)
    return ModelSteps(adapter, supernet, visual_tokens=4, precede=SPACE.largest(),
                      trees=SPACE.trees)


def test_a_chain_and_a_tree_cycle_run_the_loop_and_restart_each_repeat(tiny_llava) -> None:
    steps = _steps(tiny_llava)
    for key in (StepKey("cycle", 20, 4), StepKey("cycle_tree", 20, 5)):
        step = steps.build(key)
        assert step.prepare is not None and step.excluded is not None
        for _ in range(2):
            step.prepare()
            assert steps.adapter.cache_len == 20  # back to the prompt before every repeat
            accepted, depths, new, _ = step.run()
            assert depths == (3 if key.kind == "cycle" else 2)
            assert steps.adapter.cache_len == 20 + accepted.n + 1  # what the cycle kept
            assert len(new) >= 1
            # the model forwards ran under the timer: 3 draft passes + logits, 1 verify
            inside = step.excluded("wall")
            assert 0 < inside and step.excluded("cpu") > 0


def test_the_overhead_leaves_out_the_forwards_time(tiny_llava) -> None:
    """A target whose verify sleeps 200 ms: the cycle's sample does not grow by it."""
    from dreams_nas.latency.measure.timing import Repeats, measure

    steps = _steps(tiny_llava)
    plain = steps.build(StepKey("cycle", 20, 4))
    fast = measure(plain.run, Repeats(warmup=1, min_repeats=3, max_repeats=3),
                   prepare=plain.prepare, excluded=plain.excluded)
    adapter = steps.adapter
    verify = adapter.verify

    def slow_verify(*args, **kwargs):
        time.sleep(0.2)
        return verify(*args, **kwargs)

    adapter.verify = slow_verify
    try:
        slow = steps.build(StepKey("cycle", 20, 4))
        timed = measure(slow.run, Repeats(warmup=1, min_repeats=3, max_repeats=3),
                        prepare=slow.prepare, excluded=slow.excluded)
        whole = measure(slow.run, Repeats(warmup=0, min_repeats=3, max_repeats=3),
                        prepare=slow.prepare)
    finally:
        del adapter.verify
    assert all(s > 0 for s in timed.samples_ms)
    assert min(whole.samples_ms) >= 200  # the cycle itself did sleep
    assert max(timed.samples_ms) < 200  # ... and the overhead excludes it
    assert fast.median_ms > 0


def test_the_space_tree_of_a_cycle_tree_key_is_the_one_drafted(tiny_llava) -> None:
    steps = _steps(tiny_llava)
    assert steps._tree_of(5) == TokenTree((2, 1))


def test_the_profile_has_a_positive_cycle_row_per_draft_len_tree_and_context(tiny_llava,
                                                                         tmp_path) -> None:
    from dreams_nas.latency.measure.hardware import detect_hardware
    from dreams_nas.latency.measure.plan import build_plan
    from dreams_nas.latency.measure.profile_store import ProfileStore
    from dreams_nas.latency.measure.profiler import TimingSettings, run_profile

    steps = _steps(tiny_llava)
    contexts = (12, 20)
    keys = [k for k in build_plan(SPACE, contexts) if k.kind in ("cycle", "cycle_tree")]
    store = ProfileStore(tmp_path / "profile.csv")
    settings = TimingSettings(warmup=1, min_repeats=2, repeats=4, budget_s=1.0, threads=1,
                              clock="cpu", passes=2, chunk=0)
    result = run_profile(steps, keys, store, detect_hardware("cpu", threads=1), settings,
                         show_progress=False)
    assert (result.measured, result.failed) == (len(keys), 0)
    rows = store.ok_rows()
    chains = {("cycle", c, g + 1) for c in contexts for g in SPACE.draft_len}
    trees = {("cycle_tree", c, TokenTree(t).nodes + 1) for c in contexts for t in SPACE.trees}
    assert set(zip(rows.kind, rows.context_len, rows.k, strict=True)) == chains | trees
    assert (rows.median_ms > 0).all() and (rows.n_samples == 4).all()
    assert (rows.spec_id.fillna("") == "").all()  # target-like: keyed by k alone
