"""`linear`: F.linear without the slow 16-bit CPU kernels, and `use_fast_linears` for a model.

On CPUs without native bfloat16 (no AVX512-BF16, e.g. AVX2-only AMD EPYC and Intel Xeon VMs)
torch's 16-bit matrix product runs row by row: its cost grows with the rows like a stack of
matrix-vector products, far below float32's throughput. From a few dozen rows on, the same
product computed in float32 from the 16-bit operands and rounded back costs less, weight
conversion included, while for a row or two the 16-bit kernel stays cheaper. And it is slower
still when its second operand is a contiguous matrix, which is what autograd's backward of
F.linear computes for the input's gradient (grad @ W), than written F.linear(grad, W^T
contiguous). (BENCHMARKS.md, 'Proxy-shaped draft training step in bfloat16'.)

So, on such a CPU, for a 16-bit compute dtype (the tensors' or autocast's):
- products over at least `WIDE_ROWS` rows (prefills, training batches, their gradients) are
  computed in float32 from the 16-bit operands and rounded to the 16-bit dtype: what a native
  16-bit matrix unit computes (16-bit inputs, float32 accumulation, 16-bit result), up to the
  order of the float32 sums;
- narrower products (decode, verify and draft steps of a few positions) keep torch's 16-bit
  kernel, which is the faster one there; their input gradient is F.linear(grad, W^T contiguous).
Every other case (float32, a GPU, a CPU with native bfloat16) is F.linear itself, so nothing
changes where the hardware computes 16-bit products natively.

`use_fast_linears(model)` routes a model's `nn.Linear` modules through `linear` (their hooks
still run: the module is called as before); a loaded target gets it at load time.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_HALF = (torch.bfloat16, torch.float16)

# At and above this many rows a 16-bit product is computed in float32 (module docstring: the
# float32 route costs one conversion of the weight, which the row-by-row 16-bit kernel spends
# within a few dozen rows).
WIDE_ROWS = 32


def _has_native_bf16() -> bool:
    check = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return bool(check()) if check is not None else False


# asked once, at import: a compiled step reads the answer as a constant (dynamo cannot trace
# torch's C query inside a graph; a 16-bit compiled step on the CPU failed on it)
_NATIVE_BF16 = _has_native_bf16()


def _native_bf16() -> bool:
    return _NATIVE_BF16


def _compute_dtype(x: Tensor, w: Tensor) -> torch.dtype:
    if torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu")
    return torch.promote_types(x.dtype, w.dtype)


def emulated_dtype(x: Tensor, w: Tensor) -> torch.dtype | None:
    """The 16-bit dtype F.linear(x, w) would compute in without native instructions (a CPU
    without AVX512-BF16), or None where F.linear is the fast route."""
    if x.device.type != "cpu" or _native_bf16():
        return None
    dtype = _compute_dtype(x, w)
    return dtype if dtype in _HALF else None


def slow_backward(x: Tensor, w: Tensor) -> bool:
    """Whether autograd's backward of F.linear(x, w) would take a slow 16-bit CPU kernel."""
    return (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)
            and emulated_dtype(x, w) is not None)


def _rows(x: Tensor) -> int:
    return x.numel() // max(1, x.shape[-1])


def _product(x: Tensor, w: Tensor, b: Tensor | None, dtype: torch.dtype) -> Tensor:
    """x @ w^T (+ b) in `dtype`, through float32 when x has `WIDE_ROWS` rows or more."""
    x, w, b = x.to(dtype), w.to(dtype), None if b is None else b.to(dtype)  # autocast's casts
    with torch.autocast("cpu", enabled=False):
        if _rows(x) >= WIDE_ROWS:
            return F.linear(x.float(), w.float(), None if b is None else b.float()).to(dtype)
        return F.linear(x, w, b)


def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """F.linear(x, w, b), without the slow 16-bit kernels of CPUs lacking native bfloat16."""
    if x.dtype not in _HALF and w.dtype not in _HALF and not torch.is_autocast_enabled("cpu"):
        return F.linear(x, w, b)  # no 16-bit product: the common case, decided in ~1 us
    dtype = emulated_dtype(x, w)
    if dtype is None:
        return F.linear(x, w, b)
    if slow_backward(x, w) or (b is not None and b.requires_grad and torch.is_grad_enabled()):
        return _Linear16.apply(x, w, b, dtype)
    if _rows(x) < WIDE_ROWS:
        return F.linear(x, w, b)
    return _product(x, w, b, dtype)


class _Linear16(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, b: Tensor | None, dtype: torch.dtype) -> Tensor:
        xc, wc = x.to(dtype), w.to(dtype)
        ctx.save_for_backward(xc, wc)
        ctx.dtypes = (x.dtype, w.dtype, None if b is None else b.dtype)
        return _product(xc, wc, b, dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        xc, wc = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        wide = _rows(grad) >= WIDE_ROWS
        grad = grad.float() if wide else grad.to(wc.dtype)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = (grad @ wc.float() if wide else F.linear(grad, wc.t().contiguous())).to(x_dtype)
        flat = grad.reshape(-1, grad.shape[-1])
        if ctx.needs_input_grad[1]:
            xs = xc.reshape(-1, xc.shape[-1])
            gw = (flat.t() @ (xs.float() if wide else xs)).to(w_dtype)
        if ctx.needs_input_grad[2]:
            gb = flat.sum(0).to(b_dtype)
        return gx, gw, gb, None


def _fast_forward(module: nn.Linear, x: Tensor) -> Tensor:
    return linear(x, module.weight, module.bias)


def use_fast_linears(model: nn.Module) -> int:
    """Route the plain `nn.Linear` modules of a model whose weights are 16-bit through `linear`
    on a CPU without native bfloat16; returns how many were routed (0 elsewhere). The module is
    still called (hooks run); moved to a GPU it is F.linear again (`linear` decides per call)."""
    if _native_bf16():
        return 0
    count = 0
    for module in model.modules():
        if (type(module) is nn.Linear and module.weight.dtype in _HALF
                and "forward" not in vars(module)):
            module.forward = functools.partial(_fast_forward, module)
            count += 1
    return count


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b, through float32 where a 16-bit product of `WIDE_ROWS` rows or more would take the
    slow kernel (as `linear`); autograd differentiates through the casts."""
    dtype = emulated_dtype(a, b)
    if dtype is None or a.shape[-2] < WIDE_ROWS:
        return a @ b
    with torch.autocast("cpu", enabled=False):
        return (a.to(dtype).float() @ b.to(dtype).float()).to(dtype)
