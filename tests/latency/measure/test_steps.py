"""The timed steps: a verify is prepared by a subnet's draft steps, as the loop runs it."""

from __future__ import annotations

from dreams_nas.latency.measure.plan import StepKey
from dreams_nas.latency.measure.steps import ModelSteps, build_supernet
from dreams_nas.supernet.core.device import resolve_dtype, torch_dtype
from dreams_nas.supernet.core.space import SearchSpace


def _steps(tiny_llava: str, precede) -> ModelSteps:
    from dreams_nas.supernet.target.adapter import TargetAdapter

    adapter = TargetAdapter.load(tiny_llava, device="cpu",
                                 dtype=torch_dtype(resolve_dtype("auto", "cpu")))
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


def test_a_chained_draft_step_is_prepared_by_a_verify_and_the_first_draft_step(tiny_llava
                                                                               ) -> None:
    """With `chain_drafts`, as the loop runs a cycle's later draft steps: after the target's
    verify (over the space's deepest chain + 1) and the first draft step (over the accepted
    tokens) on the same draft cache, untimed."""
    from dreams_nas.latency.measure.steps import first_positions

    steps = _steps(tiny_llava, precede=False)
    spec = steps.supernet.active.replace(heads=1, visual_keep=0.5, draft_len=3)
    assert steps.build(StepKey("draft", 20, 1, spec)).prepare is None  # the profile: hot
    steps.chain_drafts = True  # what benchmarks/bench_draft_chain.py sets beside it
    events: list[tuple] = []
    verify = steps.adapter.verify

    def counting_verify(tokens, layers):
        events.append(("verify", int(tokens.shape[1])))
        return verify(tokens, layers)

    def draft_forward(module, args, kwargs):  # (ids, prev feature, positions, memory)
        cache = kwargs["cache"]
        events.append(("draft", int(args[0].shape[1]), id(cache), cache.length))

    steps.adapter.verify = counting_verify
    steps._extracted(spec).register_forward_pre_hook(draft_forward, with_kwargs=True)
    for k in (1, 3):  # a chain's step, a tree level of 3 nodes
        step = steps.build(StepKey("draft", 20, k, spec))
        events.clear()  # the draft's pass over the prompt at build
        step.prepare()
        (_, n), (_, width, first_cache, text) = events
        assert n == 4 and width == first_positions(3)  # verify over max_draft_len + 1
        assert steps.adapter.cache_len == 20  # the verify rolled itself back
        events.clear()
        step.run()
        assert events == [("draft", k, first_cache, text)]  # the same cache, cropped back
    assert steps.build(StepKey("draft_first", 20, 1, spec)).prepare is not None


def test_without_a_preceding_subnet_the_verify_is_timed_hot(tiny_llava) -> None:
    steps = _steps(tiny_llava, precede=False)
    assert steps.build(StepKey("verify", 20, 4)).prepare is None


def test_a_tree_verify_and_a_tree_level_step_run_and_roll_back(tiny_llava) -> None:
    import torch
    from dreams_nas.supernet.core.spec import SubnetSpec
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
    from dreams_nas.latency.measure.hardware import detect_hardware
    from dreams_nas.latency.measure.profile_store import ProfileStore
    from dreams_nas.latency.measure.profiler import TimingSettings, run_profile
    from dreams_nas.supernet.core.spec import SubnetSpec
    from dreams_nas.supernet.target.adapter import TargetAdapter

    adapter = TargetAdapter.load(tiny_llava, device="cpu",
                                 dtype=torch_dtype(resolve_dtype("auto", "cpu")))
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
    from dreams_nas.latency.measure.steps import text_config
    from dreams_nas.supernet.core.errors import InputError
    from dreams_nas.supernet.draft.config import DraftConfig
    from dreams_nas.supernet.target.adapter import TargetAdapter

    adapter = TargetAdapter.load(tiny_llava, device="cpu",
                                 dtype=torch_dtype(resolve_dtype("auto", "cpu")))
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


# --- the draft vocabulary ---------------------------------------------------------------------
VOCAB_SPACE = SearchSpace(heads=(1, 4), visual_keep=(0.5, 1.0), inject_layer=(1, 2),
                          draft_len=(1, 3), draft_vocab=(0.25, 1.0), trees=((2, 1),))


def _vocab_steps(folder: str, precede=None):
    """ModelSteps over the large-vocabulary target, and a recorder of its LM head's calls as a
    module (the full head: what a draft vocabulary below 1 must not run)."""
    from dreams_nas.supernet.target.adapter import TargetAdapter

    adapter = TargetAdapter.load(folder, device="cpu",
                                 dtype=torch_dtype(resolve_dtype("auto", "cpu")))
    supernet = build_supernet(adapter.model, VOCAB_SPACE)
    calls: list[tuple[int, ...]] = []
    head = adapter.model.get_output_embeddings()
    head.register_forward_hook(lambda module, args, out: calls.append(tuple(out.shape)))
    steps = ModelSteps(adapter, supernet, visual_tokens=4, precede=precede,
                       trees=VOCAB_SPACE.trees)
    return steps, calls


def test_a_draft_step_at_a_quarter_vocabulary_computes_only_its_head_rows(
        large_vocab_llava, monkeypatch) -> None:
    import math

    import torch
    from dreams_nas.supernet.core.space import vocab_rows
    from dreams_nas.supernet.core.spec import SubnetSpec

    steps, calls = _vocab_steps(large_vocab_llava)
    LARGE_VOCAB = steps.vocab
    assert LARGE_VOCAB == 16_001
    supernet = steps.supernet
    assert supernet.config.vocab_shares == (0.25, 1.0)  # the untrained supernet offers both
    assert supernet.vocab_order.shape == (LARGE_VOCAB,)
    rows = math.ceil(0.25 * LARGE_VOCAB)
    assert rows == vocab_rows(LARGE_VOCAB, 0.25) == 4_001
    shapes: list[tuple[int, ...]] = []
    linear = torch.nn.functional.linear

    def recording(x, weight, bias=None):
        shapes.append(tuple(weight.shape))
        return linear(x, weight, bias)

    monkeypatch.setattr(torch.nn.functional, "linear", recording)
    quarter = SubnetSpec(4, 1.0, 2, 3, draft_vocab=0.25)
    step = steps.build(StepKey("draft", 20, 1, quarter))
    compact = steps._compact[1]
    assert steps._compact[0] == quarter.arch
    assert compact.vocab_order.shape == (rows,)  # the extracted subnet keeps its prefix
    calls.clear(), shapes.clear()
    token = step.run()
    assert calls == []  # the target's full LM head never ran ...
    assert (rows, 32) in shapes and (LARGE_VOCAB, 32) not in shapes  # ... only its rows did
    assert int(token) in set(compact.vocab_order.tolist())  # argmax within the vocabulary
    level = steps.build(StepKey("draft", 20, 2, quarter))  # a tree level of 2 nodes
    calls.clear()
    children = level.run()
    assert calls == [] and children.shape == (2, 4)
    assert set(children.flatten().tolist()) <= set(compact.vocab_order.tolist())
    whole = steps.build(StepKey("draft", 20, 1, quarter.replace(draft_vocab=1.0)))
    assert not hasattr(steps._compact[1], "vocab_order")  # re-extracted, whole vocabulary
    calls.clear()
    whole.run()
    assert calls == [(1, 1, LARGE_VOCAB)]  # the whole head, once, on the last position


def test_a_cycle_drafts_with_the_subnets_vocabulary(large_vocab_llava) -> None:
    from dreams_nas.supernet.core.spec import SubnetSpec

    quarter = SubnetSpec(4, 1.0, 2, 3, draft_vocab=0.25)
    for spec, draft_heads in ((quarter, 0), (quarter.replace(draft_vocab=1.0), 3)):
        steps, calls = _vocab_steps(large_vocab_llava, precede=spec)
        step = steps.build(StepKey("cycle", 20, 4))
        step.prepare()
        calls.clear()
        step.run()
        # the target's verify over 4 positions; the draft's 3 steps run the full head only at
        # the whole vocabulary
        full = [c for c in calls if c[-1] == steps.vocab and c[1] == 1]
        assert len(full) == draft_heads, calls
        verify = steps.build(StepKey("verify", 20, 4))  # prepared by the subnet's 3 steps
        calls.clear()
        verify.prepare()
        assert len(calls) == draft_heads


def test_a_supernet_config_must_offer_the_spaces_draft_vocabularies(tiny_llava) -> None:
    import pytest
    from dreams_nas.latency.measure.steps import text_config
    from dreams_nas.supernet.core.errors import InputError
    from dreams_nas.supernet.draft.config import DraftConfig
    from dreams_nas.supernet.target.adapter import TargetAdapter

    adapter = TargetAdapter.load(tiny_llava, device="cpu",
                                 dtype=torch_dtype(resolve_dtype("auto", "cpu")))
    space = SearchSpace(heads=(1, 4), visual_keep=(1.0,), inject_layer=(1, 2), draft_len=(1,),
                        draft_vocab=(0.25, 1.0))
    whole = DraftConfig.for_target(text_config(adapter.model.config), inject_layers=(1, 2),
                                   num_heads=4)
    with pytest.raises(InputError, match=r"draft vocabularies \[0.25\] are not shares the "
                                         r"supernet offers \[1.0\]; .*`--draft-vocab`"):
        build_supernet(adapter.model, space, whole)
    offered = DraftConfig.for_target(text_config(adapter.model.config), inject_layers=(1, 2),
                                     num_heads=4, vocab_shares=(0.25, 0.5, 1.0))
    assert build_supernet(adapter.model, space, offered).config.vocab_shares == (0.25, 0.5, 1.0)


def test_a_profile_of_a_space_with_draft_vocabularies_records_both(large_vocab_llava,
                                                                    tmp_path) -> None:
    from dreams_nas.latency.measure.hardware import detect_hardware
    from dreams_nas.latency.measure.plan import build_plan
    from dreams_nas.latency.measure.profile_store import ProfileStore
    from dreams_nas.latency.measure.profiler import TimingSettings, run_profile

    steps, _ = _vocab_steps(large_vocab_llava)
    keys = [k for k in build_plan(VOCAB_SPACE, [20]) if k.kind == "draft" and k.k == 1
            and (k.spec.heads, k.spec.visual_keep) == (4, 1.0)]
    assert sorted(k.spec.draft_vocab for k in keys) == [0.25, 1.0]
    settings = TimingSettings(warmup=1, min_repeats=2, repeats=2, budget_s=1.0, threads=1)
    store = ProfileStore(tmp_path / "profile.csv")
    result = run_profile(steps, keys, store, detect_hardware("cpu", threads=1), settings,
                         show_progress=False)
    assert (result.measured, result.failed) == (2, 0)
    rows = store.ok_rows()
    assert sorted(rows.draft_vocab) == [0.25, 1.0]
    assert {s for s in rows.spec_id if "-n0.25-" in s} == {"h4-v1.00-l2-n0.25-g3"}


def _count_prefills(adapter) -> list[int]:
    lengths: list[int] = []
    original = adapter.prefill

    def counting(inputs, *args, **kwargs):
        lengths.append(int(inputs["input_ids"].shape[1]))
        return original(inputs, *args, **kwargs)

    adapter.prefill = counting
    return lengths


def _run_keys(steps: ModelSteps, keys) -> None:
    for key in keys:
        step = steps.build(key)
        for _ in range(2):
            if step.prepare is not None:
                step.prepare()
            step.run()


def test_the_target_is_prefilled_once_per_context_and_steps_share_it(tiny_llava) -> None:
    """A prefill's cost is not a step's: the cache of each context is filled once and every
    step at that context rolls back to it (target steps, a cycle, a first draft step), however
    the contexts alternate and whoever prefilled in between."""
    import torch

    steps = _steps(tiny_llava, precede=True)
    adapter = steps.adapter
    lengths = _count_prefills(adapter)
    keys = [StepKey("decode", 20, 1), StepKey("verify", 20, 4), StepKey("cycle", 20, 4),
            StepKey("draft_first", 20, 1, steps.precede), StepKey("decode", 24, 1),
            StepKey("verify", 20, 3), StepKey("cycle", 24, 4), StepKey("decode", 20, 1)]
    steps.prefilled(20)
    first = [layer.keys.clone() for layer in adapter.cache.layers]
    _run_keys(steps, keys)
    assert lengths == [20, 24]
    adapter.prefill(dict(input_ids=torch.zeros((1, 20), dtype=torch.long)))  # someone else's
    steps.build(StepKey("decode", 20, 1)).run()
    assert lengths == [20, 24, 20]  # ours swapped back in, not refilled
    steps.prefilled(20)
    assert adapter.cache_len == 20
    for layer, keys_before in zip(adapter.cache.layers, first, strict=True):
        assert torch.equal(layer.keys, keys_before)  # the very prefill, rolled back to it


def test_kept_caches_fit_their_budget_least_recently_used_first(tiny_llava) -> None:
    from dreams_nas.latency.measure.prefills import KeptPrefills, cache_bytes

    steps = _steps(tiny_llava, precede=False)
    lengths = _count_prefills(steps.adapter)
    steps.prefilled(20)
    one = cache_bytes(steps.adapter.cache)
    assert one > 0
    steps.prefills = KeptPrefills(steps.adapter, budget_bytes=int(2.5 * one))
    _run_keys(steps, [StepKey("decode", n, 1) for n in (20, 21, 20, 22, 21, 20)])
    # 20, 21 kept; 22 pushes out the least recently used (21); 21 back pushes out 20
    assert lengths == [20, 20, 21, 22, 21, 20]
    assert len(steps.prefills) == 2


def test_static_steps_time_the_loops_compiled_steps_at_one_capacity(tiny_llava) -> None:
    """With the adapter's steps compiled (dynamo's capture, its `eager` backend), every kind of
    step runs on caches of one capacity whatever its context, the draft's over a static cache
    too, each step leaves the caches as it found them, and a second round of the same keys
    compiles nothing."""
    from dreams_nas.supernet.decoding.draft_steps import DraftSteps
    from dreams_nas.supernet.draft.state import StaticDraftCache
    from dreams_nas.supernet.target.static import CAPACITY_STEP
    from torch._dynamo.utils import counters

    steps = _steps(tiny_llava, precede=True)
    steps.positions = 300  # two capacity steps
    spec = steps.supernet.active.replace(heads=1, visual_keep=0.5, draft_len=3)
    # a draft step first: its cache is made before the target's (from `positions`)
    keys = [StepKey("draft", 20, 1, spec), StepKey("decode", 20, 1), StepKey("verify", 40, 4),
            StepKey("draft_first", 40, 1, spec), StepKey("cycle_tree", 40, 4),
            StepKey("verify_tree", 40, 5), StepKey("verify_tree", 40, 3),
            StepKey("verify_tree", 20, 5)]
    graphs = []
    for mode in ("compiled", "compiled"):
        if steps.adapter.step_mode != mode:
            steps.adapter.use_steps(mode, backend="eager")
        before = counters["stats"]["unique_graphs"]
        for key in keys:
            step = steps.build(key)
            if step.prepare is not None:
                step.prepare()
            step.run()
            assert steps.adapter.static.capacity in (0, 2 * CAPACITY_STEP), key
            if key.kind == "draft":  # the extracted subnet's caches, before the next extraction
                caches = list(DraftSteps.of(steps._compact[1])._caches.values())
            if key.kind in ("decode", "verify"):
                assert steps.adapter.cache_len == key.context_len  # rolled back
        graphs.append(counters["stats"]["unique_graphs"] - before)
    assert caches and all(isinstance(c, StaticDraftCache) and c.capacity == 2 * CAPACITY_STEP
                          for c in caches)
    assert graphs[0] > 0 and graphs[1] == 0
    steps.adapter.use_steps("dynamic")
