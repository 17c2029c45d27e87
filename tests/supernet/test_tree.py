"""Static token trees and the specs and spaces that hold them."""

from __future__ import annotations

import pytest
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.core.tree import TokenTree, tree_family


def test_a_tree_numbers_its_nodes_breadth_first() -> None:
    tree = TokenTree((3, 2, 1))
    assert tree.widths == (3, 6, 6) and tree.nodes == 15 and tree.draft_len == 3
    assert tree.parents[:10] == (-1, 0, 0, 0, 1, 1, 2, 2, 3, 3)
    assert tree.ranks[:10] == (0, 0, 1, 2, 0, 1, 0, 1, 0, 1)
    assert list(tree.nodes_at(2)) == list(range(4, 10))
    assert tree.children(1) == [4, 5] and tree.children(10) == []
    assert tree.path(12) == [0, 2, 6, 12]
    for i in range(1, tree.nodes + 1):  # a parent always comes first, one level up
        assert tree.parents[i] < i and tree.levels[tree.parents[i]] == tree.levels[i] - 1


def test_a_chain_is_the_tree_of_ones() -> None:
    chain = TokenTree.chain(4)
    assert chain.is_chain and chain.nodes == 4 and chain.parents == (-1, 0, 1, 2, 3)
    assert TokenTree.parse("t4x2x1") == TokenTree((4, 2, 1))


@pytest.mark.parametrize("bad", [(), (0, 1), (2, -1), "4x", (2.5,), (True, 1), (64, 64)])
def test_bad_trees_are_one_line_errors(bad) -> None:
    with pytest.raises(InputError, match="tree"):
        TokenTree.parse(bad) if isinstance(bad, str) else TokenTree(bad)


def test_the_tree_family_stays_within_its_budget() -> None:
    family = tree_family(12, max_draft_len=5)
    assert family and all(t.nodes <= 12 and not t.is_chain and t.draft_len <= 5 for t in family)
    assert len({t.branching for t in family}) == len(family)


def test_a_tree_spec_has_its_own_id_and_round_trips() -> None:
    spec = SubnetSpec(2, 1.0, 8, 5, tree=(4, 2, 2, 1, 1))
    assert spec.id == "h2-v1.00-l8-t4x2x2x1x1" and spec.is_tree
    assert SubnetSpec.from_id(spec.id) == spec
    assert SubnetSpec.from_dict(spec.to_dict()) == spec
    assert spec.to_fields()["tree"] == "4x2x2x1x1"
    assert spec.arch == SubnetSpec(2, 1.0, 8, 1)
    assert spec.replace(draft_len=3) == SubnetSpec(2, 1.0, 8, 3)  # a chain of that length
    assert SubnetSpec(2, 1.0, 8, 5).replace(tree="3x1") == SubnetSpec(2, 1.0, 8, 2, tree=(3, 1))


def test_a_chain_keeps_its_id_and_json() -> None:
    chain = SubnetSpec(2, 1.0, 8, 3, tree=(1, 1, 1))
    assert chain == SubnetSpec(2, 1.0, 8, 3) and chain.id == "h2-v1.00-l8-g3"
    assert "tree" not in chain.to_dict()
    with pytest.raises(InputError, match="draft_len=5 must equal the levels"):
        SubnetSpec(2, 1.0, 8, 5, tree=(2, 1))


def test_a_space_enumerates_chains_then_trees() -> None:
    space = SearchSpace(heads=(1, 2), visual_keep=(1.0,), inject_layer=(4,), draft_len=(1, 3),
                        trees=("3x1", (2, 2, 1)))
    specs = list(space.enumerate())
    assert len(specs) == space.size == 2 * 4
    assert [s.id for s in specs[:4]] == ["h1-v1.00-l4-g1", "h1-v1.00-l4-g3",
                                         "h1-v1.00-l4-t3x1", "h1-v1.00-l4-t2x2x1"]
    assert all(s in space for s in specs) and space.max_draft_len == 3
    assert SubnetSpec(1, 1.0, 4, 2, tree=(4, 1)) not in space
    with pytest.raises(InputError, match="tree 4x1 of subnet h1-v1.00-l4-t4x1 isn't"):
        space.validate(SubnetSpec(1, 1.0, 4, 2, tree=(4, 1)))
    assert SearchSpace.from_dict(space.to_dict()) == space


def test_a_space_file_round_trips_its_trees(tmp_path) -> None:
    space = SearchSpace(heads=(1,), visual_keep=(1.0,), inject_layer=(4,), draft_len=(2,),
                        trees=((4, 2, 1),))
    for name in ("space.toml", "space.json"):
        assert SearchSpace.load(space.save(tmp_path / name)) == space
    plain = SearchSpace(heads=(1,), visual_keep=(1.0,), inject_layer=(4,), draft_len=(2,))
    assert "trees" not in plain.to_dict()  # a chain-only space reads as before trees


@pytest.mark.parametrize("trees, match", [(["1x1"], "holds the chain"),
                                          (["3x1", (3, 1)], "repeats 3x1"),
                                          ("3x1", "must be a list")])
def test_bad_space_trees_are_refused(trees, match) -> None:
    with pytest.raises(InputError, match=match):
        SearchSpace(heads=(1,), visual_keep=(1.0,), inject_layer=(4,), draft_len=(2,),
                    trees=trees)
