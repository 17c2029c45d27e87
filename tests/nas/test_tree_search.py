"""Token trees as a search dimension: scored with their triple, costed per level, searched
exhaustively and by Optuna."""

from __future__ import annotations

import dataclasses

import pytest
from _support.search import SMALL_SPACE, FakeLatency, FakeScorer, fake_params, run_search, tau_of
from dreams_nas.nas.search.params import params_of, search_distributions, spec_of
from dreams_nas.nas.search.scoring import CachedAcceptance
from dreams_nas.nas.search.speedup import expected_speedup
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.core.tree import TokenTree

TREES = ((2, 1, 1), (3, 2, 1), (4, 1))
SPACE = dataclasses.replace(SMALL_SPACE, trees=TREES)


def _true_speedup(spec: SubnetSpec) -> float:
    """The cycle as the loop runs it: the first draft step over the root, one step per
    further level at its width, then one verify of every node and the root."""
    lat = FakeLatency()
    first = lat.step_ms("draft_first", spec, 32, 1)
    if not spec.tree:
        hot = (spec.draft_len - 1) * lat.step_ms("draft", spec, 32, 1)
        verify = lat.step_ms("verify", None, 32, spec.draft_len + 1)
    else:
        tree = TokenTree(spec.tree)
        hot = sum(lat.step_ms("draft", spec, 32, w) for w in tree.widths[:-1])
        verify = lat.step_ms("verify_tree", None, 32, tree.nodes + 1)
    return float(expected_speedup(tau_of(spec), spec.draft_len, 1.0, verify, 9.5,
                                  first_draft_ms=first, hot_draft_ms=hot))


def test_a_tree_costs_its_levels_and_its_nodes_and_the_exhaustive_best_is_the_true_best():
    scorer = FakeScorer()
    result = run_search(SPACE, scorer, FakeLatency(), fake_params, context_len=32,
                    show_progress=False)
    assert len(result.candidates) == SPACE.size == 12 * 7
    by_spec = {c.spec: c for c in result.candidates}
    for spec in SPACE.enumerate():
        assert by_spec[spec].speedup == pytest.approx(_true_speedup(spec)), spec.id
    best = max(SPACE.enumerate(), key=_true_speedup)
    assert result.best.spec == best
    tree = by_spec[SubnetSpec(2, 1.0, 2, 3, tree=(3, 2, 1))]
    lat = FakeLatency()
    widths = TokenTree((3, 2, 1)).widths  # (3, 6, 6): steps over the root, 3 and 6 nodes
    assert tree.cycle_draft_ms == pytest.approx(
        lat.step_ms("draft_first", tree.spec, 32, 1)
        + sum(lat.step_ms("draft", tree.spec, 32, w) for w in widths[:-1]))
    assert tree.verify_ms == pytest.approx(lat.step_ms("verify_tree", None, 32, 16))
    row = tree.to_row()
    assert row["tree"] == "3x2x1" and row["cycle_ms"] == pytest.approx(tree.cycle_ms)


def test_one_scoring_pass_per_triple_covers_its_chains_and_trees():
    scorer = FakeScorer()
    cached = CachedAcceptance(scorer)
    cached.use_space(SPACE)
    tree_spec = SubnetSpec(1, 0.5, 1, 2, tree=(4, 1))
    cached.rows([tree_spec], show_progress=False)
    arch = tree_spec.arch
    expected = [arch.replace(draft_len=g) for g in SPACE.draft_len]
    expected += [arch.replace(tree=t) for t in TREES]
    assert scorer.calls == expected
    cached.rows([arch.replace(draft_len=5), arch.replace(tree=(2, 1, 1))],
                show_progress=False)
    assert len(scorer.calls) == len(expected)  # cached: nothing scored again


def test_the_optuna_parameters_of_a_tree_space_round_trip():
    dists = search_distributions(SPACE)
    assert "draft_len" not in dists and "shape" in dists
    assert sorted(dists["shape"].choices) == sorted(
        ["g1", "g2", "g3", "g5", "t2x1x1", "t3x2x1", "t4x1"])
    for spec in SPACE.enumerate():
        assert spec_of(params_of(spec, dists)) == spec
    chains = search_distributions(SMALL_SPACE)
    assert "shape" not in chains and "draft_len" in chains  # studies without trees as before
    spec = SubnetSpec(4, 1.0, 2, 5)
    assert spec_of(params_of(spec, chains)) == spec


def test_optuna_over_the_whole_tree_space_reaches_the_exhaustive_best():
    exhaustive = run_search(SPACE, FakeScorer(), FakeLatency(), fake_params, context_len=32,
                        show_progress=False)
    optuna = run_search(SPACE, FakeScorer(), FakeLatency(), fake_params, context_len=32,
                    method="optuna", n_trials=SPACE.size, seed=3, show_progress=False)
    assert {c.spec for c in optuna.candidates} == set(SPACE.enumerate())
    assert optuna.best.spec == exhaustive.best.spec
    assert any(c.spec.tree for c in optuna.candidates)
