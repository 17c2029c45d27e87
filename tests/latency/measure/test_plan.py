from __future__ import annotations

import itertools

import numpy as np
import pytest
from dreams_nas.latency.measure.plan import (
    StepKey,
    build_plan,
    canonical_spec,
    latin_hypercube_grid,
    parse_budget,
    resolve_budget,
)
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.space import SearchSpace

SPACE = SearchSpace(heads=(1, 2, 3, 4), visual_keep=(0.25, 0.5, 0.75, 1.0),
                    inject_layer=(2, 4, 6, 8), draft_len=tuple(range(1, 8)))
CONTEXTS = (64, 128, 192, 256, 320)


def _draft_points(keys):
    return {(k.spec.heads, k.spec.visual_keep, k.context_len) for k in keys if k.kind == "draft"}


def test_small_grid_is_timed_whole_with_every_target_step() -> None:
    keys = build_plan(SPACE, CONTEXTS)
    assert _draft_points(keys) == set(itertools.product(SPACE.heads, SPACE.visual_keep, CONTEXTS))
    assert len({k.ident for k in keys}) == len(keys)
    target = {(k.kind, k.context_len, k.k) for k in keys if k.spec is None}
    assert target == {("decode", c, 1) for c in CONTEXTS} | {
        ("verify", c, k) for c in CONTEXTS for k in range(2, 9)} | {
        ("cycle", c, g + 1) for c in CONTEXTS for g in SPACE.draft_len}  # every draft_len's cycle
    # draft rows stand for every inject_layer / draft_len: recorded under one canonical spec
    assert {(k.spec.inject_layer, k.spec.draft_len) for k in keys if k.kind == "draft"} == {(8, 7)}


@pytest.mark.parametrize("budget", [20, 0.3, "0.5", 50])
def test_budget_is_space_filling_and_keeps_the_extremes(budget) -> None:
    keys = build_plan(SPACE, CONTEXTS, budget=budget, seed=3)
    points = _draft_points(keys)
    assert len(points) == resolve_budget(budget, 80) == len([k for k in keys if k.kind == "draft"])
    for c in CONTEXTS:  # largest and smallest subnet at every context length
        assert (4, 1.0, c) in points and (1, 0.25, c) in points
    for axis, levels in enumerate((SPACE.heads, SPACE.visual_keep, CONTEXTS)):
        counts = np.array([sum(p[axis] == v for p in points) for v in levels])
        assert counts.min() >= 1  # every level of every axis is measured
        assert counts.max() - counts.min() <= 2  # ... about equally often


@pytest.mark.parametrize("budget", [None, 20, 0.3])
def test_every_draft_point_is_also_timed_after_a_verify(budget) -> None:
    keys = build_plan(SPACE, CONTEXTS, budget=budget, seed=3)
    draft = [(k.spec, k.context_len, k.k) for k in keys if k.kind == "draft"]
    first = [(k.spec, k.context_len, k.k) for k in keys if k.kind == "draft_first"]
    assert first == draft  # the same points (same budget, same Latin hypercube), k = 1
    assert len(draft) == resolve_budget(budget, 80)  # the budget counts draft points
    assert len({k.ident for k in keys}) == len(keys)
    spec = draft[0][0]
    assert StepKey("draft_first", 64, 1, spec).ident == ("draft_first", spec.id, 64, 1)
    with pytest.raises(InputError, match="a draft_first step needs subnet spec"):
        StepKey("draft_first", 64)


def test_plan_is_deterministic_per_seed() -> None:
    def plan(seed):
        return build_plan(SPACE, CONTEXTS, budget=25, seed=seed)

    assert plan(1) == plan(1)
    assert plan(1) != plan(2)


def test_latin_hypercube_never_repeats_a_point() -> None:
    rng = np.random.default_rng(0)
    picks = latin_hypercube_grid((3, 3, 2), 18, rng)
    assert len(set(picks)) == 18  # the whole grid, each point once


def test_bad_budgets_and_contexts() -> None:
    with pytest.raises(InputError, match=r"--budget 'lots' is not a number"):
        build_plan(SPACE, CONTEXTS, budget="lots")
    with pytest.raises(InputError, match=r"--budget -3 must be a positive count"):
        build_plan(SPACE, CONTEXTS, budget=-3)
    with pytest.raises(InputError,
                       match=r"fewer than the 10 that the largest and smallest subnets"):
        build_plan(SPACE, CONTEXTS, budget=4)
    with pytest.raises(InputError, match=r"--context-lengths \[0, 64\] must be positive"):
        build_plan(SPACE, [0, 64])


def test_budget_messages_name_the_option_that_gave_it() -> None:
    """The demo's flag is --profile-budget: its messages said --budget, which it has not."""
    with pytest.raises(InputError, match=r"^--profile-budget 'lots' is not a number"):
        build_plan(SPACE, CONTEXTS, budget="lots", budget_option="--profile-budget")
    with pytest.raises(InputError, match=r"^--profile-budget 4 gives 4 draft measurements, "
                                         r"fewer than the 10"):
        build_plan(SPACE, CONTEXTS, budget=4, budget_option="--profile-budget")
    with pytest.raises(InputError, match=r"^--profile-budget '2.5' above 1 must be a whole"):
        parse_budget("2.5", "--profile-budget")
    assert parse_budget(None) is None and parse_budget("0.3") == 0.3 and parse_budget(40) == 40
    assert resolve_budget("0.3", 80, "--profile-budget") == 24


def test_step_keys_validate() -> None:
    spec = canonical_spec(SPACE, 2, 0.5)
    assert StepKey("draft", 64, 1, spec).ident == ("draft", spec.id, 64, 1)
    assert StepKey("verify", 64, 5).ident == ("verify", "", 64, 5)
    with pytest.raises(InputError, match="a draft step needs subnet spec"):
        StepKey("draft", 64)
    with pytest.raises(InputError, match="k=3 must be 1"):
        StepKey("decode", 64, 3)


def test_a_space_with_trees_times_each_tree_size_and_each_level_width() -> None:
    import dataclasses

    trees = ((2, 1, 1), (3, 2, 1), (4, 1))  # nodes 6, 15, 8; level widths after the root
    keys = build_plan(dataclasses.replace(SPACE, trees=trees), CONTEXTS)
    tree_verify = {(k.context_len, k.k) for k in keys if k.kind == "verify_tree"}
    assert tree_verify == set(itertools.product(CONTEXTS, (7, 16, 9)))
    tree_cycles = {(k.context_len, k.k) for k in keys if k.kind == "cycle_tree"}
    assert tree_cycles == tree_verify  # each tree's own cycle work, at every context
    wide = {(k.spec.heads, k.spec.visual_keep, k.context_len, k.k)
            for k in keys if k.kind == "draft" and k.k > 1}
    # levels of 2 (2x1x1), 3 and 6 (3x2x1), 4 (4x1): the largest and smallest subnet each
    assert wide == set(itertools.product((1, 4), (0.25, 1.0), CONTEXTS, (2, 3, 4, 6))) - {
        (h, v, c, w) for h, v, c, w in itertools.product((1, 4), (0.25, 1.0), CONTEXTS,
                                                          (2, 3, 4, 6))
        if (h, v) not in ((1, 0.25), (4, 1.0))}
    assert len({k.ident for k in keys}) == len(keys)
    chains = build_plan(SPACE, CONTEXTS)
    assert not any(k.kind in ("verify_tree", "cycle_tree") or k.k > 1 and k.kind == "draft"
                   for k in chains)
    with pytest.raises(InputError, match="k >= 2"):
        StepKey("verify_tree", 64, 1)
    with pytest.raises(InputError, match="k >= 2"):
        StepKey("cycle", 64, 1)


# --- elastic depth and MLP width ------------------------------------------------------------
SIZED = SearchSpace(heads=(1, 2, 4), visual_keep=(0.5, 1.0), inject_layer=(2, 4),
                    draft_len=(1, 3), depth=(1, 2, 3), mlp=(0.25, 0.5, 1.0))
SIZED_CONTEXTS = (64, 128, 192)


def _sized_points(keys):
    return {(k.spec.heads, k.spec.visual_keep, k.spec.depth, k.spec.mlp, k.context_len)
            for k in keys if k.kind == "draft" and k.k == 1}


def test_the_draft_grid_covers_depth_and_mlp() -> None:
    keys = build_plan(SIZED, SIZED_CONTEXTS)
    grid = set(itertools.product(SIZED.heads, SIZED.visual_keep, SIZED.depth, SIZED.mlp,
                                 SIZED_CONTEXTS))
    assert len(grid) == 162 <= 256  # timed whole
    assert _sized_points(keys) == grid
    first = {(k.spec.heads, k.spec.visual_keep, k.spec.depth, k.spec.mlp, k.context_len)
             for k in keys if k.kind == "draft_first"}
    assert first == grid
    assert len({k.ident for k in keys}) == len(keys)
    # one canonical spec per draft size: inject_layer and draft_len never vary, depth/mlp do
    specs = {k.spec for k in keys if k.kind == "draft"}
    assert {(s.inject_layer, s.draft_len) for s in specs} == {(4, 3)}
    assert canonical_spec(SIZED, 2, 0.5, 2, 0.25).id == "h2-v0.50-l4-d2-m0.25-g3"
    assert canonical_spec(SIZED, 2, 0.5) == canonical_spec(SIZED, 2, 0.5, 1, 1.0)


@pytest.mark.parametrize("budget", [30, 0.2])
def test_a_budget_samples_every_axis_and_keeps_the_largest_and_smallest_subnet(budget) -> None:
    keys = build_plan(SIZED, SIZED_CONTEXTS, budget=budget, seed=1)
    points = _sized_points(keys)
    assert len(points) == resolve_budget(budget, 162)
    largest, smallest = SIZED.largest(), SIZED.smallest()
    for c in SIZED_CONTEXTS:  # every axis at its maximum / at its minimum, at every context
        assert (largest.heads, largest.visual_keep, largest.depth, largest.mlp, c) in points
        assert (smallest.heads, smallest.visual_keep, smallest.depth, smallest.mlp, c) in points
    axes = (SIZED.heads, SIZED.visual_keep, SIZED.depth, SIZED.mlp, SIZED_CONTEXTS)
    for axis, levels in enumerate(axes):
        counts = np.array([sum(p[axis] == v for p in points) for v in levels])
        assert counts.min() >= 1  # every depth and every width is measured
        assert counts.max() - counts.min() <= 2  # ... about equally often
    with pytest.raises(InputError, match=r"fewer than the 6 that the largest and smallest"):
        build_plan(SIZED, SIZED_CONTEXTS, budget=5)


def test_a_grid_past_the_limit_is_sampled_without_a_budget() -> None:
    import dataclasses

    from dreams_nas.latency.measure.plan import FULL_GRID_LIMIT

    big = dataclasses.replace(SIZED, heads=(1, 2, 3, 4), visual_keep=(0.25, 0.5, 0.75, 1.0))
    keys = build_plan(big, SIZED_CONTEXTS)  # 4 x 4 x 3 x 3 x 3 = 432 points
    assert len(_sized_points(keys)) == FULL_GRID_LIMIT
    assert (4, 1.0, 3, 1.0, 64) in _sized_points(keys)
    assert (1, 0.25, 1, 0.25, 64) in _sized_points(keys)


def test_tree_levels_are_timed_for_the_largest_and_smallest_architecture() -> None:
    import dataclasses

    keys = build_plan(dataclasses.replace(SIZED, trees=((2, 1),)), SIZED_CONTEXTS)
    wide = {(k.spec.heads, k.spec.visual_keep, k.spec.depth, k.spec.mlp, k.context_len, k.k)
            for k in keys if k.kind == "draft" and k.k > 1}
    assert wide == {(4, 1.0, 3, 1.0, c, 2) for c in SIZED_CONTEXTS} | {
        (1, 0.5, 1, 0.25, c, 2) for c in SIZED_CONTEXTS}


# --- the draft vocabulary ---------------------------------------------------------------------
VOCAB = SearchSpace(heads=(1, 2), visual_keep=(0.5, 1.0), inject_layer=(2, 4), draft_len=(1, 3),
                    depth=(1, 2), draft_vocab=(0.25, 1.0))


def test_the_draft_grid_covers_the_draft_vocabulary() -> None:
    keys = build_plan(VOCAB, SIZED_CONTEXTS)
    grid = set(itertools.product(VOCAB.heads, VOCAB.visual_keep, VOCAB.depth, VOCAB.mlp,
                                 VOCAB.draft_vocab, SIZED_CONTEXTS))
    for kind in ("draft", "draft_first"):  # both shares measured, as both kinds
        points = {(k.spec.heads, k.spec.visual_keep, k.spec.depth, k.spec.mlp,
                   k.spec.draft_vocab, k.context_len) for k in keys if k.kind == kind}
        assert points == grid
    specs = {k.spec for k in keys if k.kind == "draft"}
    assert {s.draft_vocab for s in specs} == {0.25, 1.0}
    assert {(s.inject_layer, s.draft_len) for s in specs} == {(4, 3)}  # one canonical spec each
    assert canonical_spec(VOCAB, 2, 0.5, 2, 1.0, 0.25).id == "h2-v0.50-l4-d2-n0.25-g3"
    assert canonical_spec(VOCAB, 2, 0.5) == canonical_spec(VOCAB, 2, 0.5, 1, 1.0, 1.0)
    assert len({k.ident for k in keys}) == len(keys)


def test_a_budget_keeps_both_vocabularies_and_the_extremes() -> None:
    import dataclasses

    space = dataclasses.replace(VOCAB, heads=(1, 2, 3, 4), visual_keep=(0.25, 0.5, 0.75, 1.0))
    keys = build_plan(space, SIZED_CONTEXTS, budget=24, seed=0)
    points = {(k.spec.heads, k.spec.visual_keep, k.spec.depth, k.spec.draft_vocab, k.context_len)
              for k in keys if k.kind == "draft" and k.k == 1}
    assert len(points) == 24
    for c in SIZED_CONTEXTS:  # the smallest subnet has the quarter vocabulary, the largest all
        assert (1, 0.25, 1, 0.25, c) in points and (4, 1.0, 2, 1.0, c) in points
    counts = [sum(p[3] == n for p in points) for n in space.draft_vocab]
    assert min(counts) >= 1 and max(counts) - min(counts) <= 2  # each share about as often


def test_tree_levels_are_timed_at_the_smallest_and_largest_vocabulary() -> None:
    import dataclasses

    keys = build_plan(dataclasses.replace(VOCAB, trees=((2, 1),)), SIZED_CONTEXTS)
    wide = {(k.spec.heads, k.spec.visual_keep, k.spec.depth, k.spec.draft_vocab, k.context_len)
            for k in keys if k.kind == "draft" and k.k > 1}
    assert wide == {(2, 1.0, 2, 1.0, c) for c in SIZED_CONTEXTS} | {
        (1, 0.5, 1, 0.25, c) for c in SIZED_CONTEXTS}
