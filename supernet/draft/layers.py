"""The DREAM draft's layers: SwiGLU (elastic width), the decoder layer, the cross-attention
layer and the injected-feature input (each with an elastic attention)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.elastic import ElasticAttention, apply_rotary
from dreams_nas.supernet.draft.state import DraftCache, Memory
from dreams_nas.supernet.ops.linear import linear
from torch import Tensor, nn


def rms_norm(norm: nn.RMSNorm, x: Tensor) -> Tensor:
    """`norm(x)` without the module call: the same F.rms_norm, a few microseconds less of a
    draft step (seven norms per step of the paper's draft, where a step is ~1 ms on a CPU)."""
    return F.rms_norm(x, norm.normalized_shape, norm.weight, norm.eps)


class SwiGLU(nn.Module):
    """SwiGLU MLP with elastic width: a call uses the first `channels` intermediate channels
    (rows of gate/up, columns of down), which importance sorting makes the most useful ones."""

    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.inner = inner
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: Tensor, channels: int | None = None) -> Tensor:
        if channels is None or channels == self.inner:
            return linear(F.silu(linear(x, self.gate_proj.weight)) * linear(x, self.up_proj.weight),
                          self.down_proj.weight)
        if not 1 <= channels <= self.inner:
            raise ValueError(f"channels={channels} is outside this MLP's 1..{self.inner}; "
                             "pick a subnet from the supernet's search space")
        inner = F.silu(linear(x, self.gate_proj.weight[:channels])) * linear(
            x, self.up_proj.weight[:channels])
        return linear(inner, self.down_proj.weight[:, :channels])

    # --- importance sorting (as `ElasticAttention`'s heads) --------------------------
    def channel_importance(self) -> Tensor:
        """|grad x weight| summed over each channel's gate/up rows and down column ->
        (inner,). Needs `.grad` (call after `loss.backward()`)."""
        total = torch.zeros(self.inner, device=self.gate_proj.weight.device)
        for param, dim in self.permuted_params():
            if param.grad is None:
                raise RuntimeError("channel_importance needs gradients; run backward() first")
            score = (param.grad * param).abs().detach()
            total += score.sum(dim=1 - dim)
        return total

    def permuted_params(self) -> list[tuple[nn.Parameter, int]]:
        """(parameter, dim) pairs whose `dim` runs over the intermediate channels."""
        return [(self.gate_proj.weight, 0), (self.up_proj.weight, 0), (self.down_proj.weight, 1)]

    @torch.no_grad()
    def permute_channels(self, order: Tensor) -> Tensor:
        """Reorder channels in place so channel `order[i]` becomes channel i (the output is
        unchanged); returns the index."""
        if sorted(order.tolist()) != list(range(self.inner)):
            raise ValueError(f"order is not a permutation of 0..{self.inner - 1}")
        for param, dim in self.permuted_params():
            param.copy_(param.index_select(dim, order))
        return order


class DecoderLayer(nn.Module):
    """Pre-norm Llama-style layer with elastic self-attention and rotary positions."""

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.input_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.attn = ElasticAttention(cfg.hidden_size, cfg.num_heads, cfg.head_dim)
        self.post_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, h: Tensor, heads: int, cos: Tensor, sin: Tensor, mask: Tensor | None,
                cache: DraftCache | None, index: int, channels: int | None = None) -> Tensor:
        """h: (batch, seq, hidden); mask: bool (batch, 1, seq, keys), None where every key is
        visible; channels: the MLP's (None: all)."""
        x = rms_norm(self.input_norm, h)
        q = apply_rotary(self.attn.project_q(x, heads), cos, sin)
        k, v = self.attn.project_kv(x, heads)
        k = apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.update(index, k, v)
        h = h + self.attn.attend(q, k, v, mask)
        return h + self.mlp(rms_norm(self.post_norm, h), channels)


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

    def forward(self, h: Tensor, heads: int, memory: Memory,
                channels: int | None = None) -> Tensor:
        q = self.attn.project_q(rms_norm(self.query_norm, h), heads)
        h = h + torch.tanh(self.attn_gate) * self.attn.attend(q, memory.keys, memory.values,
                                                              memory.attn_mask)
        return h + torch.tanh(self.mlp_gate) * self.mlp(rms_norm(self.post_norm, h), channels)


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
        return linear(self.norm(x), self.proj.weight)
