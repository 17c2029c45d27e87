from __future__ import annotations

import pynvml
import pytest
from dreams_nas.latency.hardware import (
    HardwareInfo,
    NvmlDevice,
    cpu_identity,
    detect_hardware,
    reasons_from_mask,
    slugify,
)


@pytest.fixture
def no_nvml(monkeypatch):
    """A machine without the NVIDIA driver: nvmlInit cannot find libnvidia-ml."""

    def missing():
        raise pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(pynvml, "nvmlInit", missing)


def test_slugs_are_stable_folder_names() -> None:
    assert slugify("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert slugify("Intel(R) Xeon(R) CPU @ 2.20GHz") == "intel-xeon-2.20ghz"
    assert slugify("AMD EPYC 7B13 64-Core Processor") == "amd-epyc-7b13-64-core"
    assert slugify("") == "unknown"


def test_without_nvml_the_identity_is_the_cpu(no_nvml) -> None:
    with NvmlDevice(0) as nvml:
        assert nvml is None
    hw = detect_hardware("auto", threads=2)
    assert hw.kind == "cpu" and hw.device == "cpu"
    assert hw.hardware_id.startswith("cpu-") and hw.hardware_id.endswith("-2t")
    assert hw.threads == 2 and hw.cores >= 1
    assert hw.torch and hw.transformers and hw.dtype == "float32"
    assert HardwareInfo.from_dict(hw.to_dict()) == hw


def test_thread_count_is_part_of_the_cpu_id() -> None:
    one, two = detect_hardware("cpu", threads=1), detect_hardware("cpu", threads=2)
    assert one.hardware_id != two.hardware_id


def test_cpu_identity_counts_physical_cores(tmp_path) -> None:
    info = tmp_path / "cpuinfo"
    block = "processor\t: {p}\nmodel name\t: AMD EPYC 7B13\nphysical id\t: 0\ncore id\t: {c}\n\n"
    info.write_text("".join(block.format(p=p, c=p // 2) for p in range(4)))  # 2 cores x 2 SMT
    ident = cpu_identity(info)
    assert ident["name"] == "AMD EPYC 7B13" and ident["cores"] == 2


def test_throttle_reasons_ignore_idle_and_app_clocks() -> None:
    assert reasons_from_mask(0x1 | 0x2 | 0x100) == ()
    assert reasons_from_mask(0x4 | 0x40) == ("sw_power_cap", "hw_thermal_slowdown")


@pytest.mark.cuda
def test_gpu_identity_through_nvml() -> None:
    hw = detect_hardware("cuda:0", dtype="bfloat16")
    assert hw.kind == "cuda" and hw.name and hw.memory_gb > 0
    assert hw.driver and hw.clocks["sm_max_mhz"] > 0
    assert hw.hardware_id == slugify(hw.name)
