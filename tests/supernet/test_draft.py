from __future__ import annotations

import dataclasses

import pytest
import torch
from _support.drafts import HIDDEN, tiny_draft, tiny_prompt
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.draft.state import (
    DraftCache,
    gather_rows,
    keep_count,
    select_memory_positions,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_visual_tokens_ranked_by_attention_received_in_original_order():
    visual = torch.tensor([[False, True, True, True, True, False]])
    scores = torch.tensor([[9.0, 0.1, 0.9, 0.2, 0.8, 9.0]])  # received attention
    prompt = torch.ones_like(visual)
    keep = select_memory_positions(visual, scores, prompt, 0.5)
    assert keep.tolist() == [[True, False, True, False, True, True]]
    pos = torch.arange(6, dtype=torch.float32)[None, :, None]
    states, mask = gather_rows(pos, keep)
    assert states[0, :, 0].tolist() == [0.0, 2.0, 4.0, 5.0]  # original order
    assert mask.all()
    assert keep_count(6, 0.25) == 2 and keep_count(1, 0.25) == 1 and keep_count(0, 0.5) == 0


def test_memory_shrinks_with_visual_keep():
    model = tiny_draft()
    layer_hidden, visual, scores = tiny_prompt(num_visual=8)
    lengths = []
    for keep in (0.25, 0.5, 1.0):
        with model.using(SubnetSpec(4, keep, 2, 1)):
            lengths.append(model.memory(layer_hidden, visual, scores).length)
    assert lengths == [4 + 2, 4 + 4, 4 + 8]


def _inputs(seq: int, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50, (1, seq), generator=gen)
    prev = torch.randn(1, seq, HIDDEN, generator=gen)
    pos = torch.arange(10, 10 + seq)[None]
    return ids, prev, pos


@pytest.mark.parametrize("heads", [1, 4])
def test_cached_incremental_forward_equals_one_pass_and_crop_rolls_back(heads):
    model = tiny_draft()
    spec = SubnetSpec(heads, 0.5, 1, 3)
    layer_hidden, visual, scores = tiny_prompt()
    ids, prev, pos = _inputs(7)
    with model.using(spec), torch.no_grad():
        memory = model.memory(layer_hidden, visual, scores)
        full = model(ids, prev, pos, memory).feature
        cache = DraftCache()
        a = model(ids[:, :4], prev[:, :4], pos[:, :4], memory, cache=cache).feature
        b = model(ids[:, 4:5], prev[:, 4:5], pos[:, 4:5], memory, cache=cache).feature
        assert cache.length == 5
        cache.crop(4)
        c = model(ids[:, 4:], prev[:, 4:], pos[:, 4:], memory, cache=cache).feature
    torch.testing.assert_close(torch.cat((a, c), 1), full)
    torch.testing.assert_close(b, full[:, 4:5])
    with pytest.raises(ValueError, match="cannot crop"):
        cache.crop(99)


def test_a_one_position_step_without_a_mask_equals_the_masked_step_bit_for_bit():
    # a single new position sees every cached position and itself: the step applies no mask
    # to its self-attention, nor to its cross-attention over one request's memory (no padding)
    model = tiny_draft()
    spec = SubnetSpec(3, 0.5, 1, 3)
    layer_hidden, visual, scores = tiny_prompt()
    ids, prev, pos = _inputs(6)
    with model.using(spec), torch.inference_mode():
        memory = model.memory(layer_hidden, visual, scores)
        assert not memory.padded and memory.attn_mask is None
        padded = dataclasses.replace(memory, padded=True)
        assert padded.attn_mask is not None
        assert padded.attn_mask.shape == (1, 1, 1, memory.length)
        features = []
        for mem, everything in ((memory, None), (padded, torch.ones(1, 1, dtype=torch.bool))):
            cache = DraftCache()
            model(ids[:, :5], prev[:, :5], pos[:, :5], mem, cache=cache)
            # a tree mask of one visible node forces the mask path with the same visibility
            features.append(model(ids[:, 5:], prev[:, 5:], pos[:, 5:], mem, cache=cache,
                                  tree_mask=everything).feature)
    assert torch.equal(features[0], features[1])


def test_a_batch_memory_keeps_its_padding_mask():
    model = tiny_draft()
    layer_hidden, visual, scores = tiny_prompt()
    with model.using(SubnetSpec(4, 0.5, 1, 3)):
        memory = model.memory(layer_hidden.repeat(2, 1, 1), visual.repeat(2, 1),
                              scores.repeat(2, 1))
    assert memory.padded and memory.attn_mask is not None


def test_padding_does_not_change_real_positions():
    model = tiny_draft()
    layer_hidden, visual, scores = (t.expand(2, *t.shape[1:]) for t in tiny_prompt())
    ids, prev, pos = _inputs(6)
    ids2, prev2, pos2 = (torch.cat((t, t)) for t in (ids, prev, pos))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    with torch.no_grad():
        memory = model.memory(layer_hidden, visual, scores)
        out = model(ids2, prev2, pos2, memory, attention_mask=mask).feature
    torch.testing.assert_close(out[1, :4], out[0, :4])


def test_closed_gates_make_the_memory_irrelevant_at_init():
    model = tiny_draft(open_gates=False)
    ids, prev, pos = _inputs(5)
    outs = []
    for seed in (0, 1):
        layer_hidden, visual, scores = tiny_prompt(seed=seed)
        with torch.no_grad():
            outs.append(model(ids, prev, pos, model.memory(layer_hidden, visual, scores)).feature)
    torch.testing.assert_close(outs[0], outs[1])


def test_active_subnet_is_validated_and_restored():
    model = tiny_draft()
    full = model.active
    with model.using(SubnetSpec(2, 0.5, 1, 3)):
        assert model.active.heads == 2
    assert model.active == full
    with pytest.raises(InputError, match="inject_layer=3 is not one this draft was trained for"):
        model.set_active(SubnetSpec(2, 0.5, 3, 3))
    with pytest.raises(InputError, match="heads=8 is outside 1..4"):
        model.set_active(SubnetSpec(8, 0.5, 1, 3))
    with pytest.raises(InputError, match="heads=8 is outside 1..4"):  # refused every time
        model.set_active(SubnetSpec(8, 0.5, 1, 3))
    assert model.active == full


def test_shared_modules_are_not_parameters():
    model = tiny_draft()
    names = [n for n, _ in model.named_parameters()]
    assert not any("embed" in n or "lm_head" in n for n in names)
    assert model.num_params(SubnetSpec(1, 1.0, 1, 1)) < model.num_params(SubnetSpec(4, 1.0, 1, 1))


def test_the_own_sequence_holds_the_kept_visual_tokens_only_in_self_mode():
    """With visual_in_self the draft's own positions are its memory's (text + the kept visual
    tokens, by the attention they receive); without, the text only."""
    layer_hidden, visual, scores = tiny_prompt(num_visual=8)
    model = tiny_draft()
    assert model.config.visual_in_self
    for keep in (0.25, 0.5, 1.0):
        with model.using(SubnetSpec(4, keep, 2, 1)):
            own = model.draft_positions(visual, scores)
            expected = select_memory_positions(visual, scores, torch.ones_like(visual), keep)
            assert torch.equal(own, expected)
            assert int(own.sum()) == 4 + keep_count(8, keep)
    cross = tiny_draft(visual_in_self=False)
    with cross.using(SubnetSpec(4, 1.0, 2, 1)):
        assert torch.equal(cross.draft_positions(visual, scores), ~visual)


def test_a_config_without_a_field_of_this_version_is_refused_not_defaulted():
    """A config saved before `visual_in_self` meant the memory only, not today's default: no
    field is read with a default; the config names what it lacks."""
    from dreams_nas.supernet.draft.config import DraftConfig

    data = tiny_draft().config.to_dict()
    assert data["visual_in_self"] is True
    del data["visual_in_self"], data["vocab_shares"]
    with pytest.raises(InputError, match=r"^the draft config lacks \['visual_in_self', "
                                         r"'vocab_shares'\]: another dreams-nas version wrote it$"):
        DraftConfig.from_dict(data)
    with pytest.raises(InputError, match=r"^draft config schema_version=2 is another dreams-nas "
                                         r"version's \(this one reads 1\)$"):
        DraftConfig.from_dict({**tiny_draft().config.to_dict(), "schema_version": 2})


def test_masked_keys_equal_removed_positions_and_stay_finite():
    """Training masks the visual tokens a subnet drops; drafting leaves them out. Both give
    the same features at the kept positions, even when a dropped token comes first (it sees
    only itself, so nothing turns NaN)."""
    model = tiny_draft()
    layer_hidden, visual, scores = tiny_prompt(prompt_len=10, num_visual=4)
    visual[:, :2] = True  # the prompt opens with visual tokens
    scores[:, 0] = -1.0  # ... and the first one is dropped at any keep below 1
    ids, prev, pos = _inputs(10)
    pos = torch.arange(10)[None]
    with model.using(SubnetSpec(2, 0.5, 1, 1)), torch.no_grad():
        memory = model.memory(layer_hidden, visual, scores)
        keys = model.draft_positions(visual, scores)
        assert not bool(keys[0, 0])
        masked = model(ids, prev, pos, memory, attention_mask=keys).feature
        kept = keys[0].nonzero().flatten()
        removed = model(ids[:, kept], prev[:, kept], pos[:, kept], memory).feature
    assert torch.isfinite(masked).all()
    torch.testing.assert_close(masked[:, kept], removed)
