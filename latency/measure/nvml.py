"""The GPU behind a CUDA device, through NVML: its name, memory, clocks, power, temperature and
throttle reasons, found by UUID or PCI bus id (CUDA and NVML number GPUs differently under
``CUDA_VISIBLE_DEVICES``, SLURM and MIG), with MIG slices and power caps."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import Any

from dreams_nas.latency.measure.names import gpu_hardware_id, mig_profile_from_name

log = logging.getLogger(__name__)

# NVML clock-event reasons that mean "the chip is slower than it could be right now".
# Idle (0x1), an application-clock setting (0x2), sync boost (0x10) and display clocks (0x100)
# are not slowdowns caused by the load, so they do not flag a sample.
THROTTLE_REASONS: dict[int, str] = {
    0x0000000000000004: "sw_power_cap",
    0x0000000000000008: "hw_slowdown",
    0x0000000000000020: "sw_thermal_slowdown",
    0x0000000000000040: "hw_thermal_slowdown",
    0x0000000000000080: "hw_power_brake_slowdown",
}
_UUID = re.compile(r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}")


def reasons_from_mask(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in THROTTLE_REASONS.items() if mask & bit)


def _nvml_call(fn: Any, *args: Any) -> Any:
    """One NVML query (`fn` or its name in `pynvml`); None where the chip or driver does not
    support it, or where this nvidia-ml-py has no such function (their names change)."""
    import pynvml

    fn = getattr(pynvml, fn, None) if isinstance(fn, str) else fn
    if fn is None:
        return None
    try:
        value = fn(*args)
    except pynvml.NVMLError:
        return None
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class _NvmlMatch:
    """Where a CUDA device sits in NVML: the physical GPU (name, clocks, power, temperature),
    the MIG slice when the CUDA device is one, and how the match was made."""

    gpu: Any
    mig: Any = None
    via: str = "uuid"  # "uuid" | "pci_bus_id"


class NvmlDevice:
    """An open NVML handle on the GPU behind CUDA device `cuda_index` (``nvmlInit`` on enter,
    ``nvmlShutdown`` on exit). For a MIG slice, `handle` is its parent GPU (clocks, power and
    throttle reasons are the parent's) and `mig_handle` the slice. `mapping` says how the CUDA
    device was found in NVML: ``uuid``, ``pci_bus_id``, ``unknown`` (NVML works but nothing
    matched: no handle, rather than another GPU's) or ``no_nvml``."""

    def __init__(self, cuda_index: int) -> None:
        self.cuda_index = cuda_index
        self.handle: Any = None
        self.mig_handle: Any = None
        self.mapping = "no_nvml"

    def __enter__(self) -> NvmlDevice | None:
        """The device, or None where there is no NVML library (no NVIDIA driver) or the CUDA
        device cannot be found in NVML."""
        import pynvml

        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:  # NVMLError_LibraryNotFound where there is no driver
            return None
        match = _match_cuda_device(self.cuda_index)
        if match is None:
            self.mapping = "unknown"
            log.warning("cuda:%d matches no NVML device by UUID or PCI bus id (nor, on a MIG "
                        "GPU, which slice it is); its clocks, power limit and temperature are "
                        "not recorded and its identity comes from torch alone", self.cuda_index)
            _nvml_call(pynvml.nvmlShutdown)
            return None
        self.handle, self.mig_handle, self.mapping = match.gpu, match.mig, match.via
        return self

    def __exit__(self, *exc: object) -> None:
        import pynvml

        if self.handle is not None:
            _nvml_call(pynvml.nvmlShutdown)
            self.handle = self.mig_handle = None

    def clocks(self) -> dict[str, Any]:
        import pynvml

        h = self.handle
        return {
            "sm_mhz": _nvml_call(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM),
            "sm_max_mhz": _nvml_call(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM),
            "mem_mhz": _nvml_call(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM),
            "mem_max_mhz": _nvml_call(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_MEM),
            "power_limit_w": _watts("nvmlDeviceGetPowerManagementLimit", h),
            "power_default_w": _watts("nvmlDeviceGetPowerManagementDefaultLimit", h),
            "temperature_c": _nvml_call(
                pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU
            ),
        }

    def sm_clock_mhz(self) -> int | None:
        import pynvml

        return _nvml_call(pynvml.nvmlDeviceGetClockInfo, self.handle, pynvml.NVML_CLOCK_SM)

    def throttle_mask(self) -> int:
        """Bitmask of the current clock-event reasons that slow the chip (0 when none)."""
        import pynvml

        getter = (getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                  or getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
        mask = _nvml_call(getter, self.handle) or 0
        return int(mask) & sum(THROTTLE_REASONS)

    def identity(self) -> dict[str, Any]:
        import pynvml

        gpu_name = (_nvml_call(pynvml.nvmlDeviceGetName, self.handle)
                    or f"cuda device {self.cuda_index}")
        mig_profile = None if self.mig_handle is None else _mig_profile(self.mig_handle)
        # a MIG slice has its own memory; the rest of the chip is not the device timed
        memory = _nvml_call(pynvml.nvmlDeviceGetMemoryInfo, self.mig_handle or self.handle)
        cuda_version = _nvml_call(pynvml.nvmlSystemGetCudaDriverVersion)
        clocks = self.clocks()
        limit, default = clocks["power_limit_w"], clocks["power_default_w"]
        power_cap = (round(limit) if limit is not None and default is not None
                     and round(limit) < round(default) else None)
        return {
            "hardware_id": gpu_hardware_id(gpu_name, mig_profile, power_cap),
            "name": gpu_name if mig_profile is None else f"{gpu_name} MIG {mig_profile}",
            "memory_gb": None if memory is None else round(memory.total / 2**30, 1),
            "driver": _nvml_call(pynvml.nvmlSystemGetDriverVersion),
            "cuda": (None if not cuda_version
                     else f"{cuda_version // 1000}.{cuda_version % 1000 // 10}"),
            "clocks": clocks,
            "throttle_reasons": reasons_from_mask(self.throttle_mask()),
            "mig_profile": mig_profile,
            "power_cap_w": power_cap,
        }


def _match_cuda_device(index: int) -> _NvmlMatch | None:
    """NVML numbers GPUs in PCI order; CUDA may not (CUDA_VISIBLE_DEVICES, SLURM, MIG).
    Match by UUID, else by PCI bus id; None where neither identifies the device."""
    import torch

    try:
        props = torch.cuda.get_device_properties(index)
    except (RuntimeError, AssertionError):
        return None
    uuid = _uuid_hex(getattr(props, "uuid", None))
    for prefix in ("GPU-", "MIG-") if uuid else ():
        handle = _nvml_call("nvmlDeviceGetHandleByUUID", prefix + uuid)
        if handle is not None:
            if not _is_mig_handle(handle):
                return _NvmlMatch(gpu=handle, via="uuid")
            parent = _nvml_call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
            return None if parent is None else _NvmlMatch(gpu=parent, mig=handle, via="uuid")
    bus_id = _pci_bus_id(props)
    gpu = None if bus_id is None else _nvml_call("nvmlDeviceGetHandleByPciBusId", bus_id)
    if gpu is None:
        return None
    if not _mig_enabled(gpu):
        return _NvmlMatch(gpu=gpu, via="pci_bus_id")
    # MIG on: CUDA sees slices, not the GPU; which one is only known by its UUID
    mig = _mig_slice(gpu, uuid)
    return None if mig is None else _NvmlMatch(gpu=gpu, mig=mig, via="pci_bus_id")


def _uuid_hex(value: Any) -> str | None:
    """The bare UUID (``8-4-4-4-12`` hex, lower case) of torch's or NVML's UUID, which NVML
    prefixes with ``GPU-`` or ``MIG-`` and torch does not; None where unknown."""
    if value is None:
        return None
    text = (value.decode() if isinstance(value, bytes) else str(value)).strip().lower()
    text = re.sub(r"^(gpu|mig)-", "", text)
    if not _UUID.fullmatch(text) or not text.strip("0-"):
        return None
    return text


def _pci_bus_id(props: Any) -> str | None:
    """``domain:bus:device.function`` as NVML prints it (``00000000:3B:00.0``)."""
    parts = [getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id",
                                                      "pci_device_id")]
    if not all(isinstance(part, int) and part >= 0 for part in parts):
        return None
    domain, bus, device = parts
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"


def _is_mig_handle(handle: Any) -> bool:
    flag = _nvml_call("nvmlDeviceIsMigDeviceHandle", handle)
    return bool(getattr(flag, "value", flag))  # nvidia-ml-py returns a c_uint


def _mig_enabled(gpu: Any) -> bool:
    import pynvml

    mode = _nvml_call("nvmlDeviceGetMigMode", gpu)  # [current, pending]
    return bool(mode) and mode[0] == getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1)


def _mig_slice(gpu: Any, uuid: str | None) -> Any:
    """The MIG device of `gpu` whose UUID is `uuid`; None where there is none or no UUID."""
    count = _nvml_call("nvmlDeviceGetMaxMigDeviceCount", gpu) if uuid else None
    for slot in range(count or 0):
        mig = _nvml_call("nvmlDeviceGetMigDeviceHandleByIndex", gpu, slot)
        if mig is not None and _uuid_hex(_nvml_call("nvmlDeviceGetUUID", mig)) == uuid:
            return mig
    return None


def _mig_profile(mig: Any) -> str:
    """The MIG profile of a slice: from its NVML name (``... MIG 1g.10gb``), else from its
    slice counts and memory (``1g.10gb``: NVIDIA rounds the memory up to whole GB)."""
    import pynvml

    profile = mig_profile_from_name(_nvml_call(pynvml.nvmlDeviceGetName, mig) or "")
    if profile is not None:
        return profile
    attrs = _nvml_call("nvmlDeviceGetAttributes", mig)
    if attrs is None:
        return "unknown"
    gi, ci = attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount
    gb = math.ceil(attrs.memorySizeMB / 1024)
    return f"{gi}g.{gb}gb" if ci in (0, gi) else f"{ci}c.{gi}g.{gb}gb"


def _watts(fn: Any, handle: Any) -> float | None:
    milliwatts = _nvml_call(fn, handle)
    return None if milliwatts is None else milliwatts / 1000.0
