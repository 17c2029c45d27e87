"""`--device` and `--dtype` resolution against the devices this machine has."""

from __future__ import annotations

import pytest
from dreams_nas.supernet.core import device
from dreams_nas.supernet.core.device import (
    resolve_compile,
    resolve_device,
    resolve_dtype,
    torch_dtype,
)
from dreams_nas.supernet.core.errors import InputError


def test_unknown_device_names_the_devices_that_exist(monkeypatch) -> None:
    monkeypatch.setattr(device, "available_devices", lambda: ["cpu"])
    with pytest.raises(InputError, match=r"--device cuda:3 does not exist on this machine; "
                                         r"the devices here are: cpu"):
        resolve_device("cuda:3")
    with pytest.raises(InputError, match=r"'tpu' is not a device; use auto, cpu or cuda:N"):
        resolve_device("tpu")
    assert resolve_device("auto") == "cpu"
    monkeypatch.setattr(device, "available_devices", lambda: ["cpu", "cuda:0", "cuda:1"])
    assert resolve_device("cuda") == "cuda:0"
    assert resolve_device("cuda:1") == "cuda:1"
    assert resolve_device("auto") == "cuda:0"


@pytest.mark.parametrize(("capability", "expected"), [
    ((9, 0), "bfloat16"),  # H100
    ((8, 0), "bfloat16"),  # A100
    ((8, 9), "bfloat16"),  # L4, RTX 40xx
    ((7, 5), "float16"),  # RTX8000, T4 (Turing): no native bf16
    ((7, 0), "float16"),  # V100
])
def test_auto_dtype_is_bf16_only_where_it_runs_natively(monkeypatch, capability,
                                                         expected) -> None:
    import torch

    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda index=0: asked.append(index) or capability)
    assert resolve_dtype("auto", "cuda:1") == expected
    assert asked == [1]
    assert resolve_dtype(None, "cuda:0") == expected


def test_explicit_and_cpu_dtypes() -> None:
    assert resolve_dtype("auto", "cpu") == "float32"
    assert resolve_dtype("bfloat16", "cpu") == "bfloat16"
    assert resolve_dtype("torch.float16", "cuda:0") == "float16"
    assert str(torch_dtype("bfloat16")) == "torch.bfloat16"
    with pytest.raises(InputError, match=r"--dtype 'half' is not supported; use auto or one of"):
        resolve_dtype("half", "cpu")


def test_compile_auto_is_on_for_cuda_and_off_for_the_cpu() -> None:
    assert resolve_compile("auto", "cuda:0") == resolve_compile("on", "cpu") == "compiled"
    assert resolve_compile(None, "cpu") == resolve_compile("off", "cuda:1") == "dynamic"
    with pytest.raises(InputError, match="--compile 'yes' is not one of auto, on, off"):
        resolve_compile("yes", "cpu")
