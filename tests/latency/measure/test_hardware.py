from __future__ import annotations

import pynvml
import pytest
from _support.nvml import FakeGpu, FakeMig, cuda_properties, install_cuda, install_nvml
from dreams_nas.latency.measure.hardware import HardwareInfo, cpu_identity, detect_hardware
from dreams_nas.latency.measure.names import gpu_hardware_id, mig_profile_from_name, slugify
from dreams_nas.latency.measure.nvml import NvmlDevice, reasons_from_mask


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
    assert hw.nvml_mapping in ("uuid", "pci_bus_id")
    # the product name (with its MIG profile on a slice), plus a lowered power cap
    assert hw.hardware_id == gpu_hardware_id(hw.name, power_cap_w=hw.power_cap_w)


# --- the GPU behind a CUDA device, on a fake two-GPU node ---------------------------------
A100 = dict(name="NVIDIA A100-SXM4-40GB", uuid="GPU-aaaaaaaa-0000-4000-8000-000000000001",
            bus_id="00000000:07:00.0", memory_gb=40.0, sm_mhz=1410, sm_max_mhz=1410)
H100 = dict(name="NVIDIA H100 80GB HBM3", uuid="GPU-bbbbbbbb-0000-4000-8000-000000000002",
            bus_id="00000000:3B:00.0", memory_gb=80.0, sm_mhz=1755, sm_max_mhz=1980,
            power_limit_mw=700_000, power_default_mw=700_000)


def _node(**h100: object) -> tuple[FakeGpu, FakeGpu]:
    """NVML index 0 = an A100, index 1 = an H100 (different names, clocks, PCI bus ids)."""
    return FakeGpu(**A100), FakeGpu(**{**H100, **h100})


def _mig_slice() -> FakeMig:
    return FakeMig(name="NVIDIA H100 80GB HBM3 MIG 1g.10gb", memory_mb=9856,
                   uuid="MIG-cccccccc-0000-4000-8000-000000000003")


def test_cuda_order_is_not_nvml_order(monkeypatch) -> None:
    a100, h100 = _node()
    nvml = install_nvml(monkeypatch, [a100, h100])
    install_cuda(monkeypatch, [h100, a100])  # CUDA_VISIBLE_DEVICES=1,0
    hw = detect_hardware("cuda:0", dtype="bfloat16")
    assert hw.hardware_id == "nvidia-h100-80gb-hbm3" and hw.name == "NVIDIA H100 80GB HBM3"
    assert hw.memory_gb == 80.0 and hw.clocks["sm_max_mhz"] == 1980
    assert hw.nvml_mapping == "uuid" and hw.mig_profile is None and hw.power_cap_w is None
    assert set(nvml.reads) == {h100} and nvml.open == 0
    other = detect_hardware("cuda:1")
    assert other.hardware_id == "nvidia-a100-sxm4-40gb" and other.clocks["sm_max_mhz"] == 1410
    assert HardwareInfo.from_dict(hw.to_dict()) == hw


def test_the_profiler_probe_reads_the_mapped_gpu(monkeypatch) -> None:
    a100, h100 = _node(throttle_mask=0x4)
    nvml = install_nvml(monkeypatch, [a100, h100])
    install_cuda(monkeypatch, [h100, a100])
    with NvmlDevice(0) as probe:
        assert probe.sm_clock_mhz() == 1755 and probe.throttle_mask() == 0x4
    assert set(nvml.reads) == {h100}


@pytest.mark.parametrize("how", ["missing", "unsupported"])
def test_without_the_by_uuid_function_the_pci_bus_id_maps(monkeypatch, how) -> None:
    a100, h100 = _node()
    gone = ["nvmlDeviceGetHandleByUUID"]
    nvml = install_nvml(monkeypatch, [a100, h100], **{how: gone})
    install_cuda(monkeypatch, [h100, a100])
    hw = detect_hardware("cuda:0")
    assert hw.hardware_id == "nvidia-h100-80gb-hbm3" and hw.clocks["sm_mhz"] == 1755
    assert hw.nvml_mapping == "pci_bus_id" and set(nvml.reads) == {h100}


def test_torch_without_a_uuid_maps_by_pci_bus_id(monkeypatch) -> None:
    a100, h100 = _node()
    install_nvml(monkeypatch, [a100, h100])
    install_cuda(monkeypatch, [h100, a100], lambda d: cuda_properties(d, uuid=False))
    hw = detect_hardware("cuda:0")
    assert hw.hardware_id == "nvidia-h100-80gb-hbm3" and hw.nvml_mapping == "pci_bus_id"


def test_unmapped_device_reads_no_clocks_and_is_named_by_torch(monkeypatch, caplog) -> None:
    a100, h100 = _node()
    nvml = install_nvml(monkeypatch, [a100, h100])
    install_cuda(monkeypatch, [h100, a100],
                 lambda d: cuda_properties(d, uuid=False, pci=False))
    with caplog.at_level("WARNING", logger="dreams_nas.latency.measure.hardware"):
        hw = detect_hardware("cuda:0")
    assert hw.hardware_id == "nvidia-h100-80gb-hbm3" and hw.name == "NVIDIA H100 80GB HBM3"
    assert hw.nvml_mapping == "unknown" and hw.clocks is None and hw.driver is None
    assert hw.memory_gb == 80.0 and hw.throttle_reasons == ()
    assert nvml.reads == [] and nvml.open == 0  # NVML index 0 (the A100) was not guessed
    assert "matches no NVML device by UUID or PCI bus id" in caplog.text
    with NvmlDevice(0) as probe:
        assert probe is None


def test_a_mig_slice_is_its_own_hardware(monkeypatch) -> None:
    a100, h100 = _node(migs=[_mig_slice()])
    nvml = install_nvml(monkeypatch, [a100, h100])
    install_cuda(monkeypatch, [h100.migs[0]])
    hw = detect_hardware("cuda:0")
    assert hw.hardware_id == "nvidia-h100-80gb-hbm3-mig-1g.10gb" and hw.mig_profile == "1g.10gb"
    assert hw.name == "NVIDIA H100 80GB HBM3 MIG 1g.10gb" and hw.nvml_mapping == "uuid"
    assert hw.memory_gb == 9.6  # the slice's memory, not the GPU's
    assert hw.clocks["sm_max_mhz"] == 1980 and set(nvml.reads) == {h100}  # the parent's clocks


def test_a_mig_slice_without_by_uuid_is_found_among_its_gpus_slices(monkeypatch) -> None:
    other = FakeMig(name="NVIDIA H100 80GB HBM3 MIG 3g.40gb", memory_mb=40192, gpu_slices=3,
                    compute_slices=3, uuid="MIG-dddddddd-0000-4000-8000-000000000004")
    a100, h100 = _node(migs=[other, _mig_slice()])
    install_nvml(monkeypatch, [a100, h100], missing=["nvmlDeviceGetHandleByUUID"])
    install_cuda(monkeypatch, [h100.migs[1]])
    hw = detect_hardware("cuda:0")
    assert hw.hardware_id == "nvidia-h100-80gb-hbm3-mig-1g.10gb"
    assert hw.nvml_mapping == "pci_bus_id"


def test_mig_profile_from_slice_counts_when_the_name_lacks_it(monkeypatch) -> None:
    mig = FakeMig(name="MIG device", memory_mb=40192, gpu_slices=3, compute_slices=3,
                  uuid="MIG-cccccccc-0000-4000-8000-000000000003")
    a100, h100 = _node(migs=[mig])
    install_nvml(monkeypatch, [a100, h100])
    install_cuda(monkeypatch, [mig])
    assert detect_hardware("cuda:0").hardware_id == "nvidia-h100-80gb-hbm3-mig-3g.40gb"


def test_a_mig_slice_that_cannot_be_told_apart_is_named_by_torch(monkeypatch) -> None:
    a100, h100 = _node(migs=[_mig_slice()])
    nvml = install_nvml(monkeypatch, [a100, h100])
    install_cuda(monkeypatch, [h100.migs[0]], lambda d: cuda_properties(d, uuid=False))
    hw = detect_hardware("cuda:0")  # the PCI bus id finds the H100, not which of its slices
    assert hw.hardware_id == "nvidia-h100-80gb-hbm3-mig-1g.10gb" and hw.mig_profile == "1g.10gb"
    assert hw.nvml_mapping == "unknown" and hw.clocks is None and nvml.reads == []


def test_a_lowered_power_cap_is_part_of_the_id(monkeypatch) -> None:
    a100 = FakeGpu(**{**A100, "power_limit_mw": 300_000, "power_default_mw": 400_000})
    install_nvml(monkeypatch, [a100])
    install_cuda(monkeypatch, [a100])
    hw = detect_hardware("cuda:0")
    assert hw.hardware_id == "nvidia-a100-sxm4-40gb-300w" and hw.power_cap_w == 300
    assert hw.clocks["power_limit_w"] == 300.0 and hw.clocks["power_default_w"] == 400.0


def test_a_capped_mig_slice_carries_both_suffixes(monkeypatch) -> None:
    a100, h100 = _node(migs=[_mig_slice()], power_limit_mw=500_000)
    install_nvml(monkeypatch, [a100, h100])
    install_cuda(monkeypatch, [h100.migs[0]])
    assert detect_hardware("cuda:0").hardware_id == "nvidia-h100-80gb-hbm3-mig-1g.10gb-500w"


def test_gpu_ids_of_plain_devices_do_not_change() -> None:
    assert gpu_hardware_id("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert gpu_hardware_id("NVIDIA A100-SXM4-40GB", power_cap_w=300) == "nvidia-a100-sxm4-40gb-300w"
    assert mig_profile_from_name("NVIDIA A100-SXM4-80GB MIG 1g.10gb+me") == "1g.10gb+me"
    assert mig_profile_from_name("NVIDIA A100-SXM4-80GB MIG 1c.2g.20gb") == "1c.2g.20gb"
    assert mig_profile_from_name("NVIDIA H100 80GB HBM3") is None


def test_old_hardware_json_still_loads() -> None:
    old = detect_hardware("cpu", threads=1).to_dict()
    for key in ("mig_profile", "power_cap_w", "nvml_mapping"):
        del old[key]
    hw = HardwareInfo.from_dict(old)
    assert hw.mig_profile is None and hw.power_cap_w is None and hw.nvml_mapping is None
