"""The draft's KV cache: written in place, read as views, cropped by moving a length; what it
returns is what concatenating every write would give."""

from __future__ import annotations

import pytest
import torch
from dreams_nas.supernet.draft.state import CACHE_MIN_CAPACITY, DraftCache
from hypothesis import given, settings
from hypothesis import strategies as st


def _kv(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, n, 4, generator=g), torch.randn(1, 2, n, 4, generator=g)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 90), st.integers(0, 100)), min_size=1, max_size=12))
def test_the_cache_returns_what_concatenation_would(steps) -> None:
    """Writes of n positions, each after cropping back some (the verify's rejected drafts), on
    two layers: every returned view equals the reference sequence, across the buffer's growth."""
    cache, reference = DraftCache(), [None, None]
    for seed, (n, drop) in enumerate(steps):
        keep = max(0, cache.length - drop)
        cache.crop(keep)
        reference = [None if r is None else (r[0][:, :, :keep], r[1][:, :, :keep])
                     for r in reference]
        for layer in (0, 1):
            k, v = _kv(n, 2 * seed + layer)
            got_k, got_v = cache.update(layer, k, v)
            old = reference[layer]
            reference[layer] = (k, v) if old is None else (torch.cat((old[0], k), 2),
                                                            torch.cat((old[1], v), 2))
            assert torch.equal(got_k, reference[layer][0])
            assert torch.equal(got_v, reference[layer][1])
        assert cache.length == reference[0][0].shape[2]


def test_a_step_writes_in_place_and_a_crop_copies_nothing() -> None:
    cache = DraftCache()
    cache.update(0, *_kv(40, 0))
    buffer = cache.keys[0]
    assert buffer.shape[2] == CACHE_MIN_CAPACITY
    for i in range(10):
        k, _ = cache.update(0, *_kv(1, i + 1))
        assert k.data_ptr() == buffer.data_ptr() and k.shape[2] == 41 + i
    cache.crop(30)
    assert cache.length == 30 and cache.keys[0] is buffer
    cache.update(0, *_kv(CACHE_MIN_CAPACITY, 99))  # past the end: doubled, held positions kept
    assert cache.keys[0].shape[2] == 2 * CACHE_MIN_CAPACITY
    assert torch.equal(cache.keys[0][:, :, :30], buffer[:, :, :30])
    with pytest.raises(ValueError, match="cannot crop"):
        cache.crop(cache.length + 1)


def test_gradients_flow_through_a_cache() -> None:
    """A cache used with autograd concatenates, so the views a step read stay as they were."""
    cache = DraftCache()
    first = torch.randn(1, 2, 3, 4, requires_grad=True)
    k1, _ = cache.update(0, first, first * 2)
    k2, _ = cache.update(0, torch.randn(1, 2, 1, 4, requires_grad=True), torch.ones(1, 2, 1, 4))
    (k1.sum() + k2.sum()).backward()
    assert torch.equal(first.grad, torch.full_like(first, 2.0))
