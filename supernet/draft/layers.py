"""The DREAM draft's layers: SwiGLU, the decoder layer, the cross-attention layer and the
injected-feature input (each with an elastic attention)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.elastic import ElasticAttention, apply_rotary
from dreams_nas.supernet.draft.state import DraftCache, Memory
from torch import Tensor, nn


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm Llama-style layer with elastic self-attention and rotary positions."""

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.input_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.attn = ElasticAttention(cfg.hidden_size, cfg.num_heads, cfg.head_dim)
        self.post_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, h: Tensor, heads: int, cos: Tensor, sin: Tensor, mask: Tensor,
                cache: DraftCache | None, index: int) -> Tensor:
        """h: (batch, seq, hidden); mask: bool (batch, 1, seq, keys)."""
        x = self.input_norm(h)
        q = apply_rotary(self.attn.project_q(x, heads), cos, sin)
        k, v = self.attn.project_kv(x, heads)
        k = apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.update(index, k, v)
        h = h + self.attn.attend(q, k, v, mask)
        return h + self.mlp(self.post_norm(h))


class CrossAttentionLayer(nn.Module):
    """Queries from the draft, keys/values from the memory; tanh gates start closed (zero)."""

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.query_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.attn = ElasticAttention(cfg.hidden_size, cfg.num_heads, cfg.head_dim)
        self.post_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        # cpu: parameters are made where the module is built, like nn.Linear's; .to() moves them
        self.attn_gate = nn.Parameter(torch.zeros(1))
        self.mlp_gate = nn.Parameter(torch.zeros(1))  # cpu: as attn_gate

    def forward(self, h: Tensor, heads: int, memory: Memory) -> Tensor:
        q = self.attn.project_q(self.query_norm(h), heads)
        mask = memory.mask[:, None, None, :]  # (batch, 1, 1, mem)
        h = h + torch.tanh(self.attn_gate) * self.attn.attend(q, memory.keys, memory.values, mask)
        return h + torch.tanh(self.mlp_gate) * self.mlp(self.post_norm(h))


class LayerInput(nn.Module):
    """Per-candidate-layer input adapter for the cross-attention memory.

    Why per layer (and not one shared projection or a layer embedding): the target's residual
    stream grows in norm and changes basis with depth, so features of layer 4 and layer 16 live
    on different scales and directions. A separate RMSNorm fixes the scale of each candidate and
    a separate linear map (initialised to the identity) rotates it into the space the shared
    cross-attention k/v projections read. Every candidate is trained (phase 1 and 2 pick a layer
    per step), costs the same at inference whichever layer is chosen, and an extracted draft
    keeps only its own layer's adapter.
    """

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        nn.init.eye_(self.proj.weight)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.norm(x))
