"""`--device` resolution against the devices this machine has."""

from __future__ import annotations

import pytest
from dreams_nas.supernet.core import device
from dreams_nas.supernet.core.device import resolve_device
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
