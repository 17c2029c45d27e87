"""`supernet.draft.linear`: F.linear with a 16-bit CPU backward that takes the fast kernels;
its values and gradients are F.linear's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from dreams_nas.supernet.draft import linear as module
from dreams_nas.supernet.draft.linear import _Linear16, linear


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
