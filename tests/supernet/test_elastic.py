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
