"""The unrolled (training-time test) passes equal real cached drafting, step by step."""

from __future__ import annotations

import pytest
import torch
from _support.drafts import HIDDEN, tiny_draft, tiny_prompt
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.draft.state import DraftCache
from dreams_nas.supernet.training.unroll import unrolled_forward

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(("heads", "n_passes"), [(2, 3), (4, 3), (4, 6)])
def test_pass_k_equals_the_kth_drafting_step(heads, n_passes):
    """Every unrolled pass up to the deepest draft (6 after the first step: draft_len 7, as
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
                                  torch.ones(1, seq, dtype=torch.bool), passes=n_passes)
        torch.testing.assert_close(passes[0].feature, model(ids, true_prev, pos, memory).feature)
        for c in range(seq - n_passes):  # a cycle whose true context ends at position c
            cache = DraftCache()
            feat = model(ids[:, :c + 1], true_prev[:, :c + 1], pos[:, :c + 1], memory,
                         cache=cache).feature[:, -1:]
            for k in range(1, n_passes + 1):
                p = c + k
                feat = model(ids[:, p:p + 1], feat, pos[:, p:p + 1], memory, cache=cache).feature
                torch.testing.assert_close(feat[0, 0], passes[k].feature[0, p], atol=1e-5,
                                           rtol=1e-4)


def test_passes_from_a_start_position_equal_the_full_passes_there():
    """Drafting passes run only from the first position a cycle may start at (a prompt's
    visual tokens then cost one pass, not passes + 1); there they equal the full passes, with
    a masked (dropped) key inside the prompt as well."""
    model = tiny_draft()
    gen = torch.Generator().manual_seed(3)
    seq, passes, start = 12, 4, 5
    ids = torch.randint(0, 50, (1, seq), generator=gen)
    prev = torch.randn(1, seq, HIDDEN, generator=gen)
    pos = torch.arange(seq)[None]
    keys = torch.ones(1, seq, dtype=torch.bool)
    keys[0, 2] = False
    layer_hidden, visual, scores = tiny_prompt()
    with model.using(SubnetSpec(4, 0.5, 1, 3)), torch.no_grad():
        memory = model.memory(layer_hidden, visual, scores)
        full = unrolled_forward(model, ids, prev, pos, memory, keys, passes=passes)
        cut = unrolled_forward(model, ids, prev, pos, memory, keys, passes=passes, start=start)
        late = unrolled_forward(model, ids, prev, pos, memory, keys, passes=passes, start=seq - 2)
    torch.testing.assert_close(cut[0].feature, full[0].feature)
    for k in range(1, passes + 1):
        torch.testing.assert_close(cut[k].feature[:, start + k:], full[k].feature[:, start + k:],
                                   atol=1e-5, rtol=1e-4)
        assert not cut[k].feature[:, :start + k].any()
        assert cut[k].cross_out is not None and not cut[k].cross_out[:, :start + k].any()
    assert len(late) == passes + 1 and not late[passes].feature.any()  # nothing left to draft
