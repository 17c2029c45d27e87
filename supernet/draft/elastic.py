"""Elastic attention: maximal weights, sliced on use, heads sorted by importance.

Every attention layer of the draft holds the weights of its *largest* configuration
(`num_heads` heads). A subnet with `heads = h` uses the first `h` heads only, by slicing the
projection weights (`weight[: h * head_dim]` for q/k/v, `weight[:, : h * head_dim]` for o), so
its matrix products really are smaller (once-for-all's "good half"). Heads are sorted by
importance (|gradient x weight| summed over each head's weights, accumulated over calibration
batches) and the weights reordered, so every smaller subnet is a prefix of a bigger one.

The module holds no "active" state: the number of heads is an argument of every call and the
draft model decides it in one place (`DreamDraft.set_active`).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from dreams_nas.supernet.ops.linear import linear
from torch import Tensor, nn


@functools.cache
def _inv_freq(head_dim: int, theta: float, device: torch.device) -> Tensor:
    """Rotary inverse frequencies (head_dim/2,), computed once per (head_dim, theta, device):
    a draft step would otherwise rebuild them from five ops on every call. A plain tensor even
    when first asked for in inference mode, so training can use it too."""
    with torch.inference_mode(False), torch.no_grad():
        return 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device,
                                             dtype=torch.float32) / head_dim))


def rotary_cos_sin(position_ids: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and signed sin tables for rotary position embedding (`apply_rotary`).

    position_ids: (batch, seq) -> cos, sin: (batch, 1, seq, head_dim). ``cos`` is Llama's
    table; ``sin`` carries rotate_half's sign (its first half negated), so that
    ``apply_rotary`` rotates with one roll instead of rotate_half's two slices, negation and
    concatenation (the same numbers: a product's sign does not change its magnitude).
    """
    if torch.compiler.is_compiling():  # in a compiled step's graph: folded into a constant
        inv_freq = 1.0 / (float(theta) ** (torch.arange(0, head_dim, 2, device=position_ids.device,
                                                        dtype=torch.float32) / head_dim))
    else:
        inv_freq = _inv_freq(head_dim, float(theta), position_ids.device)
    freqs = position_ids.to(torch.float32)[..., None] * inv_freq  # (batch, seq, head_dim/2)
    cos, sin = freqs.cos(), freqs.sin()
    return torch.cat((cos, cos), dim=-1)[:, None], torch.cat((-sin, sin), dim=-1)[:, None]


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: (batch, heads, seq, head_dim); cos/sin: (batch, 1, seq, head_dim) from
    `rotary_cos_sin`. Equals Llama's ``x * cos + rotate_half(x) * sin`` bit for bit."""
    if cos.dtype != x.dtype:
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


def split_heads(x: Tensor, heads: int, head_dim: int) -> Tensor:
    """(batch, seq, heads * head_dim) -> (batch, heads, seq, head_dim)."""
    b, t, _ = x.shape
    return x.view(b, t, heads, head_dim).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(batch, heads, seq, head_dim) -> (batch, seq, heads * head_dim)."""
    b, heads, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, heads * d)


class ElasticAttention(nn.Module):
    """Multi-head attention whose head count is chosen per call (a prefix of the heads).

    Queries come from `x`, keys/values from `x` (self-attention) or from a memory (cross-
    attention); the caller handles rotary embedding and caching through `project_q`,
    `project_kv` and `attend`.
    """

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.head_dim = head_dim
        inner = num_heads * head_dim
        self.q_proj = nn.Linear(hidden_size, inner, bias=False)
        self.k_proj = nn.Linear(hidden_size, inner, bias=False)
        self.v_proj = nn.Linear(hidden_size, inner, bias=False)
        self.o_proj = nn.Linear(inner, hidden_size, bias=False)

    def checked_inner(self, heads: int) -> int:
        """heads * head_dim, after checking `heads` is one of this attention's."""
        if not 1 <= heads <= self.num_heads:
            raise ValueError(
                f"heads={heads} is outside this attention's 1..{self.num_heads} heads; "
                "pick a subnet from the supernet's search space"
            )
        return heads * self.head_dim

    def project_q(self, x: Tensor, heads: int) -> Tensor:
        """x: (batch, seq, hidden) -> (batch, heads, seq, head_dim), first `heads` heads only."""
        inner = self.checked_inner(heads)
        return split_heads(linear(x, self.q_proj.weight[:inner]), heads, self.head_dim)

    def project_kv(self, x: Tensor, heads: int) -> tuple[Tensor, Tensor]:
        """x: (batch, seq, hidden) -> keys, values: (batch, heads, seq, head_dim)."""
        inner = self.checked_inner(heads)
        k = linear(x, self.k_proj.weight[:inner])
        v = linear(x, self.v_proj.weight[:inner])
        return split_heads(k, heads, self.head_dim), split_heads(v, heads, self.head_dim)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """q: (batch, heads, seq, head_dim); k, v: (batch, heads, keys, head_dim);
        mask: bool (batch, 1, seq, keys), True = may attend. Returns (batch, seq, hidden)."""
        inner = self.checked_inner(q.shape[1])
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return linear(merge_heads(out), self.o_proj.weight[:, :inner])

    def output(self, heads_out: Tensor) -> Tensor:
        """(batch, heads, seq, head_dim) per-head outputs -> (batch, seq, hidden) via o_proj."""
        inner = self.checked_inner(heads_out.shape[1])
        return linear(merge_heads(heads_out), self.o_proj.weight[:, :inner])

    # --- importance sorting ---------------------------------------------------------
    def head_importance(self) -> Tensor:
        """|grad x weight| summed over each head's q/k/v rows and o columns -> (num_heads,).

        Needs `.grad` on the four projections (call after `loss.backward()`).
        """
        d = self.head_dim
        total = torch.zeros(self.num_heads, device=self.q_proj.weight.device)
        for lin in (self.q_proj, self.k_proj, self.v_proj):
            if lin.weight.grad is None:
                raise RuntimeError("head_importance needs gradients; run backward() first")
            score = (lin.weight.grad * lin.weight).abs().detach()  # (heads*d, hidden)
            total += score.view(self.num_heads, d, -1).sum(dim=(1, 2))
        o = self.o_proj.weight
        if o.grad is None:
            raise RuntimeError("head_importance needs gradients; run backward() first")
        score = (o.grad * o).abs().detach()  # (hidden, heads*d)
        total += score.view(-1, self.num_heads, d).sum(dim=(0, 2))
        return total

    def head_permutation_index(self, order: Tensor) -> Tensor:
        """Row index over (heads*head_dim) that puts head order[i] in slot i."""
        d = self.head_dim
        return (order[:, None] * d + torch.arange(d, device=order.device)).reshape(-1)

    def permuted_params(self) -> list[tuple[nn.Parameter, int]]:
        """(parameter, dim) pairs whose `dim` runs over heads*head_dim."""
        return [(self.q_proj.weight, 0), (self.k_proj.weight, 0), (self.v_proj.weight, 0),
                (self.o_proj.weight, 1)]

    @torch.no_grad()
    def permute_heads(self, order: Tensor) -> Tensor:
        """Reorder heads in place so head `order[i]` becomes head i; returns the row index.

        The attention's output is unchanged (heads are summed after o_proj), only which
        heads a smaller subnet keeps changes.
        """
        if sorted(order.tolist()) != list(range(self.num_heads)):
            raise ValueError(f"order={order.tolist()} is not a permutation of "
                             f"0..{self.num_heads - 1}")
        index = self.head_permutation_index(order)
        for param, dim in self.permuted_params():
            param.copy_(param.index_select(dim, index))
        return index


def importance_order(importance: Tensor) -> Tensor:
    """Head indices sorted by decreasing importance (ties: lower index first)."""
    return torch.sort(importance, descending=True, stable=True).indices
