"""Where the target's tokens rank among the draft's, at every start and level, from the
training-time test's parallel passes.

At temperature 0 a chain or a token tree started after y_t accepts along the target's greedy
continuation, and along that path the draft's inputs are the target's own tokens. Pass k of
`unroll.unrolled_forward` at text index q is level k+1 of the cycle whose true context ends at
q - k (it reads the draft's own features of passes 0..k-1 and attends to the true cache up to
q - k and its own chain after it). So level j of the cycle started at text index s is pass j-1
at s + j - 1, and the rank of the token at s + j in its distribution says whether a shape of
that width at level j keeps the target's path: one pass per level over a batch rank every start
of every sequence, where a rollout per start would cost a forward per start and level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.training.batching import DraftBatch
from dreams_nas.supernet.training.unroll import unrolled_forward
from torch import Tensor


def token_ranks(logits: Tensor, target: Tensor) -> Tensor:
    """Rank of target[i] in logits[i] (0 = the argmax; ties: lower id first, as `argmax`
    and the tree drafter's stable sort) -> (rows,) long."""
    logits = logits.float()
    value = logits.gather(-1, target[..., None])
    ids = torch.arange(logits.shape[-1], device=logits.device)
    return ((logits > value) | ((logits == value) & (ids < target[..., None]))).sum(-1)


@torch.no_grad()
def path_ranks(model: DreamDraft, batch: DraftBatch, spec: SubnetSpec, widths: Sequence[int],
               chunk: int = 1024) -> Tensor:
    """(batch, text, level) ranks, capped at `widths[j]` per level j.

    Entry [b, s, j-1] is the rank of the text token at s + j in the draft's distribution at
    level j of the cycle started at text index s, or `widths[j-1]` when it is not within that
    width, when an earlier level already left the widths (the path is not in the shape), or
    when s + j is past the sequence; starts before `DraftBatch.first_counted` (inside the prompt)
    are not ranked (`widths` throughout). `chunk`: positions whose logits are formed at once
    (bounds memory at large vocabularies)."""
    n_levels = len(widths)
    dtype = next(model.parameters()).dtype
    batch = replace(batch, prev_hidden=batch.prev_hidden.to(dtype),
                    memory_hidden={k: v.to(dtype) for k, v in batch.memory_hidden.items()},
                    visual_scores=batch.visual_scores.to(dtype))
    b, n = batch.text_ids.shape
    device = batch.text_ids.device
    caps = torch.tensor(list(widths), dtype=torch.long, device=device)
    ranks = caps.repeat(b, n, 1)
    if n_levels == 0 or n < 2:
        return ranks
    with model.using(spec.arch):
        memory = model.memory(batch.memory_hidden[spec.inject_layer], batch.visual_mask,
                              batch.visual_scores, batch.prompt_mask)
        start = batch.first_counted  # the prompt's last position: y_0's cycle starts after
        outs = unrolled_forward(model, batch.text_ids, batch.prev_hidden, batch.text_pos,
                                memory, batch.keys(model), n_levels - 1, start=start)
        for j, out in enumerate(outs):  # pass j: level j + 1, read at s + j, ranking s + j + 1
            width = n - 1 - j
            if width <= 0:
                break
            rank = caps[j].repeat(b, width)
            for c in range(min(start, width), width, chunk):  # starts before `start`: not ranked
                stop = min(width, c + chunk)
                feature = out.feature[:, j + c: j + stop]
                # inside `using`: the subnet's logits (its draft vocabulary)
                rank[:, c:stop] = token_ranks(model.logits(feature),
                                              batch.text_ids[:, j + 1 + c: j + 1 + stop])
            valid = batch.text_mask[:, j + 1:]
            ranks[:, :width, j] = torch.where(valid, rank.clamp(max=widths[j]), caps[j])
    ranks[:, :start] = caps  # starts before the first counted position are not ranked
    inside = ranks < caps
    # a level counts only when every level before it kept the path
    alive = torch.cumprod(inside.long(), dim=-1).bool()
    before = torch.cat((torch.ones_like(alive[..., :1]), alive[..., :-1]), dim=-1)
    return torch.where(before, ranks, caps.expand_as(ranks))
