"""`DreamDraft.active_weights`: a forward without gradients reads the subnet's weights kept per
(heads, depth, mlp); with gradients it slices them anew. Both run the same layer functions,
so they agree bit for bit, and the kept views never go stale: they follow in-place changes of
the parameters, are sliced again when a parameter is replaced in any way (the draft moved, a
parent's `load_state_dict(assign=True)`, a submodule moved on its own, `param.data = ...`, a
parameter or layer assigned), and a copy of the draft keeps none."""

from __future__ import annotations

import copy

import pytest
import torch
from _support.drafts import HIDDEN, tiny_draft, tiny_prompt
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.draft.layers import DecoderLayer
from dreams_nas.supernet.draft.state import DraftCache
from torch import nn
from torch.optim.swa_utils import AveragedModel

pytestmark = pytest.mark.usefixtures("one_thread")

SPECS = [SubnetSpec(1, 0.5, 1, 3, depth=1, mlp=0.25), SubnetSpec(4, 1.0, 2, 3, depth=2, mlp=1.0),
         SubnetSpec(2, 0.25, 2, 3, depth=2, mlp=0.5)]


def _model():
    return tiny_draft(num_layers=2, mlp_shares=(0.25, 0.5, 1.0))


def _inputs(seq: int, batch: int = 1, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 50, (batch, seq), generator=gen),
            torch.randn(batch, seq, HIDDEN, generator=gen), torch.arange(10, 10 + seq)[None])


def _run(model, spec, grad: bool):
    """A prefill of 5 positions, a one-position step and a tree level of two nodes."""
    layer_hidden, visual, scores = tiny_prompt()
    ids, prev, pos = _inputs(8)
    tree = torch.tensor([[True, False], [False, True]])
    context = torch.enable_grad() if grad else torch.inference_mode()
    with model.using(spec), context:
        memory = model.memory(layer_hidden, visual, scores)
        cache = DraftCache()
        a = model(ids[:, :5], prev[:, :5], pos[:, :5], memory, cache=cache).feature
        b = model(ids[:, 5:6], prev[:, 5:6], pos[:, 5:6], memory, cache=cache).feature
        c = model(ids[:, 6:], prev[:, 6:], pos[:, 6:], memory, cache=cache,
                  tree_mask=tree).feature
    return [t.detach() for t in (a, b, c)]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
def test_the_kept_weights_give_the_sliced_weights_numbers_bit_for_bit(spec):
    model = _model()
    for kept, sliced in zip(_run(model, spec, grad=False), _run(model, spec, grad=True),
                            strict=True):
        assert torch.equal(kept, sliced)


def test_a_forward_with_gradients_slices_and_trains_every_weight_it_reads():
    model = _model()
    spec = SPECS[2]
    with model.using(spec), torch.inference_mode():
        model.active_weights()  # kept views exist; the graph must not use them
    layer_hidden, visual, scores = tiny_prompt()
    ids, prev, pos = _inputs(6)
    with model.using(spec):
        memory = model.memory(layer_hidden, visual, scores)
        model(ids, prev, pos, memory).feature.square().sum().backward()
    layer = model.layers_out[-1]
    assert layer.attn.q_proj.weight.grad is not None
    inner = spec.heads * layer.attn.head_dim
    assert layer.attn.q_proj.weight.grad[inner:].abs().sum() == 0  # heads it does not run
    assert layer.attn.q_proj.weight.grad[:inner].abs().sum() > 0


def test_kept_weights_follow_in_place_changes_of_the_parameters():
    model = _model()
    spec = SPECS[1]
    before = _run(model, spec, grad=False)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.1)  # as an optimizer step: in place
    after = _run(model, spec, grad=False)
    fresh = _run(model, spec, grad=True)
    assert not torch.equal(before[1], after[1])
    assert all(torch.equal(x, y) for x, y in zip(after, fresh, strict=True))


def test_moving_or_replacing_the_parameters_drops_the_kept_weights():
    model = _model()
    spec = SPECS[1]
    _run(model, spec, grad=False)
    model.to(torch.float64)  # .to replaces every parameter's tensor
    assert model._weights == {}
    with model.using(spec), torch.inference_mode():
        assert model.active_weights().fuse.dtype == torch.float64
    other = _model()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.5)
    model = _model()
    _run(model, spec, grad=False)
    model.load_state_dict(other.state_dict(), assign=True)
    assert all(torch.equal(x, y) for x, y in zip(_run(model, spec, grad=False),
                                                 _run(other, spec, grad=False), strict=True))


def test_weights_are_kept_per_architecture_not_per_spec():
    model = _model()
    with torch.inference_mode():
        for spec in (SPECS[0], SubnetSpec(1, 1.0, 2, 7, depth=1, mlp=0.25), SPECS[1]):
            with model.using(spec):
                model.active_weights()
    assert len(model._weights) == 2  # visual_keep, inject_layer and draft_len share the weights


@torch.no_grad()
def _step(model):
    """An optimizer step (SGD's update; torch.optim's first use costs seconds of imports):
    every parameter changed in place."""
    for p in model.parameters():
        p.sub_(0.05)


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _submodule_moved_and_back(model):
    model.layers_out[-1].to(torch.float64).to(torch.float32)  # DreamDraft._apply is not called


def _data_assigned(model):
    for p in model.parameters():
        p.data = p.data.clone()


def _parent_loads_with_assign(model):
    parent = nn.ModuleDict({"draft": model})  # loads through each submodule's own hook
    parent.load_state_dict({k: v.clone() for k, v in parent.state_dict().items()}, assign=True)


def _parameter_assigned(model):
    q = model.layers_out[-1].attn.q_proj
    q.weight = nn.Parameter(q.weight.detach().clone())


def _layer_assigned(model):
    layer = DecoderLayer(model.config)
    layer.load_state_dict(model.layers_in[0].state_dict())
    model.layers_in[0] = layer


@pytest.mark.parametrize("replace", [_submodule_moved_and_back, _data_assigned,
                                     _parent_loads_with_assign, _parameter_assigned,
                                     _layer_assigned], ids=lambda f: f.__name__.strip("_"))
def test_kept_weights_follow_a_parameter_replaced_by_any_route(replace):
    """The same numbers in new tensors, then a step on those: the kept views must be theirs."""
    model = _model()
    spec = SPECS[1]
    before = _run(model, spec, grad=False)
    replace(model)
    assert _same(_run(model, spec, grad=False), before)
    _step(model)
    after = _run(model, spec, grad=False)
    assert not torch.equal(after[1], before[1])
    assert _same(after, _run(model, spec, grad=True))
    with model.using(spec), torch.inference_mode():
        assert model.active_weights() is model.active_weights()  # kept again


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode],
                         ids=["no_grad", "inference_mode"])
def test_a_deep_copy_drafts_with_its_own_weights(context):
    """A snapshot taken after a forward without gradients, then trained: the copy drafts with
    its new weights, the original with its own."""
    model = _model()
    spec = SPECS[2]
    layer_hidden, visual, scores = tiny_prompt()
    ids, prev, pos = _inputs(3)
    with model.using(spec), context():
        model(ids, prev, pos, model.memory(layer_hidden, visual, scores))
    before = _run(model, spec, grad=False)
    snapshot = copy.deepcopy(model)
    _step(snapshot)
    after = _run(snapshot, spec, grad=False)
    assert not torch.equal(after[1], before[1])
    assert _same(after, _run(snapshot, spec, grad=True))
    assert _same(_run(model, spec, grad=False), before)


def test_an_averaged_model_drafts_with_the_averaged_weights():
    """SWA: `AveragedModel` deep-copies the draft and averages into the copy in place."""
    model = _model()
    spec = SPECS[0]
    _run(model, spec, grad=False)
    averaged = AveragedModel(model)
    _step(model)
    averaged.update_parameters(model)
    averaged.update_parameters(model)  # the second averages in place
    fresh = _model()
    fresh.load_state_dict(averaged.module.state_dict())
    assert _same(_run(averaged.module, spec, grad=False), _run(fresh, spec, grad=False))
