"""The DREAM draft's layers: SwiGLU (elastic width), the decoder layer, the cross-attention
layer and the injected-feature input (each with an elastic attention).

A layer's arithmetic is a function of its weights for one subnet (`decoder_step`,
`cross_step`): the first `heads` heads and MLP channels, as views of the layer's parameters
(`DecoderLayer.weights`, `CrossAttentionLayer.weights`). A module call slices them on every
call; `DreamDraft` keeps them per subnet for its forwards without gradients (a draft step of a
small draft is mostly per-call overhead, and slicing is part of it). Both run the same
function on the same numbers, so they agree bit for bit."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.elastic import (
    ElasticAttention,
    apply_rotary,
    merge_heads,
    split_heads,
)
from dreams_nas.supernet.draft.state import DraftCache, Memory, StaticDraftCache
from dreams_nas.supernet.ops.linear import linear
from torch import Tensor, nn


def swiglu(x: Tensor, gate: Tensor, up: Tensor, down: Tensor) -> Tensor:
    """down(silu(gate x) * up x) with the given (possibly sliced) weights."""
    return linear(F.silu(linear(x, gate)) * linear(x, up), down)


class DecoderWeights(NamedTuple):
    """A decoder layer's weights for one subnet: views of its parameters (the first `heads`
    heads' rows of q/k/v and columns of o, the first MLP channels)."""

    input_norm: Tensor
    input_eps: float | None
    q: Tensor
    k: Tensor
    v: Tensor
    o: Tensor
    post_norm: Tensor
    post_eps: float | None
    gate: Tensor
    up: Tensor
    down: Tensor
    heads: int
    head_dim: int


class CrossWeights(NamedTuple):
    """The cross-attention layer's weights for one subnet (its keys/values come with the
    memory); the gates are the parameters, their tanh taken per call."""

    query_norm: Tensor
    query_eps: float | None
    q: Tensor
    o: Tensor
    attn_gate: Tensor
    post_norm: Tensor
    post_eps: float | None
    mlp_gate: Tensor
    gate: Tensor
    up: Tensor
    down: Tensor
    heads: int
    head_dim: int


def decoder_step(h: Tensor, w: DecoderWeights, cos: Tensor, sin: Tensor, mask: Tensor | None,
                 cache: DraftCache | StaticDraftCache | None, index: int) -> Tensor:
    """A pre-norm Llama-style layer. h: (batch, seq, hidden); cos/sin from `rotary_cos_sin`;
    mask: bool (batch, 1, seq, keys), None where every key is visible; cache: the draft's KV
    cache (slot `index` gets the new keys/values)."""
    n1, e1, wq, wk, wv, wo, n2, e2, gate, up, down, heads, head_dim = w
    shape = (h.shape[-1],)
    x = F.rms_norm(h, shape, n1, e1)
    q = apply_rotary(split_heads(linear(x, wq), heads, head_dim), cos, sin)
    k = apply_rotary(split_heads(linear(x, wk), heads, head_dim), cos, sin)
    v = split_heads(linear(x, wv), heads, head_dim)
    if cache is not None:
        k, v = cache.update(index, k, v)
    h = h + linear(merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)), wo)
    return h + swiglu(F.rms_norm(h, shape, n2, e2), gate, up, down)


def cross_step(h: Tensor, w: CrossWeights, memory: Memory) -> Tensor:
    """Queries from the draft, keys/values from the memory, each branch behind its tanh gate."""
    qn, qe, wq, wo, attn_gate, n2, e2, mlp_gate, gate, up, down, heads, head_dim = w
    shape = (h.shape[-1],)
    q = split_heads(linear(F.rms_norm(h, shape, qn, qe), wq), heads, head_dim)
    out = F.scaled_dot_product_attention(q, memory.keys, memory.values,
                                         attn_mask=memory.attn_mask)
    h = h + torch.tanh(attn_gate) * linear(merge_heads(out), wo)
    return h + torch.tanh(mlp_gate) * swiglu(F.rms_norm(h, shape, n2, e2), gate, up, down)


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
        return swiglu(x, *self.weights(channels))

    def weights(self, channels: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """gate, up and down for the first `channels` (None: all): the parameters themselves
        at full width, else views of their first rows/columns."""
        if channels is None or channels == self.inner:
            return self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight
        if not 1 <= channels <= self.inner:
            raise ValueError(f"channels={channels} is outside this MLP's 1..{self.inner}; "
                             "pick a subnet from the supernet's search space")
        return (self.gate_proj.weight[:channels], self.up_proj.weight[:channels],
                self.down_proj.weight[:, :channels])

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
                cache: DraftCache | StaticDraftCache | None, index: int,
                channels: int | None = None) -> Tensor:
        """h: (batch, seq, hidden); mask: bool (batch, 1, seq, keys), None where every key is
        visible; channels: the MLP's (None: all). `decoder_step` with `weights`."""
        return decoder_step(h, self.weights(heads, channels), cos, sin, mask, cache, index)

    def weights(self, heads: int, channels: int | None = None) -> DecoderWeights:
        """This layer's weights for `heads` heads and `channels` MLP channels (None: all)."""
        a = self.attn
        inner = a.checked_inner(heads)
        return DecoderWeights(
            self.input_norm.weight, self.input_norm.eps, a.q_proj.weight[:inner],
            a.k_proj.weight[:inner], a.v_proj.weight[:inner], a.o_proj.weight[:, :inner],
            self.post_norm.weight, self.post_norm.eps, *self.mlp.weights(channels), heads,
            a.head_dim)


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
        """`cross_step` with `weights`."""
        return cross_step(h, self.weights(heads, channels), memory)

    def weights(self, heads: int, channels: int | None = None) -> CrossWeights:
        """This layer's weights for `heads` heads and `channels` MLP channels (None: all)."""
        a = self.attn
        inner = a.checked_inner(heads)
        return CrossWeights(
            self.query_norm.weight, self.query_norm.eps, a.q_proj.weight[:inner],
            a.o_proj.weight[:, :inner], self.attn_gate, self.post_norm.weight,
            self.post_norm.eps, self.mlp_gate, *self.mlp.weights(channels), heads, a.head_dim)


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


class ActiveWeights(NamedTuple):
    """The weights one subnet's forward reads: views of the draft's parameters."""

    fuse: Tensor
    before: tuple[DecoderWeights, ...]
    cross: CrossWeights | None
    after: tuple[DecoderWeights, ...]
    norm: Tensor
    norm_eps: float | None


def skipped_layers(num_layers: int, depth: int) -> tuple[str, ...]:
    """State-dict prefixes of the decoder layers a subnet of `depth` does not run (of a
    supernet with `num_layers` a side): layers_in.{depth..}, layers_out.{..num_layers-depth-1}."""
    return (tuple(f"layers_in.{i}." for i in range(depth, num_layers))
            + tuple(f"layers_out.{i}." for i in range(num_layers - depth)))
