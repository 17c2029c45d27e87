"""What the latencies were measured on: a GPU through NVML, else the CPU, plus library versions.

The identity names the folder under ``latency/`` (``hardware_id``), so it must be stable for one
machine and differ between machines whose timings differ: the GPU's product name (which carries
its memory size, e.g. ``nvidia-h100-80gb-hbm3``) with ``-mig-<profile>`` for a MIG slice and
``-<N>w`` for a power cap below the default (``nvidia-a100-sxm4-40gb-300w``), or the CPU model
and the number of threads the timings use (``cpu-amd-epyc-2t``: the same CPU timed with 8
threads is another machine). Clocks, temperature and throttle reasons are recorded but not part
of the id. A profile of compiled steps (`--compile on`) is another machine too:
``cpu-amd-epyc-1t-compiled``, ``nvidia-h200-compiled``; so is a profile of B > 1 requests per
step (`--batch-sizes`): ``nvidia-h200-compiled-b8``.

CUDA and NVML number GPUs differently (``CUDA_VISIBLE_DEVICES=1,0``, SLURM, MIG), so the CUDA
device is found in NVML by its UUID, else its PCI bus id; where neither works nothing is read
from NVML rather than another GPU's clocks (``nvml_mapping="unknown"``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from dreams_nas.latency.measure.names import mig_profile_from_name, slugify
from dreams_nas.latency.measure.nvml import NvmlDevice
from dreams_nas.supernet.core.device import resolve_device
from dreams_nas.supernet.core.versions import library_versions

log = logging.getLogger(__name__)

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
    mig_profile: str | None = None  # "1g.10gb" when the CUDA device is a MIG slice
    power_cap_w: int | None = None  # the power limit where it is set below the default
    # how the CUDA device was found in NVML: "uuid" | "pci_bus_id" | "unknown" (nothing read
    # from NVML) | "no_nvml"; None for the CPU
    nvml_mapping: str | None = None
    # how the timed steps ran (`TargetAdapter.use_steps`): "dynamic" (eager) or "compiled",
    # whose hardware id ends in "-compiled": the same device running other code
    steps: str = "dynamic"
    # the requests decoded together in every timed step (`profile --batch-sizes`): a batch of
    # B > 1 is another machine too, whose id ends in "-b<B>"
    batch: int = 1

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
                    threads: int | None = None, steps: str = "dynamic",
                    batch: int = 1) -> HardwareInfo:
    """Identity of `device` (resolved first). For the CPU, `threads` is the fixed thread count
    the timings use (default: the physical core count). `steps` "compiled" (the decoding steps
    compiled, `--compile on`) names another machine: the id gains ``-compiled``; so does a
    `batch` of B > 1 requests per step: ``-b<B>``."""
    info = _detect(device, dtype, threads)
    if steps != "dynamic":
        info = replace(info, hardware_id=f"{info.hardware_id}-{steps}", steps=steps)
    if batch != 1:
        info = replace(info, hardware_id=f"{info.hardware_id}-b{batch}", batch=batch)
    return info


def _detect(device: str, dtype: str, threads: int | None) -> HardwareInfo:
    resolved = resolve_device(device)
    versions = library_versions()
    common = {"torch": versions.get("torch", "unknown"),
              "transformers": versions.get("transformers", "unknown"),
              "dtype": dtype, "versions": versions}
    if resolved.startswith("cuda"):
        index = int(resolved.split(":")[1])
        device = NvmlDevice(index)
        with device as nvml:
            if nvml is not None:
                ident = nvml.identity()
                return HardwareInfo(
                    hardware_id=ident["hardware_id"], kind="cuda", device=resolved,
                    name=ident["name"], memory_gb=ident["memory_gb"], driver=ident["driver"],
                    cuda=ident["cuda"], clocks=ident["clocks"], threads=None, cores=None,
                    throttle_reasons=ident["throttle_reasons"], mig_profile=ident["mig_profile"],
                    power_cap_w=ident["power_cap_w"], nvml_mapping=nvml.mapping, **common,
                )
        # CUDA works but NVML does not (some containers) or cannot tell which GPU this is:
        # identity from torch alone (its name of a MIG slice carries the profile).
        import torch

        props = torch.cuda.get_device_properties(index)
        return HardwareInfo(
            hardware_id=slugify(props.name), kind="cuda", device=resolved, name=props.name,
            memory_gb=round(props.total_memory / 2**30, 1), driver=None, cuda=torch.version.cuda,
            clocks=None, threads=None, cores=None, mig_profile=mig_profile_from_name(props.name),
            nvml_mapping=device.mapping, **common,
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
