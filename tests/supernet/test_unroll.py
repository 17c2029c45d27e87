"""The unrolled (training-time test) passes equal real cached drafting, step by step."""

from __future__ import annotations

import pytest
import torch
from _support.drafts import HIDDEN, tiny_draft, tiny_prompt
from dreams_nas.supernet.core.space import SubnetSpec
from dreams_nas.supernet.draft.state import DraftCache
from dreams_nas.supernet.training.unroll import unrolled_forward

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(("heads", "depth"), [(2, 3), (4, 3), (4, 6)])
def test_pass_k_equals_the_kth_drafting_step(heads, depth):
    """Every unrolled pass up to the deepest draft (6 after the first step: gamma 7, as
    EAGLE-3 trains) is the real drafting step it stands for."""
    model = tiny_draft()
    gen = torch.Generator().manual_seed(0)
    seq = 9
    ids = torch.randint(0, 50, (1, seq), generator=gen)
    true_prev = torch.randn(1, seq, HIDDEN, generator=gen)
    pos = torch.arange(20, 20 + seq)[None]
    layer_hidden, visual, scores = tiny_prompt()
    with model.using(SubnetSpec(heads, 0.5, 1, 3)), torch.no_grad():
        memory = model.memory(layer_hidden, visual, scores)
        passes = unrolled_forward(model, ids, true_prev, pos, memory,
                                  torch.ones(1, seq, dtype=torch.bool), depth=depth)
        torch.testing.assert_close(passes[0].feature, model(ids, true_prev, pos, memory).feature)
        for c in range(seq - depth):  # a cycle whose true context ends at position c
            cache = DraftCache()
            feat = model(ids[:, :c + 1], true_prev[:, :c + 1], pos[:, :c + 1], memory,
                         cache=cache).feature[:, -1:]
            for k in range(1, depth + 1):
                p = c + k
                feat = model(ids[:, p:p + 1], feat, pos[:, p:p + 1], memory, cache=cache).feature
                torch.testing.assert_close(feat[0, 0], passes[k].feature[0, p], atol=1e-5,
                                           rtol=1e-4)
