"""`supernet.ops.linear`: F.linear and matmul without the slow 16-bit CPU kernels; their values
and gradients are F.linear's (narrow products) or the float32 product of the 16-bit operands
rounded to 16 bits (wide ones)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from dreams_nas.supernet.ops import linear as module
from dreams_nas.supernet.ops.linear import (
    WIDE_ROWS,
    _Linear16,
    linear,
    matmul,
    use_fast_linears,
)
from torch import nn


def _grads(fn, x, w, b):
    x, w = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    b = None if b is None else b.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fn(x, w, b)
    (out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach().float(), x.grad, w.grad, None if b is None else b.grad


@pytest.mark.parametrize("bias", [False, True])
def test_the_16_bit_backward_equals_f_linear(bias):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 24, generator=gen)
    w = torch.randn(16, 24, generator=gen)
    b = torch.randn(16, generator=gen) if bias else None
    ours = _grads(lambda x, w, b: _Linear16.apply(x, w, b, torch.bfloat16), x, w, b)
    theirs = _grads(F.linear, x, w, b)
    assert torch.equal(ours[0], theirs[0])  # the forward is F.linear's product itself
    for got, want in zip(ours[1:], theirs[1:], strict=True):
        if want is None:
            assert got is None
            continue
        assert got.dtype == want.dtype == torch.float32  # master weights keep their dtype
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_it_is_f_linear_where_the_slow_kernel_is_not_in_play(monkeypatch):
    calls = []
    monkeypatch.setattr(_Linear16, "apply", lambda *a: calls.append(a) or F.linear(*a[:3]))
    monkeypatch.setattr(module, "_native_bf16", lambda: False)
    x, w = torch.randn(2, 8, requires_grad=True), torch.randn(4, 8)
    linear(x, w)  # float32
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        linear(x, w)  # no gradient
    assert calls == []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        linear(x, w)
    linear(x.bfloat16(), w.bfloat16())
    assert len(calls) == 2
    monkeypatch.setattr(module, "_native_bf16", lambda: True)  # native bfloat16: F.linear
    with torch.autocast("cpu", dtype=torch.bfloat16):
        linear(x, w)
    assert len(calls) == 2


def _emulated(monkeypatch) -> None:
    monkeypatch.setattr(module, "_native_bf16", lambda: False)


@pytest.mark.parametrize("rows", [WIDE_ROWS, 3 * WIDE_ROWS + 5])
def test_a_wide_product_is_the_float32_product_of_the_16_bit_operands(monkeypatch, rows):
    _emulated(monkeypatch)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 48, generator=gen).bfloat16()
    w, b = torch.randn(20, 48, generator=gen).bfloat16(), torch.randn(20, generator=gen).bfloat16()
    want = F.linear(x.float(), w.float(), b.float()).bfloat16()
    got = linear(x, w, b)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=2e-2, atol=2e-2)  # torch's own kernel
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = linear(x.float(), w.float(), b.float())
    assert auto.dtype == torch.bfloat16 and torch.equal(auto, want)


def test_the_wide_backward_equals_float32_autograd(monkeypatch):
    _emulated(monkeypatch)
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(2, 40, 24, generator=gen), torch.randn(16, 24, generator=gen)
    b = torch.randn(16, generator=gen)
    ours = _grads(linear, x, w, b)

    def rounded(x, w, b):
        return F.linear(x.bfloat16().float(), w.bfloat16().float(),
                        b.bfloat16().float()).bfloat16()

    theirs = _grads(rounded, x, w, b)
    assert torch.equal(ours[0], theirs[0])
    for got, want in zip(ours[1:], theirs[1:], strict=True):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def test_matmul_is_wide_in_float32_and_differentiable(monkeypatch):
    _emulated(monkeypatch)
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(2, 3, WIDE_ROWS, 16, generator=gen).bfloat16().requires_grad_(True)
    v = torch.randn(2, 3, 16, 8, generator=gen).bfloat16().requires_grad_(True)
    out = matmul(a, v)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, (a.detach().float() @ v.detach().float()).bfloat16())
    out.float().sum().backward()
    assert a.grad.dtype == v.grad.dtype == torch.bfloat16
    torch.testing.assert_close(a.grad.float(), (torch.ones(2, 3, WIDE_ROWS, 8)
                                                @ v.detach().float().transpose(-1, -2)),
                               rtol=1e-2, atol=1e-2)
    narrow = torch.randn(4, 16).bfloat16()
    assert torch.equal(matmul(narrow, v.detach()[0, 0]), narrow @ v.detach()[0, 0])


def test_use_fast_linears_routes_a_16_bit_models_linears_and_keeps_their_hooks(monkeypatch):
    _emulated(monkeypatch)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 8)).bfloat16()
    x = torch.randn(WIDE_ROWS + 1, 24).bfloat16()
    with torch.no_grad():
        before = model(x)
    seen = []
    model[2].register_forward_hook(lambda m, a, out: seen.append(out.shape))
    assert use_fast_linears(model) == 2
    assert use_fast_linears(model) == 0  # once
    with torch.no_grad():
        after = model(x)
    assert seen == [after.shape]
    torch.testing.assert_close(after, before, rtol=2e-2, atol=2e-2)
    h = F.linear(x.float(), model[0].weight.float(), model[0].bias.float()).bfloat16().relu()
    want = F.linear(h.float(), model[2].weight.float(), model[2].bias.float()).bfloat16()
    assert torch.equal(after, want)  # the wide route, not torch's 16-bit kernel
    assert use_fast_linears(nn.Sequential(nn.Linear(4, 4))) == 0  # float32: left alone
    monkeypatch.setattr(module, "_native_bf16", lambda: True)
    assert use_fast_linears(nn.Sequential(nn.Linear(4, 4)).bfloat16()) == 0  # native: left alone


def test_a_16_bit_product_compiles_in_one_graph():
    """A compiled step (fullgraph) of 16-bit products on the CPU: the native-bfloat16 query is
    answered at import, not traced (dynamo cannot trace torch's C query)."""
    x, w = torch.randn(3, 8).bfloat16(), torch.randn(4, 8).bfloat16()
    step = torch.compile(lambda a, b: linear(a, b), backend="eager", fullgraph=True)
    assert torch.equal(step(x, w), linear(x, w))
