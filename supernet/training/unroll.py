"""Training-time test: train the draft on its own features, as it drafts (EAGLE-3 style).

While drafting, step k of a cycle feeds the draft's own feature F_{p-1} in place of the target's
hidden state, and its self-attention sees the true cache (positions <= p-k) plus the chain of
positions drafted before it in this cycle. Pass 0 is the ordinary teacher-forced forward; pass
k (1..passes) recomputes every position p as the k-th drafted step: input (x_p, F^{k-1}_{p-1}),
attending to pass-0 keys at j <= p-k and to pass-i keys at j = p-k+i (i = 1..k). All positions
of a pass run in parallel, so an unroll of k passes costs k extra forwards, not k * seq.

Only the positions a cycle can start from need the drafting passes: pass k runs over positions
from `start` + k on (`start`: the first position whose prediction counts, the prompt's last), so
a prompt of hundreds of visual tokens in the draft's own sequence costs one pass, not
passes + 1; earlier positions of those passes are zeros.
"""

from __future__ import annotations

import math

import torch
from dreams_nas.supernet.draft.elastic import apply_rotary, rotary_cos_sin
from dreams_nas.supernet.draft.layers import DecoderLayer
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.state import DraftOutput, Memory
from dreams_nas.supernet.ops.linear import linear, matmul
from torch import Tensor


def chain_attention(q: Tensor, kv: list[tuple[Tensor, Tensor]], key_mask: Tensor,
                    start: int = 0) -> Tensor:
    """Attention of pass k = len(kv) - 1 over the true context and its own drafting chain.

    Pass i >= 1 runs over positions start + i .. seq - 1, so query t = start + k + r (row r of
    q) reads pass 0's keys at j <= t - k = start + r and pass i's key at t - k + i, which is
    row r of pass i's keys as well.

    q: (batch, heads, seq - start - k, d); kv[0] = pass 0's (keys, values), each
    (batch, heads, seq, d); kv[i] = pass i's, (batch, heads, seq - start - i, d);
    key_mask: bool (batch, seq) the positions that are keys. Returns per-head outputs shaped
    as q.
    """
    k = len(kv) - 1
    rows = q.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    k0, v0 = kv[0]
    logits0 = matmul(q, k0.transpose(-1, -2)) * scale  # (batch, heads, rows, seq)
    keys = torch.arange(k0.shape[2], device=q.device)
    local = torch.arange(rows, device=q.device)
    allowed = (keys[None, :] <= local[:, None] + start)[None, None] & key_mask[:, None, None, :]
    logits0 = logits0.masked_fill(~allowed, float("-inf"))
    chain_logits, chain_values = [], []
    for i in range(1, k + 1):
        ki, vi = kv[i][0][:, :, :rows], kv[i][1][:, :, :rows]
        chain_logits.append((q * ki).sum(-1) * scale)  # (batch, heads, rows)
        chain_values.append(vi)
    probs = torch.cat((logits0, torch.stack(chain_logits, -1)), dim=-1).softmax(-1)
    out = matmul(probs[..., :k0.shape[2]], v0)
    for i, vi in enumerate(chain_values):
        out = out + probs[..., k0.shape[2] + i, None] * vi
    return out


def _layer(layer: DecoderLayer, h: Tensor, heads: int, channels: int, cos: Tensor, sin: Tensor,
           past: list[tuple[Tensor, Tensor]],
           key_mask: Tensor, start: int) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    x = layer.input_norm(h)
    q = apply_rotary(layer.attn.project_q(x, heads), cos, sin)
    k, v = layer.attn.project_kv(x, heads)
    k = apply_rotary(k, cos, sin)
    if not past:
        seq = h.shape[1]
        causal = torch.ones(seq, seq, dtype=torch.bool, device=h.device).tril()
        own = torch.eye(seq, dtype=torch.bool, device=h.device)  # a dropped position: finite
        mask = (causal[None, None] & key_mask[:, None, None, :]) | own
        attn = layer.attn.attend(q, k, v, mask)
    else:
        attn = layer.attn.output(chain_attention(q, [*past, (k, v)], key_mask, start))
    h = h + attn
    return h + layer.mlp(layer.post_norm(h), channels), (k, v)


def unrolled_forward(model: DreamDraft, input_ids: Tensor, prev_hidden: Tensor,
                     position_ids: Tensor, memory: Memory | None, attention_mask: Tensor,
                     passes: int, start: int = 0) -> list[DraftOutput]:
    """Pass 0 (teacher forced) and `passes` drafting passes; one DraftOutput per pass.

    Shapes as in `DreamDraft.forward`; attention_mask: bool (batch, seq) the positions that
    are keys (`DraftBatch.keys`: real, and visual only where the subnet keeps them). Pass k >= 1
    runs over positions start + k .. seq - 1 only (its outputs before are zeros): `start` is
    the first position a drafting cycle may start from (its pass 0 output is level 1).
    """
    heads, channels = model.active.heads, model.active_channels
    before, after = model.active_layers
    x = model.embed(input_ids).to(prev_hidden.dtype)
    cos, sin = rotary_cos_sin(position_ids, model.config.head_dim, model.config.rope_theta)
    seq = x.shape[1]
    start = max(0, int(start))
    # per decoder layer (before the cross-attention, then after): each pass's keys/values
    past: list[list[tuple[Tensor, Tensor]]] = [[] for _ in range(len(before) + len(after))]
    outputs: list[DraftOutput] = []
    prev = prev_hidden
    for k in range(passes + 1):
        lo = 0 if k == 0 else start + k
        if lo >= seq:  # no position left to draft from: this pass and the deeper ones are empty
            zeros = prev_hidden.new_zeros(prev_hidden.shape)
            outputs += [DraftOutput(zeros, zeros if model.cross is not None else None)
                        for _ in range(k, passes + 1)]
            break
        h = linear(torch.cat((x[:, lo:], prev[:, lo:]), dim=-1), model.fuse.weight)
        c, s_ = cos[:, :, lo:], sin[:, :, lo:]
        kvs = []
        for i, layer in enumerate(before):
            h, kv = _layer(layer, h, heads, channels, c, s_, past[i], attention_mask, start)
            kvs.append(kv)
        cross_out = None
        if model.cross is not None:
            h = model.cross(h, heads, memory, channels)
            cross_out = _pad(h, lo, seq)
        for i, layer in enumerate(after):
            h, kv = _layer(layer, h, heads, channels, c, s_, past[len(before) + i],
                           attention_mask, start)
            kvs.append(kv)
        for slot, kv in zip(past, kvs, strict=True):
            slot.append(kv)
        feature = _pad(model.norm(h), lo, seq)
        outputs.append(DraftOutput(feature=feature, cross_out=cross_out))
        # next pass: position p reads this pass's feature at p - 1
        prev = torch.cat((torch.zeros_like(feature[:, :1]), feature[:, :-1]), dim=1)
    return outputs


def _pad(x: Tensor, lo: int, seq: int) -> Tensor:
    """x: (batch, seq - lo, hidden) -> (batch, seq, hidden), zeros before `lo`."""
    if lo == 0:
        return x
    return torch.cat((x.new_zeros(x.shape[0], lo, x.shape[2]), x), dim=1)
