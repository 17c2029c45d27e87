"""Importance sorting before phase 2: every attention's heads and every MLP's channels reordered
by |grad x weight| so that each smaller subnet is a prefix of a bigger one (once-for-all)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from dreams_nas.supernet.core.dist import current
from dreams_nas.supernet.draft.elastic import importance_order
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.training.batching import DraftBatch, LossSetup, loss_terms
from dreams_nas.supernet.training.config import TrainConfig
from dreams_nas.supernet.training.precision import MixedPrecision


def sort_heads(model: DreamDraft, batches: Sequence[DraftBatch], distill_layers: Sequence[int],
               config: TrainConfig, optimizer: torch.optim.Optimizer | None = None,
               amp: MixedPrecision | None = None) -> list[list[int]]:
    """Accumulate |grad x weight| per head and per MLP channel over `batches` (full draft,
    layers cycled), then reorder every attention's heads and every MLP's channels (and the
    optimizer's moments) by decreasing importance, the totals summed over the data-parallel
    ranks first so that every rank takes the same orders. Returns the head orders.
    `amp`: the forward's autocast (the loss is scaled alike; a common scale keeps the order)."""
    attns = model.attentions()
    mlps = model.mlps()
    totals = [torch.zeros(a.num_heads, device=a.q_proj.weight.device) for a in attns]
    channel_totals = [torch.zeros(m.inner, device=m.gate_proj.weight.device) for m in mlps]
    layers = model.config.inject_layers
    full = model.config.largest()
    setup = LossSetup(distill_layers, config.weights)
    for i, batch in enumerate(batches):
        model.zero_grad(set_to_none=True)
        spec = full.replace(inject_layer=layers[i % len(layers)])
        if amp is None:
            loss = loss_terms(model, batch, spec, setup)["loss"]
        else:
            with amp.autocast():
                loss = loss_terms(model, batch, spec, setup)["loss"]
            loss = amp.scaler.scale(loss)
        loss.backward()
        for total, attn in zip(totals, attns, strict=True):
            total += attn.head_importance()  # on the device: no copy per batch
        for total, mlp in zip(channel_totals, mlps, strict=True):
            total += mlp.channel_importance()
    model.zero_grad(set_to_none=True)
    # Data parallel: every rank ran the same batches, but a GPU's backward is not bitwise
    # reproducible, and two channels closer than its noise would sort differently on two
    # ranks (`World.average` would then mix unrelated channels). The orders are taken from
    # the totals summed over the ranks, the same bits on every rank.
    summed = current().sum_tensors([*totals, *channel_totals])
    totals, channel_totals = summed[:len(totals)], summed[len(totals):]
    for total, mlp in zip(channel_totals, mlps, strict=True):
        index = mlp.permute_channels(importance_order(total).to(mlp.gate_proj.weight.device))
        _permute_moments(optimizer, mlp.permuted_params(), index)
    orders = []
    for total, attn in zip(totals, attns, strict=True):
        order = importance_order(total)
        index = attn.permute_heads(order.to(attn.q_proj.weight.device))
        _permute_moments(optimizer, attn.permuted_params(), index)
        orders.append(order.tolist())
    return orders


def _permute_moments(optimizer: torch.optim.Optimizer | None,
                     params: Sequence[tuple[torch.nn.Parameter, int]], index: torch.Tensor
                     ) -> None:
    """Reorder the optimizer's per-parameter moments as their parameters were."""
    if optimizer is None:
        return
    for param, dim in params:
        for value in optimizer.state.get(param, {}).values():
            if torch.is_tensor(value) and value.shape == param.shape:
                value.copy_(value.index_select(dim, index))
