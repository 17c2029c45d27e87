"""What the latencies were measured on: a GPU through NVML, else the CPU, plus library versions.

The identity names the folder under ``latency/`` (``hardware_id``), so it must be stable for one
machine and differ between machines whose timings differ: the GPU's product name (which carries
its memory size, e.g. ``nvidia-h100-80gb-hbm3``), or the CPU model and the number of threads
the timings use (``cpu-amd-epyc-2t``: the same CPU timed with 8 threads is another machine).
Clocks, power limit, temperature and throttle reasons are recorded but not part of the id.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dreams_nas.supernet.core.device import resolve_device
from dreams_nas.supernet.core.versions import library_versions

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


@dataclass(frozen=True)
class HardwareInfo:
    """Identity of the device that was timed (written as ``hardware.json``)."""

    hardware_id: str
    kind: str  # "cpu" | "cuda"
    name: str
    device: str  # "cpu" | "cuda:N"
    memory_gb: float | None
    driver: str | None
    cuda: str | None
    clocks: dict[str, Any] | None  # current/max SM and memory MHz, power limit, temperature
    threads: int | None  # torch intra-op threads used for CPU timing
    cores: int | None
    torch: str
    transformers: str
    dtype: str
    throttle_reasons: tuple[str, ...] = ()
    versions: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["throttle_reasons"] = list(self.throttle_reasons)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HardwareInfo:
        names = set(cls.__dataclass_fields__)
        kwargs = {k: v for k, v in data.items() if k in names}
        kwargs["throttle_reasons"] = tuple(kwargs.get("throttle_reasons") or ())
        return cls(**kwargs)


def slugify(text: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"nvidia-h100-80gb-hbm3"`` (a valid folder name)."""
    text = re.sub(r"\((r|tm|c)\)", " ", text.lower())
    text = re.sub(r"\b(cpu|processor)\b|@", " ", text)
    slug = re.sub(r"[^a-z0-9.]+", "-", text).strip("-.")
    return re.sub(r"-{2,}", "-", slug) or "unknown"


# --- NVML ---------------------------------------------------------------------------------
def _nvml_call(fn: Any, *args: Any) -> Any:
    """One NVML query; None where the chip or driver does not support it."""
    import pynvml

    try:
        value = fn(*args)
    except pynvml.NVMLError:
        return None
    return value.decode() if isinstance(value, bytes) else value


class NvmlDevice:
    """An open NVML handle on one GPU (``nvmlInit`` on enter, ``nvmlShutdown`` on exit)."""

    def __init__(self, cuda_index: int) -> None:
        self.cuda_index = cuda_index
        self.handle: Any = None

    def __enter__(self) -> NvmlDevice | None:
        """The device, or None where there is no NVML library (no NVIDIA driver)."""
        import pynvml

        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            return None
        except pynvml.NVMLError:
            return None
        self.handle = _handle_for_cuda_index(self.cuda_index)
        if self.handle is None:
            pynvml.nvmlShutdown()
            return None
        return self

    def __exit__(self, *exc: object) -> None:
        import pynvml

        if self.handle is not None:
            _nvml_call(pynvml.nvmlShutdown)
            self.handle = None

    def clocks(self) -> dict[str, Any]:
        import pynvml

        h = self.handle
        power = _nvml_call(pynvml.nvmlDeviceGetPowerManagementLimit, h)
        return {
            "sm_mhz": _nvml_call(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM),
            "sm_max_mhz": _nvml_call(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM),
            "mem_mhz": _nvml_call(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM),
            "mem_max_mhz": _nvml_call(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_MEM),
            "power_limit_w": None if power is None else power / 1000.0,
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
                  or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons)
        mask = _nvml_call(getter, self.handle) or 0
        return int(mask) & sum(THROTTLE_REASONS)

    def identity(self) -> dict[str, Any]:
        import pynvml

        h = self.handle
        memory = _nvml_call(pynvml.nvmlDeviceGetMemoryInfo, h)
        cuda_version = _nvml_call(pynvml.nvmlSystemGetCudaDriverVersion)
        return {
            "name": _nvml_call(pynvml.nvmlDeviceGetName, h) or f"cuda device {self.cuda_index}",
            "memory_gb": None if memory is None else round(memory.total / 2**30, 1),
            "driver": _nvml_call(pynvml.nvmlSystemGetDriverVersion),
            "cuda": (None if not cuda_version
                     else f"{cuda_version // 1000}.{cuda_version % 1000 // 10}"),
            "clocks": self.clocks(),
            "throttle_reasons": reasons_from_mask(self.throttle_mask()),
        }


def reasons_from_mask(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in THROTTLE_REASONS.items() if mask & bit)


def _handle_for_cuda_index(index: int) -> Any:
    """NVML numbers GPUs by PCI order, CUDA (and CUDA_VISIBLE_DEVICES) may not: match by bus id."""
    import pynvml
    import torch

    try:
        props = torch.cuda.get_device_properties(index)
        bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        handle = _nvml_call(pynvml.nvmlDeviceGetHandleByPciBusId_v2, bus_id)
        if handle is not None:
            return handle
    except (AttributeError, RuntimeError, AssertionError):
        pass
    return _nvml_call(pynvml.nvmlDeviceGetHandleByIndex, index)


# --- CPU ----------------------------------------------------------------------------------
def cpu_identity(cpuinfo: str | Path = "/proc/cpuinfo") -> dict[str, Any]:
    """CPU model name and physical core count from /proc/cpuinfo (portable fallbacks)."""
    import platform

    name, cores = None, set()
    physical = core = None
    path = Path(cpuinfo)
    text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name" and name is None:
            name = value
        elif key == "physical id":
            physical = value
        elif key == "core id":
            core = value
        elif not key and physical is not None and core is not None:
            cores.add((physical, core))
            physical = core = None
    if physical is not None and core is not None:
        cores.add((physical, core))
    return {
        "name": name or platform.processor() or platform.machine() or "unknown cpu",
        "cores": len(cores) or os.cpu_count(),
        "logical": os.cpu_count(),
    }


def cpu_throttle_probe() -> int | None:
    """Current frequency of CPU 0 in MHz where the kernel exposes it (None in most VMs)."""
    path = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq")
    try:
        return int(path.read_text().strip()) // 1000
    except (OSError, ValueError):
        return None


class CpuFreqProbe:
    """`timing.ClockProbe` for the CPU: its frequency (cpufreq), no throttle-reason bits; a
    frequency drop during a sample flags it as throttled."""

    def sm_clock_mhz(self) -> int | None:
        return cpu_throttle_probe()

    def throttle_mask(self) -> int:
        return 0


# --- the identity -------------------------------------------------------------------------
def detect_hardware(device: str = "auto", dtype: str = "float32",
                    threads: int | None = None) -> HardwareInfo:
    """Identity of `device` (resolved first). For the CPU, `threads` is the fixed thread count
    the timings use (default: the physical core count)."""
    resolved = resolve_device(device)
    versions = library_versions()
    common = {"torch": versions.get("torch", "unknown"),
              "transformers": versions.get("transformers", "unknown"),
              "dtype": dtype, "versions": versions}
    if resolved.startswith("cuda"):
        index = int(resolved.split(":")[1])
        with NvmlDevice(index) as nvml:
            if nvml is not None:
                ident = nvml.identity()
                return HardwareInfo(
                    hardware_id=slugify(ident["name"]), kind="cuda", device=resolved,
                    name=ident["name"], memory_gb=ident["memory_gb"], driver=ident["driver"],
                    cuda=ident["cuda"], clocks=ident["clocks"], threads=None, cores=None,
                    throttle_reasons=ident["throttle_reasons"], **common,
                )
        # CUDA works but NVML does not (some containers): identity from torch alone.
        import torch

        props = torch.cuda.get_device_properties(index)
        return HardwareInfo(
            hardware_id=slugify(props.name), kind="cuda", device=resolved, name=props.name,
            memory_gb=round(props.total_memory / 2**30, 1), driver=None, cuda=torch.version.cuda,
            clocks=None, threads=None, cores=None, **common,
        )
    ident = cpu_identity()
    threads = int(threads or ident["cores"] or 1)
    mhz = cpu_throttle_probe()
    return HardwareInfo(
        hardware_id=f"cpu-{slugify(ident['name'])}-{threads}t", kind="cpu", device="cpu",
        name=ident["name"], memory_gb=_host_memory_gb(), driver=None, cuda=None,
        clocks=None if mhz is None else {"cpu_mhz": mhz}, threads=threads, cores=ident["cores"],
        **common,
    )


def _host_memory_gb() -> float | None:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return round(pages * size / 2**30, 1)
