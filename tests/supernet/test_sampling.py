"""The rejection rule reproduces the target distribution; logit processing; greedy acceptance."""

from __future__ import annotations

import pytest
import torch
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.decoding.sampling import (
    SamplingConfig,
    greedy_accept,
    logits_to_probs,
    rejection_accept,
)
from scipy.stats import chisquare

DRAWS = 200_000


def _first_token_counts(draft: torch.Tensor, target: torch.Tensor, k: int,
                        seed: int) -> torch.Tensor:
    """Counts of the first emitted token over DRAWS runs of the rule with k drafts per run.

    draft (vocab,) is the draft distribution at every position; target (k+1, vocab)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = draft.shape[0]
    draft_probs = draft.expand(DRAWS, k, vocab)
    tokens = torch.multinomial(draft.expand(DRAWS * k, vocab), 1, replacement=True,
                               generator=gen).view(DRAWS, k)
    n, nxt = rejection_accept(tokens, draft_probs, target.expand(DRAWS, k + 1, vocab), gen)
    first = torch.where(n > 0, tokens[:, 0], nxt)
    return torch.bincount(first, minlength=vocab)


def _assert_matches(counts: torch.Tensor, probs: torch.Tensor) -> None:
    support = probs > 0
    assert counts[~support].sum() == 0, "a token outside the target's support was emitted"
    if int(support.sum()) == 1:  # a one-hot target: every draw must be that token
        assert int(counts[support]) == DRAWS
        return
    expected = probs[support].double() / probs[support].double().sum() * DRAWS
    stat = chisquare(counts[support].double().numpy(), expected.numpy())
    assert stat.pvalue > 1e-3, (stat, counts, expected)


CASES = {
    "overlapping": ([0.1, 0.2, 0.3, 0.25, 0.15], [0.3, 0.05, 0.1, 0.15, 0.4]),
    "disjoint supports": ([0.5, 0.5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.2, 0.3, 0.5]),
    "one-hot draft": ([0.0, 0.0, 1.0, 0.0, 0.0], [0.25, 0.1, 0.3, 0.05, 0.3]),
    "one-hot target": ([0.2, 0.2, 0.2, 0.2, 0.2], [0.0, 0.0, 0.0, 1.0, 0.0]),
    "equal": ([0.1, 0.2, 0.3, 0.25, 0.15], [0.1, 0.2, 0.3, 0.25, 0.15]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_rejection_rule_reproduces_target(name: str) -> None:
    draft, target = (torch.tensor(v) for v in CASES[name])
    counts = _first_token_counts(draft, target[None], k=1, seed=1)
    _assert_matches(counts, target)


def test_bonus_token_is_drawn_from_the_last_target_row() -> None:
    # draft == target at position 0: always accepted, so the next token is the bonus
    row0 = torch.tensor([0.1, 0.2, 0.3, 0.25, 0.15])
    bonus = torch.tensor([0.4, 0.0, 0.1, 0.2, 0.3])
    gen = torch.Generator().manual_seed(3)
    tokens = torch.multinomial(row0.expand(DRAWS, 5), 1, generator=gen)
    target = torch.stack([row0, bonus]).expand(DRAWS, 2, 5)
    n, nxt = rejection_accept(tokens, row0.expand(DRAWS, 1, 5), target, gen)
    assert bool((n == 1).all())
    _assert_matches(torch.bincount(nxt, minlength=5), bonus)


def test_first_token_with_several_drafts() -> None:
    draft = torch.tensor([0.05, 0.6, 0.05, 0.3, 0.0])
    target = torch.tensor([[0.3, 0.1, 0.2, 0.2, 0.2], [0.2] * 5, [0.2] * 5])
    _assert_matches(_first_token_counts(draft, target, k=2, seed=2), target[0])


def test_rejection_rule_is_reproducible_with_a_seed() -> None:
    draft, target = (torch.tensor(v) for v in CASES["overlapping"])
    a = _first_token_counts(draft, target[None], k=1, seed=7)
    b = _first_token_counts(draft, target[None], k=1, seed=7)
    assert torch.equal(a, b)


def test_greedy_accept() -> None:
    logits = torch.full((4, 6), -1.0)
    logits[0, 2] = logits[1, 4] = logits[2, 1] = logits[3, 5] = 1.0  # argmax 2, 4, 1, 5
    assert greedy_accept(torch.tensor([2, 4, 1]), logits) == (3, 5)
    assert greedy_accept(torch.tensor([2, 0, 1]), logits) == (1, 4)
    assert greedy_accept(torch.tensor([3, 4, 1]), logits) == (0, 2)


def test_logits_to_probs_top_k_top_p_temperature() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    torch.testing.assert_close(logits_to_probs(logits, SamplingConfig(temperature=1.0)),
                               torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    top2 = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_k=2))
    torch.testing.assert_close(top2, torch.tensor([[2 / 3, 1 / 3, 0.0, 0.0]]))
    # top_p 0.7: 0.5 alone is below 0.7, 0.5 + 0.25 reaches it -> keep two tokens
    top_p = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_p=0.7))
    torch.testing.assert_close(top_p, torch.tensor([[2 / 3, 1 / 3, 0.0, 0.0]]))
    hot = logits_to_probs(logits, SamplingConfig(temperature=0.5))
    assert hot[0, 0] > 0.5 and torch.isclose(hot.sum(), torch.tensor(1.0))
    greedy = logits_to_probs(logits, SamplingConfig())
    assert greedy.tolist() == [[1.0, 0.0, 0.0, 0.0]]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"temperature": -1.0}, "temperature=-1.0 must be >= 0"),
    ({"top_k": -2}, "top_k=-2 must be >= 0"),
    ({"top_p": 0.0}, r"top_p=0.0 must be in \(0, 1\]"),
])
def test_sampling_config_validates(kwargs, match) -> None:
    with pytest.raises(InputError, match=match):
        SamplingConfig(**kwargs)
