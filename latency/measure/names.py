"""How a measured device is named: the hardware id that names its ``latency/<hardware-id>/``
folder (a slug of the product name, with the MIG profile and a lowered power cap)."""

from __future__ import annotations

import re


def slugify(text: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"nvidia-h100-80gb-hbm3"`` (a valid folder name)."""
    text = re.sub(r"\((r|tm|c)\)", " ", text.lower())
    text = re.sub(r"\b(cpu|processor)\b|@", " ", text)
    slug = re.sub(r"[^a-z0-9.]+", "-", text).strip("-.")
    return re.sub(r"-{2,}", "-", slug) or "unknown"


def gpu_hardware_id(name: str, mig_profile: str | None = None,
                    power_cap_w: int | None = None) -> str:
    """The id of a GPU: its product name, ``-mig-<profile>`` for a MIG slice, ``-<N>w`` for a
    power cap below the default (``nvidia-h100-80gb-hbm3-mig-1g.10gb``,
    ``nvidia-a100-sxm4-40gb-300w``). The MIG part matches the slug of the name torch gives a
    slice (``NVIDIA H100 80GB HBM3 MIG 1g.10gb``), so the id is the same without NVML."""
    text = name if mig_profile is None else f"{name} MIG {mig_profile}"
    return slugify(text) + ("" if power_cap_w is None else f"-{power_cap_w}w")


# A MIG profile as NVML and CUDA name it: "1g.10gb", "1g.10gb+me", "1c.2g.20gb" (a compute
# instance sharing a GPU instance).
_MIG_PROFILE = re.compile(r"\b((?:\d+c\.)?\d+g\.\d+gb(?:\+[a-z]+)*)", re.IGNORECASE)


def mig_profile_from_name(name: str) -> str | None:
    """``"NVIDIA H100 80GB HBM3 MIG 1g.10gb"`` -> ``"1g.10gb"``; None for a whole GPU."""
    match = _MIG_PROFILE.search(name) if "mig" in name.lower() else None
    return None if match is None else match.group(1).lower()
