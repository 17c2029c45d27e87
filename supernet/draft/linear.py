"""`linear`: F.linear with a backward that avoids a slow CPU kernel in 16-bit.

On CPUs without native bfloat16 (no AVX512-BF16, e.g. AVX2-only AMD EPYC and Intel Xeon
VMs), torch's 16-bit matrix product is fast when its second operand is a transposed view --
what F.linear's forward computes, x @ W^T -- and ~30x slower when it is a contiguous matrix,
which is what autograd's backward of F.linear computes for the input's gradient (grad @ W):
measured at the proxy target's MLP shape, [2472, 2816] x [2816, 1024] in bfloat16, 19.3 s
against 0.67 s for the same product written F.linear(grad, W^T contiguous); float32 takes
0.09 s. A training step of the proxy-shaped draft spent 97 % of its time there.

`linear` is F.linear; where that slow path would be taken (a CPU, a 16-bit compute dtype
under autocast or in the tensors, a gradient to compute, no native bfloat16) its backward
computes the input's gradient as F.linear(grad, W^T contiguous) and the weight's as
grad^T @ x: the same products, each a fast kernel. Results equal F.linear's up to the order of
float rounding; every other case is F.linear itself.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

_HALF = (torch.bfloat16, torch.float16)


@functools.cache
def _native_bf16() -> bool:
    check = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return bool(check()) if check is not None else False


def _compute_dtype(x: Tensor, w: Tensor) -> torch.dtype:
    if torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu")
    return torch.promote_types(x.dtype, w.dtype)


def slow_backward(x: Tensor, w: Tensor) -> bool:
    """Whether autograd's backward of F.linear(x, w) would take the slow 16-bit CPU kernel."""
    if (x.device.type != "cpu" or not torch.is_grad_enabled()
            or not (x.requires_grad or w.requires_grad) or _native_bf16()):
        return False
    return _compute_dtype(x, w) in _HALF


def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """F.linear(x, w, b), with the fast 16-bit backward on CPUs without native bfloat16."""
    if not slow_backward(x, w):
        return F.linear(x, w, b)
    return _Linear16.apply(x, w, b, _compute_dtype(x, w))


class _Linear16(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, b: Tensor | None, dtype: torch.dtype) -> Tensor:
        xc, wc = x.to(dtype), w.to(dtype)
        bc = None if b is None else b.to(dtype)
        ctx.save_for_backward(xc, wc)
        ctx.dtypes = (x.dtype, w.dtype, None if b is None else b.dtype)
        with torch.autocast("cpu", enabled=False):
            return F.linear(xc, wc, bc)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        xc, wc = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        grad = grad.to(wc.dtype)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = F.linear(grad, wc.t().contiguous()).to(x_dtype)
        flat = grad.reshape(-1, grad.shape[-1])
        if ctx.needs_input_grad[1]:
            gw = (flat.t() @ xc.reshape(-1, xc.shape[-1])).to(w_dtype)
        if ctx.needs_input_grad[2]:
            gb = flat.sum(0).to(b_dtype)
        return gx, gw, gb, None
