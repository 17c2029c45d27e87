"""A fake NVIDIA node for the GPU-identity tests: an NVML (`pynvml`) and a torch CUDA view of
the same GPUs, installed with `monkeypatch`, so the CUDA -> NVML mapping is tested without a GPU.

`FakeGpu` / `FakeMig` are the devices (and their own NVML handles). `FakeNvml.module()` is a
`pynvml` stand-in; `install_nvml` puts it in `sys.modules`. `install_cuda` makes torch see the
devices given, in that order: ``install_cuda(mp, [h100, a100])`` is ``CUDA_VISIBLE_DEVICES=1,0``
on a node whose NVML index 0 is the A100. The fake raises the real `pynvml.NVMLError` classes,
and records which devices were read from (`FakeNvml.reads`).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml
import torch


@dataclass(eq=False)
class FakeMig:
    """One MIG slice (a CUDA device of its own when MIG is on)."""

    name: str  # as NVML and CUDA name it: "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    uuid: str  # "MIG-…"
    memory_mb: int
    gpu_slices: int = 1
    compute_slices: int = 1
    parent: FakeGpu | None = None


@dataclass(eq=False)
class FakeGpu:
    """One physical GPU, in NVML order; `migs` non-empty means MIG mode is on."""

    name: str
    uuid: str  # "GPU-…"
    bus_id: str  # "00000000:3B:00.0", as NVML prints it
    memory_gb: float
    sm_mhz: int
    sm_max_mhz: int
    mem_mhz: int = 1593
    mem_max_mhz: int = 1593
    power_limit_mw: int = 400_000
    power_default_mw: int = 400_000
    temperature_c: int = 40
    throttle_mask: int = 0
    migs: list[FakeMig] = field(default_factory=list)

    def __post_init__(self) -> None:
        for mig in self.migs:
            mig.parent = self


def _not_found() -> pynvml.NVMLError:
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)


class FakeNvml:
    """The NVML of a node with `gpus` (driver 570.86.15, CUDA 12.8)."""

    def __init__(self, gpus: Sequence[FakeGpu]) -> None:
        self.gpus = list(gpus)
        self.reads: list[Any] = []  # the devices whose clocks, power or temperature were read
        self.open = 0  # nvmlInit calls not yet shut down

    def module(self, missing: Iterable[str] = (), unsupported: Iterable[str] = ()) -> Any:
        """A `pynvml` stand-in. `missing`: functions this binding lacks (AttributeError);
        `unsupported`: functions the driver lacks (NVMLError_FunctionNotFound)."""
        mod = types.ModuleType("pynvml")
        for name in ("NVMLError", "NVMLError_LibraryNotFound", "NVML_CLOCK_SM", "NVML_CLOCK_MEM",
                     "NVML_TEMPERATURE_GPU", "NVML_DEVICE_MIG_ENABLE"):
            setattr(mod, name, getattr(pynvml, name))
        gone, absent = set(missing), set(unsupported)
        for name in dir(self):
            if name.startswith("nvml") and name not in gone:
                fn = getattr(self, name)
                setattr(mod, name, _function_not_found if name in absent else fn)
        return mod

    # --- system ---------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.open += 1

    def nvmlShutdown(self) -> None:
        self.open -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.86.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12080

    # --- handles --------------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu | FakeMig:
        for device in self._all():
            if device.uuid == uuid:
                return device
        raise _not_found()

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> FakeGpu:
        for gpu in self.gpus:
            if gpu.bus_id.lower() == bus_id.lower():
                return gpu
        raise _not_found()

    def nvmlDeviceGetUUID(self, handle: FakeGpu | FakeMig) -> str:
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeGpu | FakeMig) -> str:
        return handle.name

    # --- MIG ------------------------------------------------------------------------------
    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> Any:
        import ctypes

        return ctypes.c_uint(int(isinstance(handle, FakeMig)))  # as nvidia-ml-py does

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any) -> FakeGpu:
        if not isinstance(handle, FakeMig):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle.parent

    def nvmlDeviceGetMigMode(self, gpu: FakeGpu) -> list[int]:
        on = int(bool(gpu.migs))
        return [on, on]

    def nvmlDeviceGetMaxMigDeviceCount(self, gpu: FakeGpu) -> int:
        return 7 if gpu.migs else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, gpu: FakeGpu, index: int) -> FakeMig:
        if index >= len(gpu.migs):
            raise _not_found()
        return gpu.migs[index]

    def nvmlDeviceGetAttributes(self, mig: FakeMig) -> Any:
        return types.SimpleNamespace(gpuInstanceSliceCount=mig.gpu_slices,
                                     computeInstanceSliceCount=mig.compute_slices,
                                     memorySizeMB=mig.memory_mb)

    # --- readings -------------------------------------------------------------------------
    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu | FakeMig) -> Any:
        total = (handle.memory_mb * 2**20 if isinstance(handle, FakeMig)
                 else int(handle.memory_gb * 2**30))
        return types.SimpleNamespace(total=total, free=total, used=0)

    def nvmlDeviceGetClockInfo(self, gpu: Any, clock: int) -> int:
        gpu = self._physical(gpu)
        return gpu.sm_mhz if clock == pynvml.NVML_CLOCK_SM else gpu.mem_mhz

    def nvmlDeviceGetMaxClockInfo(self, gpu: Any, clock: int) -> int:
        gpu = self._physical(gpu)
        return gpu.sm_max_mhz if clock == pynvml.NVML_CLOCK_SM else gpu.mem_max_mhz

    def nvmlDeviceGetPowerManagementLimit(self, gpu: Any) -> int:
        return self._physical(gpu).power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, gpu: Any) -> int:
        return self._physical(gpu).power_default_mw

    def nvmlDeviceGetTemperature(self, gpu: Any, sensor: int) -> int:
        return self._physical(gpu).temperature_c

    def nvmlDeviceGetCurrentClocksEventReasons(self, gpu: Any) -> int:
        return self._physical(gpu).throttle_mask

    def _physical(self, handle: Any) -> FakeGpu:
        """A reading of the chip: recorded; MIG handles do not support it (as in NVML)."""
        if isinstance(handle, FakeMig):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.reads.append(handle)
        return handle

    def _all(self) -> list[FakeGpu | FakeMig]:
        return [d for gpu in self.gpus for d in (gpu, *gpu.migs)]


def _function_not_found(*args: Any) -> Any:
    raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


def install_nvml(monkeypatch: Any, gpus: Sequence[FakeGpu], missing: Iterable[str] = (),
                 unsupported: Iterable[str] = ()) -> FakeNvml:
    """Make ``import pynvml`` return a fake NVML of `gpus` (see `FakeNvml.module`)."""
    fake = FakeNvml(gpus)
    monkeypatch.setitem(sys.modules, "pynvml", fake.module(missing, unsupported))
    return fake


def cuda_properties(device: FakeGpu | FakeMig, uuid: bool = True, pci: bool = True) -> Any:
    """What `torch.cuda.get_device_properties` says of `device`: torch's UUID has no
    ``GPU-``/``MIG-`` prefix; a MIG slice has its parent's PCI bus id."""
    gpu = device.parent if isinstance(device, FakeMig) else device
    memory = (device.memory_mb * 2**20 if isinstance(device, FakeMig)
              else int(device.memory_gb * 2**30))
    props = types.SimpleNamespace(name=device.name, total_memory=memory, major=9, minor=0)
    if uuid:
        props.uuid = device.uuid.split("-", 1)[1]
    if pci:
        domain, bus, rest = gpu.bus_id.split(":")
        props.pci_domain_id, props.pci_bus_id = int(domain, 16), int(bus, 16)
        props.pci_device_id = int(rest.split(".")[0], 16)
    return props


def install_cuda(monkeypatch: Any, visible: Sequence[FakeGpu | FakeMig],
                 properties: Callable[[FakeGpu | FakeMig], Any] = cuda_properties) -> None:
    """Make torch see `visible` as cuda:0, cuda:1, … (the order CUDA_VISIBLE_DEVICES gives)."""

    def get_device_properties(index: int) -> Any:
        if not 0 <= index < len(visible):
            raise AssertionError("Invalid device id")  # as torch does
        return properties(visible[index])

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(visible))
    monkeypatch.setattr(torch.cuda, "get_device_properties", get_device_properties)
