"""Importance sorting under data parallelism (`training.importance.sort_heads`): two gloo ranks
whose |grad x weight| differ by a little noise (as a GPU's backward differs from rank to rank)
take the same head and channel orders, the totals summed over the ranks, and keep identical
weights through training."""

from __future__ import annotations

import pytest
import torch
from _support.ranks import importance_task, spawn

pytestmark = pytest.mark.usefixtures("one_thread")
NOISE = 0.01  # of the mean importance: small against the spread, enough to swap close channels


def _two_ranks(tmp_path, steps: int) -> list[dict]:
    spawn(importance_task, 2, tmp_path, str(tmp_path), NOISE, steps)
    return [torch.load(tmp_path / f"rank-{r}.pt", weights_only=True) for r in (0, 1)]


def _assert_same(ranks: list[dict]) -> None:
    # the noise alone would order some heads or channels differently on the two ranks ...
    assert ranks[0]["alone"] != ranks[1]["alone"]
    # ... yet both took the same orders and hold the same weights, bit for bit
    assert ranks[0]["orders"] == ranks[1]["orders"] and ranks[0]["orders"]
    assert ranks[0]["weights"].keys() == ranks[1]["weights"].keys()
    for name, tensor in ranks[0]["weights"].items():
        assert torch.equal(tensor, ranks[1]["weights"][name]), name
    start, end = ranks[0]["start"], ranks[0]["weights"]
    assert any(not torch.equal(start[k], end[k]) for k in start)  # sorted (and trained)


def test_ranks_with_perturbed_importances_sort_alike(tmp_path):
    _assert_same(_two_ranks(tmp_path, steps=0))


def test_ranks_with_noisy_backward_hold_identical_weights_after_50_steps(tmp_path):
    _assert_same(_two_ranks(tmp_path, steps=50))
