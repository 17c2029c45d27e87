"""The tree rules reproduce the target distribution: sibling rejection (deterministic and
without-replacement candidates), drawing without replacement, the tree walk, the greedy twin."""

from __future__ import annotations

import pytest
import torch
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.tree import TokenTree
from dreams_nas.supernet.decoding.sampling import rejection_accept
from dreams_nas.supernet.decoding.tree_sampling import (
    sample_without_replacement,
    sibling_accept,
    sibling_accept_batched,
    tree_accept,
    tree_accept_batched,
    tree_accept_greedy,
)
from scipy.stats import chisquare

DRAWS = 20_000


def _assert_matches(counts: torch.Tensor, probs: torch.Tensor) -> None:
    """counts (cells,) of DRAWS-ish draws against the exact probs (cells,)."""
    probs = probs.double().flatten()
    counts = counts.flatten()
    support = probs > 0
    assert counts[~support].sum() == 0, "a token outside the target's support was emitted"
    if int(support.sum()) == 1:  # a one-hot target: nothing else may appear
        return
    expected = probs[support] / probs[support].sum() * counts.sum()
    stat = chisquare(counts[support].double().numpy(), expected.numpy())
    assert stat.pvalue > 1e-3, (stat, counts, expected)


def _candidates(draft: torch.Tensor, k: int, mode: str, gen: torch.Generator) -> torch.Tensor:
    """(DRAWS, k): the draft's top-k every time, or k draws without replacement per row."""
    if mode == "top-k":
        return draft.topk(k).indices.expand(DRAWS, k)
    return sample_without_replacement(draft.expand(DRAWS, -1), k, gen)


# (target_probs, draft_probs); vocab 4-6, no ties in the draft (its top-k is well defined)
CASES = {
    "disagree": ([0.05, 0.1, 0.5, 0.05, 0.3], [0.4, 0.3, 0.04, 0.2, 0.06]),
    "target zero on the draft's favourite": ([0.0, 0.3, 0.25, 0.2, 0.25],
                                             [0.7, 0.12, 0.1, 0.05, 0.03]),
    "one-hot draft": ([0.25, 0.1, 0.3, 0.05, 0.3], [0.0, 0.0, 1.0, 0.0, 0.0]),
    "one-hot target": ([0.0, 0.0, 0.0, 1.0, 0.0], [0.3, 0.25, 0.2, 0.15, 0.1]),
    "equal": ([0.1, 0.2, 0.3, 0.25, 0.15], [0.1, 0.2, 0.3, 0.25, 0.15]),
    "disjoint supports": ([0.5, 0.3, 0.2, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.45, 0.35, 0.2]),
    "vocab 4": ([0.4, 0.1, 0.2, 0.3], [0.1, 0.6, 0.25, 0.05]),
}


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("mode", ["top-k", "without replacement"])
@pytest.mark.parametrize("name", list(CASES))
def test_sibling_rule_reproduces_target(name: str, mode: str, k: int) -> None:
    target, draft = (torch.tensor(v) for v in CASES[name])
    vocab = target.shape[0]
    gen = torch.Generator().manual_seed(11 * k + len(name))
    cands = _candidates(draft, k, mode, gen)
    q = None if mode == "top-k" else draft.expand(DRAWS, vocab)
    index, drawn = sibling_accept_batched(cands, target.expand(DRAWS, vocab), q, gen)
    out = torch.where(index >= 0, cands.gather(1, index.clamp_min(0)[:, None])[:, 0], drawn)
    _assert_matches(torch.bincount(out, minlength=vocab), target)


def test_unbatched_sibling_accept_reproduces_target() -> None:
    target, draft = (torch.tensor(v) for v in CASES["disagree"])
    gen = torch.Generator().manual_seed(5)
    counts = torch.zeros(5, dtype=torch.long)
    for mode in ("top-k", "without replacement"):
        for _ in range(1_000):
            cands = (draft.topk(2).indices if mode == "top-k"
                     else sample_without_replacement(draft, 2, gen))
            index, residual = sibling_accept(cands, target, None if mode == "top-k" else draft,
                                             gen)
            if index >= 0:
                assert residual is None
                counts[cands[index]] += 1
            else:
                assert residual is not None and torch.isclose(residual.sum(), torch.tensor(1.0))
                counts[torch.multinomial(residual, 1, generator=gen)] += 1
    _assert_matches(counts, target)


def test_unbatched_sibling_accept_is_the_batched_rule() -> None:
    target, draft = (torch.tensor(v) for v in CASES["disagree"])
    cands = torch.tensor([0, 1, 3])
    for seed in range(30):
        index, _ = sibling_accept(cands, target, draft, torch.Generator().manual_seed(seed))
        batched, _ = sibling_accept_batched(cands[None], target[None], draft[None],
                                            torch.Generator().manual_seed(seed))
        assert index == int(batched)


def test_zero_residual_falls_back_without_nan() -> None:
    # p == q, and a one-hot target on a deterministic candidate: the residual has no mass (the
    # rejection cannot happen) yet the draw from it must stay valid
    target = torch.tensor([0.0, 1.0, 0.0]).expand(100, 3)
    for cands, draft in ((torch.tensor([[1]]), target), (torch.tensor([[1, 0]]), None)):
        index, drawn = sibling_accept_batched(cands.expand(100, -1), target, draft,
                                              torch.Generator().manual_seed(1))
        assert bool((index == 0).all()) and bool((drawn == 1).all())
    index, residual = sibling_accept(torch.tensor([0, 2]), target[0], None, None)
    assert index == -1 and residual is not None
    assert residual.tolist() == [0.0, 1.0, 0.0]


def test_one_candidate_with_draft_probs_is_the_chain_rule() -> None:
    target, draft = (torch.tensor(v) for v in CASES["disagree"])
    exact = float(torch.minimum(target, draft).sum())  # the chain rule's acceptance probability
    gen = torch.Generator().manual_seed(9)
    tokens = torch.multinomial(draft.expand(DRAWS, 5), 1, replacement=True, generator=gen)
    index, _ = sibling_accept_batched(tokens, target.expand(DRAWS, 5), draft.expand(DRAWS, 5),
                                      gen)
    n, _ = rejection_accept(tokens, draft.expand(DRAWS, 1, 5), target.expand(DRAWS, 2, 5), gen)
    sigma = (exact * (1 - exact) / DRAWS) ** 0.5
    for rate in (float((index == 0).double().mean()), float(n.double().mean())):
        assert abs(rate - exact) < 4 * sigma, (rate, exact)


def test_sample_without_replacement_orders_like_sequential_draws() -> None:
    q = torch.tensor([0.4, 0.3, 0.2, 0.1])
    draws = sample_without_replacement(q.expand(DRAWS, 4), 2, torch.Generator().manual_seed(2))
    assert bool((draws[:, 0] != draws[:, 1]).all())
    exact = q[:, None] * q[None, :] / (1 - q[:, None])  # P(first a, then b)
    exact.fill_diagonal_(0.0)
    _assert_matches(torch.bincount(draws[:, 0] * 4 + draws[:, 1], minlength=16), exact)


def test_sample_without_replacement_fills_with_zero_probability_tokens() -> None:
    q = torch.tensor([0.0, 0.7, 0.0, 0.3, 0.0])
    draws = sample_without_replacement(q.expand(500, 5), 4, torch.Generator().manual_seed(3))
    assert bool((draws.sort(-1).values.diff(dim=-1) > 0).all())  # distinct
    assert bool((q[draws[:, :2]] > 0).all()) and bool((q[draws[:, 2:]] == 0).all())
    with pytest.raises(InputError, match="k=6 distinct tokens from a vocabulary of 5"):
        sample_without_replacement(q, 6, None)


# a tiny target as a table: the distribution after the root, and after each first token
VOCAB = 4
TARGET_0 = torch.tensor([0.0, 0.45, 0.15, 0.4])
TARGET_1 = torch.tensor([[0.25, 0.25, 0.25, 0.25],
                         [0.6, 0.0, 0.1, 0.3],
                         [0.05, 0.05, 0.8, 0.1],
                         [0.1, 0.5, 0.0, 0.4]])
DRAFT_0 = torch.tensor([0.5, 0.1, 0.3, 0.1])  # favours a token the target never emits
DRAFT_1 = torch.tensor([[0.4, 0.3, 0.2, 0.1],
                        [0.05, 0.15, 0.7, 0.1],
                        [0.3, 0.2, 0.1, 0.4],
                        [0.0, 0.0, 1.0, 0.0]])


@pytest.mark.parametrize("mode", ["top-k", "without replacement"])
def test_tree_walk_gives_the_joint_distribution_of_two_tokens(mode: str) -> None:
    tree = TokenTree((2, 2))  # root; nodes 1, 2; node 1's children 3, 4; node 2's 5, 6
    gen = torch.Generator().manual_seed(21 if mode == "top-k" else 22)
    first = _candidates(DRAFT_0, 2, mode, gen)  # (DRAWS, 2)
    if mode == "top-k":
        second = DRAFT_1.topk(2).indices[first]  # (DRAWS, 2, 2)
    else:
        second = sample_without_replacement(DRAFT_1[first], 2, gen)
    tokens = torch.cat((torch.zeros(DRAWS, 1, dtype=torch.long), first, second.flatten(1)), 1)
    leaf = torch.full((DRAWS, 4, VOCAB), 1.0 / VOCAB)  # after two tokens: only the bonus reads it
    target = torch.cat((TARGET_0.expand(DRAWS, 1, VOCAB), TARGET_1[first], leaf), 1)
    draft = None
    if mode != "top-k":
        draft = torch.cat((DRAFT_0.expand(DRAWS, 1, VOCAB), DRAFT_1[first],
                           torch.zeros(DRAWS, 4, VOCAB)), 1)
    last, nxt = tree_accept_batched(tree, tokens, target, draft, gen)
    level = torch.tensor(tree.levels)[last]
    parent = torch.tensor(tree.parents)[last]
    rows = torch.arange(DRAWS)
    # the first two tokens out: the path's, then the next token; after a stop at the root, the
    # next cycle would draw the second token from the target after the first
    tok1 = torch.where(level == 0, nxt, tokens[rows, torch.where(level == 2, parent, last)])
    after = torch.multinomial(TARGET_1[tok1], 1, generator=gen)[:, 0]
    tok2 = torch.where(level == 2, tokens[rows, last], torch.where(level == 1, nxt, after))
    counts = torch.bincount(tok1 * VOCAB + tok2, minlength=VOCAB * VOCAB)
    _assert_matches(counts, TARGET_0[:, None] * TARGET_1)
    assert int((level == 2).sum()) > 0 and int((level == 0).sum()) > 0  # every branch was hit


def test_unbatched_tree_accept_matches_the_walk() -> None:
    tree = TokenTree((2, 1))  # nodes 1, 2; node 1's child 3, node 2's child 4
    tokens = torch.tensor([0, 1, 3, 2, 1])
    target = torch.stack([TARGET_0, TARGET_1[1], TARGET_1[3], TARGET_1[2], TARGET_1[1]])
    gen = torch.Generator().manual_seed(4)
    counts = torch.zeros(VOCAB, dtype=torch.long)
    for _ in range(1_500):
        path, token = tree_accept(tree, tokens, target, None, gen)
        assert path in ([0], [0, 1], [0, 2], [0, 1, 3], [0, 2, 4])
        assert isinstance(token, int)
        counts[tokens[path[1]] if len(path) > 1 else token] += 1
    _assert_matches(counts, TARGET_0)


def test_tree_accept_rejects_mismatched_shapes() -> None:
    tree = TokenTree((2, 1))
    with pytest.raises(InputError, match="tree 2x1 has 5 nodes with the root"):
        tree_accept(tree, torch.zeros(4, dtype=torch.long), torch.ones(5, 3) / 3, None, None)


def _argmax_tree(targets: list[int]) -> tuple[TokenTree, torch.Tensor, torch.Tensor]:
    # 3x2: nodes 1-3 at depth 1; node 1's children 4, 5; node 2's 6, 7; node 3's 8, 9
    tree = TokenTree((3, 2))
    tokens = torch.tensor([9, 10, 11, 12, 20, 21, 22, 23, 24, 25])
    return tree, tokens, torch.tensor(targets)


@pytest.mark.parametrize(("targets", "path", "token"), [
    ([10, 20, 0, 0, 7, 0, 0, 0, 0, 0], [0, 1, 4], 7),  # rank 0 all the way, then the bonus
    ([12, 0, 0, 25, 0, 0, 0, 0, 0, 5], [0, 3, 9], 5),  # rank 2, then rank 1
    ([11, 0, 30, 0, 0, 0, 0, 0, 0, 0], [0, 2], 30),  # a match at depth 1, none at depth 2
    ([13, 20, 21, 22, 0, 0, 0, 0, 0, 0], [0], 13),  # no child matches: the target's own token
])
def test_greedy_follows_the_target_argmax(targets, path, token) -> None:
    tree, tokens, target_tokens = _argmax_tree(targets)
    assert tree_accept_greedy(tree, tokens, target_tokens) == (path, token)


def test_greedy_takes_the_first_matching_child() -> None:
    tree = TokenTree((3,))
    assert tree_accept_greedy(tree, torch.tensor([0, 5, 7, 7]), torch.tensor([7, 1, 2, 3])
                              ) == ([0, 2], 2)
