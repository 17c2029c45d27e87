"""The visual-token scores: the attention each visual token *receives* from the text.

At prefill the target's last decoder layer's q and k are recomputed from that layer's input (a
forward pre-hook, so the model keeps its fast attention kernel), and each visual token is scored
by the softmax attention the text positions after the image give it, averaged over heads and
text queries. A draft keeps the top `visual_keep` share of visual tokens by this score.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn
from transformers.models.llama.modeling_llama import rotate_half


def received_attention(attn: nn.Module, hidden: Tensor, cos: Tensor, sin: Tensor,
                        text_positions: Tensor, visual_positions: Tensor) -> Tensor:
    """Mean over heads and text queries of softmax(q k^T) at the visual keys -> (n_visual,)."""
    seq = hidden.shape[1]
    head_dim = attn.head_dim
    if len(text_positions) == 0:
        return torch.zeros(len(visual_positions), device=hidden.device)
    q = attn.q_proj(hidden[:, text_positions]).view(1, len(text_positions), -1, head_dim)
    k = attn.k_proj(hidden).view(1, seq, -1, head_dim)
    if hasattr(attn, "q_norm"):  # Qwen3-style per-head norms sit before RoPE
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = q.transpose(1, 2).float(), k.transpose(1, 2).float()  # (1, heads, n, head_dim)
    cos, sin = cos.float().unsqueeze(1), sin.float().unsqueeze(1)  # (1, 1, seq, head_dim)
    q = q * cos[:, :, text_positions] + rotate_half(q) * sin[:, :, text_positions]
    k = k * cos + rotate_half(k) * sin
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # grouped-query attention
    scaling = getattr(attn, "scaling", head_dim**-0.5)
    scores = (q @ k.transpose(-1, -2)) * scaling  # (1, heads, n_text, seq)
    causal = torch.arange(seq, device=hidden.device)[None, :] > text_positions[:, None]
    probs = scores.masked_fill(causal, float("-inf")).softmax(-1)
    return probs[..., visual_positions].mean(dim=(0, 1, 2))  # (n_visual,)


def score_hook(attn: nn.Module, input_ids: Tensor, visual_positions: Tensor,
               excluded: Iterable[int], out: list[Tensor]) -> Callable[[], Any]:
    """A factory of the pre-hook on the last layer's attention `attn` that appends the visual
    tokens' scores to `out`: the queries are the positions after the image whose ids are not
    in `excluded` (the image token and the structural image tokens)."""
    after = torch.arange(len(input_ids), device=input_ids.device) > visual_positions.max()
    is_text = after.clone()
    for tid in excluded:
        is_text &= input_ids != tid
    text_positions = is_text.nonzero().flatten()

    def hook(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]  # (1, seq, hidden) after norm
        cos, sin = kwargs["position_embeddings"]  # (1, seq, head_dim)
        out.append(received_attention(module, hidden, cos, sin, text_positions,
                                      visual_positions))

    return lambda: attn.register_forward_pre_hook(hook, with_kwargs=True)
