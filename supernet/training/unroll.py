"""Training-time test: train the draft on its own features, as it drafts (EAGLE-3 style).

While drafting, step k of a cycle feeds the draft's own feature F_{p-1} in place of the target's
hidden state, and its self-attention sees the true cache (positions <= p-k) plus the chain of
positions drafted before it in this cycle. Pass 0 is the ordinary teacher-forced forward; pass
k (1..depth) recomputes every position p as the k-th drafted step: input (x_p, F^{k-1}_{p-1}),
attending to pass-0 keys at j <= p-k and to pass-i keys at j = p-k+i (i = 1..k). All positions
of a pass run in parallel, so a depth-k unroll costs k extra forwards, not k * seq.
"""

from __future__ import annotations

import math

import torch
from dreams_nas.supernet.draft.elastic import apply_rotary, rotary_cos_sin
from dreams_nas.supernet.draft.layers import DecoderLayer
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.state import DraftOutput, Memory
from torch import Tensor


def _shift(x: Tensor, n: int) -> Tensor:
    """x: (batch, heads, seq, d) -> x[..., p - n, :] at p (zeros where p < n)."""
    if n == 0:
        return x
    pad = torch.zeros_like(x[:, :, :n])
    return torch.cat((pad, x[:, :, :-n]), dim=2)


def chain_attention(q: Tensor, kv: list[tuple[Tensor, Tensor]], key_mask: Tensor) -> Tensor:
    """Attention of pass k = len(kv) - 1 over the true context and its own drafting chain.

    q: (batch, heads, seq, d); kv[i] = (keys, values) of pass i, each (batch, heads, seq, d);
    key_mask: bool (batch, seq) real positions. Returns per-head outputs (batch, heads, seq, d).
    """
    k = len(kv) - 1
    seq = q.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    k0, v0 = kv[0]
    logits0 = (q @ k0.transpose(-1, -2)) * scale  # (batch, heads, seq, seq)
    pos = torch.arange(seq, device=q.device)
    allowed = (pos[None, :] <= pos[:, None] - k)[None, None] & key_mask[:, None, None, :]
    logits0 = logits0.masked_fill(~allowed, float("-inf"))
    chain_logits, chain_values = [], []
    for i in range(1, k + 1):
        ki, vi = _shift(kv[i][0], k - i), _shift(kv[i][1], k - i)
        logit = (q * ki).sum(-1) * scale  # (batch, heads, seq)
        valid = pos >= (k - i)
        chain_logits.append(logit.masked_fill(~valid[None, None], float("-inf")))
        chain_values.append(vi)
    probs = torch.cat((logits0, torch.stack(chain_logits, -1)), dim=-1).softmax(-1)
    out = probs[..., :seq] @ v0
    for i, vi in enumerate(chain_values):
        out = out + probs[..., seq + i, None] * vi
    return out


def _layer(layer: DecoderLayer, h: Tensor, heads: int, cos: Tensor, sin: Tensor,
           past: list[tuple[Tensor, Tensor]],
           key_mask: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    x = layer.input_norm(h)
    q = apply_rotary(layer.attn.project_q(x, heads), cos, sin)
    k, v = layer.attn.project_kv(x, heads)
    k = apply_rotary(k, cos, sin)
    if not past:
        seq = h.shape[1]
        causal = torch.ones(seq, seq, dtype=torch.bool, device=h.device).tril()
        mask = causal[None, None] & key_mask[:, None, None, :]
        attn = layer.attn.attend(q, k, v, mask)
    else:
        attn = layer.attn.output(chain_attention(q, [*past, (k, v)], key_mask))
    h = h + attn
    return h + layer.mlp(layer.post_norm(h)), (k, v)


def unrolled_forward(model: DreamDraft, input_ids: Tensor, prev_hidden: Tensor,
                     position_ids: Tensor, memory: Memory | None, attention_mask: Tensor,
                     depth: int) -> list[DraftOutput]:
    """Pass 0 (teacher forced) and `depth` drafting passes; one DraftOutput per pass.

    Shapes as in `DreamDraft.forward`; attention_mask: bool (batch, seq) real positions.
    """
    heads = model.active.heads
    x = model.embed(input_ids).to(prev_hidden.dtype)
    cos, sin = rotary_cos_sin(position_ids, model.config.head_dim, model.config.rope_theta)
    past_in: list[tuple[Tensor, Tensor]] = []
    past_out: list[tuple[Tensor, Tensor]] = []
    outputs: list[DraftOutput] = []
    prev = prev_hidden
    for _ in range(depth + 1):
        h = model.fuse(torch.cat((x, prev), dim=-1))
        h, kv_in = _layer(model.layer_in, h, heads, cos, sin, past_in, attention_mask)
        cross_out = None
        if model.cross is not None:
            h = model.cross(h, heads, memory)
            cross_out = h
        h, kv_out = _layer(model.layer_out, h, heads, cos, sin, past_out, attention_mask)
        past_in.append(kv_in)
        past_out.append(kv_out)
        feature = model.norm(h)
        outputs.append(DraftOutput(feature=feature, cross_out=cross_out))
        # next pass: position p reads this pass's feature at p - 1
        prev = torch.cat((torch.zeros_like(feature[:, :1]), feature[:, :-1]), dim=1)
    return outputs
