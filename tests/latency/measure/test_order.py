from __future__ import annotations

from _support.latency import ToyBuilder
from dreams_nas.latency.kinds import DRAFT_KINDS
from dreams_nas.latency.measure.hardware import detect_hardware
from dreams_nas.latency.measure.order import blocks, target_unit, timing_order
from dreams_nas.latency.measure.plan import StepKey, build_plan
from dreams_nas.latency.measure.profile_store import ProfileStore
from dreams_nas.latency.measure.profiler import TimingSettings, run_profile
from dreams_nas.supernet.core.space import SearchSpace
from hypothesis import given
from hypothesis import strategies as st

SPACE = SearchSpace(heads=(1, 2, 4), visual_keep=(0.5, 1.0), inject_layer=(2,),
                    draft_len=(1, 3, 5))
CONTEXTS = (24, 40, 56)


def _is_target(key: StepKey) -> bool:
    return key.kind not in DRAFT_KINDS


def test_a_unit_puts_the_decode_in_the_middle_and_the_chain_verifies_beside_it() -> None:
    keys = [StepKey("decode", 40)] + [StepKey("verify", 40, k) for k in range(2, 9)] + [
        StepKey("cycle", 40, k) for k in (2, 4, 6)]
    unit = target_unit(keys[::-1])
    middle = [key.kind for key in unit].index("decode")
    assert sorted(unit) == sorted(keys)
    assert abs(middle - (len(unit) - 1) / 2) <= 0.5
    near = unit[middle - 3:middle] + unit[middle + 1:middle + 4]
    assert {key.kind for key in near} == {"verify"}  # the six next to the decode are verifies
    assert {key.kind for key in (unit[0], unit[-1])} == {"cycle"}  # the cycles outside them


def test_each_contexts_target_steps_are_one_unit_and_every_key_is_timed_once() -> None:
    keys = build_plan(SPACE, CONTEXTS, verify_ks=(2, 4, 6))
    units = timing_order(keys, seed=3)
    flat = [key for unit in units for key in unit]
    assert sorted(flat) == sorted(keys)
    target_units = [unit for unit in units if _is_target(unit[0])]
    assert len(target_units) == len(CONTEXTS)
    for unit in target_units:
        assert all(_is_target(key) for key in unit)
        assert len({key.context_len for key in unit}) == 1
        assert sum(key.kind == "decode" for key in unit) == 1
    assert all(len(unit) == 1 for unit in units if not _is_target(unit[0]))
    # shuffled: the units do not come in the plan's order, and another seed orders them apart
    assert flat != [key for unit in timing_order(keys, seed=None) for key in unit]
    assert units != timing_order(keys, seed=4)


def test_without_a_seed_the_units_keep_the_order_their_first_key_is_given() -> None:
    keys = [StepKey("decode", 24), StepKey("verify", 40, 2), StepKey("decode", 40),
            StepKey("verify", 24, 2)]
    units = timing_order(keys, seed=None)
    assert [unit[0].context_len for unit in units] == [24, 40]


@given(st.lists(st.integers(min_value=1, max_value=9), max_size=30),
       st.integers(min_value=1, max_value=40))
def test_blocks_never_split_a_unit_and_close_at_the_first_unit_end_past_the_size(
        lengths: list[int], size: int) -> None:
    units = [[StepKey("verify", 10 + i, k) for k in range(2, 2 + n)]
             for i, n in enumerate(lengths)]
    cut = blocks(units, size)
    assert [key for block in cut for key in block] == [key for unit in units for key in unit]
    for block in cut:
        contexts = [key.context_len for key in block]
        assert all(contexts.count(c) == lengths[c - 10] for c in set(contexts))  # whole units
    assert all(len(block) >= size for block in cut[:-1])
    for block in cut:
        last = [key.context_len for key in block][-1]
        assert len(block) - lengths[last - 10] < size  # it closed at the first unit end past it


def test_a_pass_times_each_contexts_target_steps_one_after_another(tmp_path) -> None:
    """In every pass (forwards, then backwards) a context's target steps are visited together,
    the decode step among them; the blocks cut no unit, and every key is written once."""
    keys = build_plan(SPACE, CONTEXTS, verify_ks=(2, 4, 6))
    visits: list[StepKey] = []

    class Recording(ToyBuilder):
        def build(self, key):
            visits.append(key)
            return super().build(key)

    store = ProfileStore(tmp_path / "profile.csv")
    settings = TimingSettings(warmup=1, min_repeats=2, repeats=4, budget_s=5.0, threads=1,
                              passes=2, chunk=7)
    run_profile(Recording(hidden=32, heads=8, visual_tokens=8), keys, store,
                detect_hardware("cpu", threads=1), settings, show_progress=False)
    assert len(store.ok_rows()) == len(keys)
    assert len(visits) == 2 * len(keys)
    unit_size = len([key for key in keys if _is_target(key) and key.context_len == 24])
    for context in CONTEXTS:
        at = [i for i, key in enumerate(visits) if _is_target(key) and key.context_len == context]
        assert len(at) == 2 * unit_size
        for run in (at[:unit_size], at[unit_size:]):  # one visit per pass, side by side
            assert run == list(range(run[0], run[0] + unit_size))
            kinds = [visits[i].kind for i in run]
            assert abs(kinds.index("decode") - (unit_size - 1) / 2) <= 0.5
