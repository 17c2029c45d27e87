from __future__ import annotations

import pytest
import torch
from dreams_nas.supernet.draft.elastic import ElasticAttention, importance_order

pytestmark = pytest.mark.usefixtures("one_thread")


def _run(attn: ElasticAttention, x: torch.Tensor, heads: int) -> torch.Tensor:
    q = attn.project_q(x, heads)
    k, v = attn.project_kv(x, heads)
    return attn.attend(q, k, v, None)


def test_sliced_heads_equal_a_small_module_with_copied_weights():
    torch.manual_seed(0)
    big = ElasticAttention(16, 4, 4)
    small = ElasticAttention(16, 2, 4)
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(small, name).weight.copy_(getattr(big, name).weight[:8])
        small.o_proj.weight.copy_(big.o_proj.weight[:, :8])
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(_run(big, x, 2), _run(small, x, 2))


def test_permuting_heads_keeps_the_full_output_and_sorts_importance():
    torch.manual_seed(0)
    attn = ElasticAttention(16, 4, 4)
    with torch.no_grad():  # make head 2 useless: it must end up last
        attn.o_proj.weight[:, 8:12] = 0
    x = torch.randn(3, 6, 16)
    before = _run(attn, x, 4)
    (_run(attn, x, 4) ** 2).sum().backward()
    importance = attn.head_importance()
    order = importance_order(importance)
    assert order[-1].item() == 2
    attn.permute_heads(order)
    torch.testing.assert_close(_run(attn, x, 4), before)
    attn.zero_grad()
    (_run(attn, x, 4) ** 2).sum().backward()
    after = attn.head_importance()
    assert torch.all(after[:-1] >= after[1:] - 1e-6)


def test_bad_head_count_and_bad_permutation_are_refused():
    attn = ElasticAttention(16, 4, 4)
    with pytest.raises(ValueError, match="heads=5 is outside this attention's 1..4"):
        attn.project_q(torch.randn(1, 2, 16), 5)
    with pytest.raises(ValueError, match="not a permutation"):
        attn.permute_heads(torch.tensor([0, 0, 1, 2]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_equals_llamas_rotate_half_bit_for_bit(dtype):
    from dreams_nas.supernet.draft.elastic import apply_rotary, rotary_cos_sin
    from transformers.models.llama.modeling_llama import rotate_half

    gen = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 4000, (2, 9), generator=gen)
    x = torch.randn(2, 3, 9, 32, generator=gen).to(dtype)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 32, 2, dtype=torch.float32) / 32))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None].to(dtype), emb.sin()[:, None].to(dtype)
    ours = apply_rotary(x, *rotary_cos_sin(positions, 32, 10000.0))
    assert ours.dtype == dtype
    assert torch.equal(ours, x * cos + rotate_half(x) * sin)


def test_rotary_tables_made_in_inference_mode_serve_training():
    from dreams_nas.supernet.draft.elastic import apply_rotary, rotary_cos_sin

    with torch.inference_mode():  # the inverse frequencies are cached here first
        rotary_cos_sin(torch.arange(4)[None], 8, 500.0)
    x = torch.randn(1, 2, 4, 8, requires_grad=True)
    apply_rotary(x, *rotary_cos_sin(torch.arange(4)[None], 8, 500.0)).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
