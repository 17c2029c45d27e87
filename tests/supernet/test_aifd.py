from __future__ import annotations

import math

import pytest
import torch
from dreams_nas.supernet.training.aifd import (
    EntropyMeter,
    aifd_from_entropy,
    choose_layers,
    measure_target_entropy,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _uniform_map(width: int, queries: int = 6, keys: int = 8, heads: int = 2) -> torch.Tensor:
    attn = torch.zeros(1, heads, queries, keys)
    attn[..., :width] = 1.0 / width
    return attn


def test_picks_the_settled_low_entropy_layer_on_hand_made_maps():
    # widths 8, 8, 2, 2, 8 -> AE = log 8, log 8, log 2, log 2, log 8
    maps = [_uniform_map(w) for w in (8, 8, 2, 2, 8)]
    meter = EntropyMeter(5)
    meter.add(maps)
    ae = meter.mean()
    assert ae[0] == pytest.approx(math.log(8), rel=1e-5)
    assert ae[2] == pytest.approx(math.log(2), rel=1e-5)
    result = aifd_from_entropy(ae)
    # layer 3 is low entropy but the transition (large |dAE|); layer 4 is low and settled
    assert result.chosen == (4,)
    assert result.delta_ae[0] == 0.0
    assert result.delta_ae[2] == pytest.approx(math.log(2) - math.log(8), rel=1e-5)
    assert result.to_dict()["layers"] == [1, 2, 3, 4, 5]


def test_query_mask_excludes_padded_rows():
    attn = _uniform_map(8, queries=2)
    attn[:, :, 1] = 0
    attn[:, :, 1, 0] = 1.0  # the padded row has zero entropy
    meter = EntropyMeter(1)
    meter.add([attn], torch.tensor([[True, False]]))
    assert meter.mean()[0] == pytest.approx(math.log(8), rel=1e-5)


def test_choose_several_layers_and_ties():
    assert choose_layers([1.0, 1.0, 1.0, 1.0, 1.0], k=2) == [2, 3]
    # two layers: both are candidates; layer 2 pays for its large change (1/3 + 1 > 1 + 0)
    assert choose_layers([3.0, 1.0]) == [1]
    with pytest.raises(ValueError, match="no attention rows"):
        EntropyMeter(2).mean()


def test_measures_a_real_hf_model_with_eager_attention():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=4, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 40, (2, 7))
    ae = measure_target_entropy(model, [{"input_ids": ids, "attention_mask": torch.ones_like(ids)}])
    assert len(ae) == 3 and all(0 < a < math.log(7) for a in ae)
    assert model.config._attn_implementation == "sdpa"
