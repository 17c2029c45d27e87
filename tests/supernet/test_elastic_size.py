"""Elastic depth and MLP width: the extracted subnet equals the supernet with it active, the
importance sort keeps the function, old single-depth weights still load."""

from __future__ import annotations

import pytest
import torch
from _support.drafts import HIDDEN, tiny_draft, tiny_prompt, tiny_shared
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.draft.extract import extract
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.saving import load_supernet, save_supernet
from dreams_nas.supernet.draft.state import DraftCache

pytestmark = pytest.mark.usefixtures("one_thread")

SHARES = (0.25, 0.5, 1.0)
SPECS = [SubnetSpec(4, 1.0, 2, 1, depth=3, mlp=1.0), SubnetSpec(1, 0.25, 1, 1, depth=1, mlp=0.25),
         SubnetSpec(2, 0.5, 2, 3, depth=2, mlp=0.5), SubnetSpec(3, 0.75, 1, 5, depth=3, mlp=0.25),
         SubnetSpec(4, 1.0, 2, 2, depth=1, mlp=1.0)]


def elastic_draft(seed: int = 0) -> DreamDraft:
    return tiny_draft(seed, num_layers=3, mlp_shares=SHARES)


def _features(model: DreamDraft, tree: bool = False) -> torch.Tensor:
    """Logits of 5 positions at once then 1 over the cache (or a 2-node tree level)."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 50, (1, 7), generator=gen)
    prev = torch.randn(1, 7, HIDDEN, generator=gen)
    pos = torch.arange(12, 19)[None]
    layer_hidden, visual, scores = tiny_prompt(num_visual=8)
    with torch.no_grad():
        memory = model.memory(layer_hidden, visual, scores)
        cache = DraftCache()
        first = model(ids[:, :5], prev[:, :5], pos[:, :5], memory, cache=cache).feature
        mask = torch.tensor([[True, False], [False, True]]) if tree else None
        last = model(ids[:, 5:], prev[:, 5:], torch.tensor([[17, 17]]), memory, cache=cache,
                     tree_mask=mask).feature
    return model.logits(torch.cat((first, last), 1))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_extracted_subnet_equals_the_supernet_with_it_active(spec, tree):
    supernet = elastic_draft()
    with supernet.using(spec):
        expected = _features(supernet, tree)
    compact = extract(supernet, spec)
    assert compact.config.num_layers == spec.depth
    assert len(compact.layers_in) == len(compact.layers_out) == spec.depth
    assert compact.config.intermediate_size == supernet.config.mlp_channels(spec.mlp)
    assert compact.layers_in[0].mlp.gate_proj.weight.shape[0] == compact.config.intermediate_size
    torch.testing.assert_close(_features(compact, tree), expected)
    assert sum(p.numel() for p in compact.parameters()) == supernet.num_params(spec)
    assert compact.num_params() == supernet.num_params(spec)


def test_depth_and_width_change_the_output_and_the_size():
    supernet = elastic_draft()
    outputs, sizes = {}, {}
    for spec in SPECS:
        with supernet.using(spec):
            outputs[spec.id] = _features(supernet)
        sizes[spec.id] = supernet.num_params(spec)
    values = list(outputs.values())
    assert all(not torch.allclose(a, b) for i, a in enumerate(values) for b in values[i + 1:])
    assert sizes[SPECS[1].id] < sizes[SPECS[2].id] < sizes[SPECS[0].id]


def test_sorting_the_mlp_channels_keeps_the_function():
    supernet = elastic_draft()
    spec = SPECS[0]
    with supernet.using(spec):
        before = _features(supernet)
    for mlp in supernet.mlps():
        order = torch.randperm(mlp.inner, generator=torch.Generator().manual_seed(1))
        mlp.permute_channels(order)
    with supernet.using(spec):
        torch.testing.assert_close(_features(supernet), before)
    with pytest.raises(ValueError, match="not a permutation"):
        supernet.mlps()[0].permute_channels(torch.zeros(64, dtype=torch.long))


def test_a_subnet_outside_the_supernet_is_refused():
    supernet = elastic_draft()
    with pytest.raises(InputError, match="depth=4 is outside 1..3"):
        supernet.set_active(SubnetSpec(4, 1.0, 2, 1, depth=4))
    with pytest.raises(InputError, match="mlp=0.75 is not a width this draft was trained at"):
        supernet.set_active(SubnetSpec(4, 1.0, 2, 1, mlp=0.75))
    space = supernet.space()
    assert space.depth == (1, 2, 3) and space.mlp == SHARES
    assert space.largest() == SubnetSpec(4, 1.0, 2, 7, depth=3, mlp=1.0)


def test_weights_of_another_version_are_refused_in_one_line(tmp_path):
    """A draft saved with the names of a version before elastic depth (`layer_in.*`,
    `layer_out.*`) is not renamed on load: one line names the file and the command."""
    from safetensors.torch import load_file, save_file

    model = tiny_draft()
    save_supernet(model, tmp_path / "supernet")
    weights = tmp_path / "supernet" / "model.safetensors"
    state = load_file(weights)
    old = {name.replace("layers_in.0.", "layer_in.").replace("layers_out.0.", "layer_out."): t
           for name, t in state.items()}
    assert any(name.startswith("layer_in.") for name in old)
    save_file(old, weights)
    with pytest.raises(InputError, match=r"model.safetensors does not fit its config.json "
                                         r"\(.*\); retrain the supernet with `dreams-nas train`"):
        load_supernet(tmp_path / "supernet", tiny_shared(0))


def test_a_shallow_subnet_keeps_the_first_and_last_layers():
    """Depth d runs the first d layers before the cross-attention and the last d after it."""
    supernet = elastic_draft()
    for depth in (1, 2, 3):
        with supernet.using(SubnetSpec(4, 1.0, 2, 1, depth=depth)):
            before, after = supernet.active_layers
        assert before == list(supernet.layers_in[:depth])
        assert after == list(supernet.layers_out[3 - depth:])
    compact = extract(supernet, SubnetSpec(4, 1.0, 2, 1, depth=1))
    torch.testing.assert_close(compact.layers_out[0].mlp.down_proj.weight,
                               supernet.layers_out[2].mlp.down_proj.weight)
