"""The timed steps: a verify is prepared by a subnet's draft steps, as the loop runs it."""

from __future__ import annotations

from dreams_nas.latency.plan import StepKey
from dreams_nas.latency.steps import ModelSteps, build_supernet
from dreams_nas.supernet.core.device import resolve_dtype, torch_dtype
from dreams_nas.supernet.core.space import SearchSpace


def _steps(tiny_llava: str, precede) -> ModelSteps:
    from dreams_nas.nas.stages.profile import load_target

    adapter = load_target(tiny_llava, "cpu", torch_dtype(resolve_dtype("auto", "cpu")))
    space = SearchSpace(heads=(1, 4), visual_keep=(0.5, 1.0), inject_layer=(1, 2), draft_len=(1, 3))
    supernet = build_supernet(adapter.model, space)
    return ModelSteps(adapter, supernet, visual_tokens=4,
                      precede=space.largest() if precede else None)


def test_verify_is_prepared_by_the_draft_steps_of_the_preceding_subnet(tiny_llava) -> None:
    steps = _steps(tiny_llava, precede=True)
    calls = []
    original = steps._draft_step

    def counting(key):
        step = original(key)

        def run():
            calls.append(key.spec.id)
            return step()

        return run

    steps._draft_step = counting
    verify = steps.build(StepKey("verify", 20, 4))
    assert verify.prepare is not None
    verify.prepare()
    assert calls == ["h4-v1.00-l2-g3"] * 3  # the largest subnet, its draft_len steps
    before = steps.adapter.cache_len
    verify.run()
    assert steps.adapter.cache_len == before == 20  # the verify rolls itself back
    # decode is timed back to back, as plain decoding runs it
    assert steps.build(StepKey("decode", 20, 1)).prepare is None


def test_without_a_preceding_subnet_the_verify_is_timed_hot(tiny_llava) -> None:
    steps = _steps(tiny_llava, precede=False)
    assert steps.build(StepKey("verify", 20, 4)).prepare is None


def test_a_tree_verify_and_a_tree_level_step_run_and_roll_back(tiny_llava) -> None:
    import torch
    from dreams_nas.supernet.core.space import SubnetSpec
    from dreams_nas.supernet.core.tree import TokenTree

    steps = _steps(tiny_llava, precede=False)
    steps.trees = {7: TokenTree((2, 2))}
    verify = steps.build(StepKey("verify_tree", 20, 7))  # the 6 nodes of 2x2 and the root
    ranked = verify.run()
    assert ranked.shape == (1, 7) and steps.adapter.cache_len == 20
    level = steps.build(StepKey("draft", 20, 4, SubnetSpec(4, 1.0, 1, 1)))
    children = level.run()
    assert children.shape == (4, 4)  # every node of the level ranks its top children
    assert torch.equal(children, level.run())  # the draft's cache is cropped back


def test_a_deeper_narrower_subnet_is_extracted_and_timed(tiny_llava, tmp_path) -> None:
    """The supernet covers the space's depths and MLP widths; a draft step runs the extracted
    subnet's own depth and channels, re-extracted when either changes; its row records both."""
    from dreams_nas.latency.hardware import detect_hardware
    from dreams_nas.latency.profiler import TimingSettings, run_profile
    from dreams_nas.latency.store import ProfileStore
    from dreams_nas.nas.stages.profile import load_target
    from dreams_nas.supernet.core.space import SubnetSpec

    adapter = load_target(tiny_llava, "cpu", torch_dtype(resolve_dtype("auto", "cpu")))
    space = SearchSpace(heads=(1, 4), visual_keep=(0.5, 1.0), inject_layer=(1, 2),
                        draft_len=(1, 3), depth=(1, 2), mlp=(0.5, 1.0))
    supernet = build_supernet(adapter.model, space)
    assert (supernet.config.num_layers, supernet.config.mlp_shares) == (2, (0.5, 1.0))
    steps = ModelSteps(adapter, supernet, visual_tokens=4)
    small = SubnetSpec(4, 1.0, 2, 3, depth=2, mlp=0.5)
    steps.build(StepKey("draft", 20, 1, small)).run()
    compact = steps._compact[1]
    assert steps._compact[0] == small.arch
    assert (len(compact.layers_in), len(compact.layers_out)) == (2, 2)
    assert compact.config.intermediate_size == supernet.config.mlp_channels(0.5)
    steps.build(StepKey("draft", 20, 1, small.replace(depth=1))).run()  # same triple
    assert len(steps._compact[1].layers_in) == 1  # re-extracted: keyed by the architecture
    key = StepKey("draft_first", 20, 1, small)
    settings = TimingSettings(warmup=1, min_repeats=2, repeats=2, budget_s=1.0, threads=1)
    store = ProfileStore(tmp_path / "profile.csv")
    result = run_profile(steps, [key], store, detect_hardware("cpu", threads=1), settings,
                         show_progress=False)
    assert (result.measured, result.failed) == (1, 0)
    row = store.ok_rows().iloc[0]
    assert (row.spec_id, row.depth, row.mlp, row.n_samples) == (small.id, 2, 0.5, 2)


def test_a_supernet_config_must_cover_the_spaces_depths_and_widths(tiny_llava) -> None:
    import pytest
    from dreams_nas.latency.steps import text_config
    from dreams_nas.nas.stages.profile import load_target
    from dreams_nas.supernet.core.errors import InputError
    from dreams_nas.supernet.draft.config import DraftConfig

    adapter = load_target(tiny_llava, "cpu", torch_dtype(resolve_dtype("auto", "cpu")))
    space = SearchSpace(heads=(1, 4), visual_keep=(1.0,), inject_layer=(1, 2), draft_len=(1,),
                        depth=(1, 3), mlp=(0.25, 1.0))
    shallow = DraftConfig.for_target(text_config(adapter.model.config), inject_layers=(1, 2),
                                     num_heads=4, num_layers=2, mlp_shares=(0.25, 1.0))
    with pytest.raises(InputError, match=r"depths \[3\] exceed the supernet's 2 layer\(s\)"):
        build_supernet(adapter.model, space, shallow)
    narrow = DraftConfig.for_target(text_config(adapter.model.config), inject_layers=(1, 2),
                                    num_heads=4, num_layers=3)
    with pytest.raises(InputError, match=r"MLP widths \[0.25\] are not ones the supernet was "
                                         r"trained at \[1.0\]"):
        build_supernet(adapter.model, space, narrow)
