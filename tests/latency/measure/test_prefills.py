"""`latency.measure.prefills.KeptPrefills`: a kept cache swapped back in computes what a fresh
prefill of the same tokens computes, on a Llama-type target and on Qwen2-VL's multimodal
positions."""

from __future__ import annotations

import pytest
import torch
from _support.models import build_tiny_vlm
from dreams_nas.latency.measure.prefills import KeptPrefills, cache_bytes
from dreams_nas.supernet.target.adapter import TargetAdapter


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_a_swapped_in_cache_verifies_as_a_fresh_prefill(family: str) -> None:
    model, processor = build_tiny_vlm(family)
    adapter = TargetAdapter.from_model(model, processor)
    gen = torch.Generator().manual_seed(0)
    prompts = {n: torch.randint(3, 50, (1, n), generator=gen) for n in (12, 17)}
    new = torch.randint(3, 50, (1, 3), generator=gen)
    kept = KeptPrefills(adapter)

    def fill(n: int):
        return adapter.prefill({"input_ids": prompts[n]})

    def verify() -> torch.Tensor:
        logits = adapter.verify(new).logits
        adapter.rollback(3)
        return logits

    kept.get(12, fill)
    kept.get(17, fill)
    verify()  # leaves the 17-cache rolled back to 17
    kept.get(12, fill)  # swapped back in
    assert adapter.cache_len == 12 and kept.prefills == 2
    swapped = verify()
    fill(12)  # a fresh prefill of the same tokens
    assert torch.allclose(verify(), swapped, atol=1e-5)


def test_cache_bytes_counts_keys_and_values() -> None:
    model, processor = build_tiny_vlm("llava")
    adapter = TargetAdapter.from_model(model, processor)
    adapter.prefill({"input_ids": torch.randint(3, 50, (1, 10))})
    layers = adapter.cache.layers
    expected = sum(2 * layer.keys.numel() * layer.keys.element_size() for layer in layers)
    assert cache_bytes(adapter.cache) == expected > 0
    assert cache_bytes(object()) == 0
