"""Save and load the trained supernet (run folder `supernet/`: model.safetensors + config.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from dreams_nas.supernet.core.errors import MissingArtefactError
from dreams_nas.supernet.core.io import atomic_write_json, file_sha256
from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.state import SharedTargetModules

SUPERNET_WEIGHTS = "model.safetensors"
SUPERNET_CONFIG = "config.json"


def file_hash(path: str | Path) -> str:
    """First 16 hex chars of the file's sha256 (the run's `supernet.hash`)."""
    return file_sha256(path)[:16]


def save_weights_and_config(module: torch.nn.Module, directory: str | Path, weights_name: str,
                            config_name: str, config: dict[str, Any]) -> Path:
    """Write `module`'s weights (safetensors) and its JSON config, each atomically."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in module.state_dict().items()}
    tmp = directory / f".{weights_name}.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(directory / weights_name)
    atomic_write_json(directory / config_name, config)
    return directory


def save_supernet(model: DreamDraft, directory: str | Path,
                  extra: dict[str, Any] | None = None) -> str:
    """Write the supernet's weights and config atomically; returns the weights' hash."""
    directory = save_weights_and_config(
        model, directory, SUPERNET_WEIGHTS, SUPERNET_CONFIG,
        {"kind": "dreams-nas-supernet", **model.config.to_dict(), **(extra or {})})
    return file_hash(directory / SUPERNET_WEIGHTS)


def read_supernet_config(directory: str | Path) -> DraftConfig:
    """The supernet's config alone (enough to build an untrained twin for latency profiling)."""
    path = Path(directory) / SUPERNET_CONFIG
    if not path.is_file():
        raise MissingArtefactError(f"no supernet config in {path}; run `dreams-nas train` first")
    data = json.loads(path.read_text(encoding="utf-8"))
    known = set(DraftConfig.__dataclass_fields__) | {"schema_version"}
    return DraftConfig.from_dict({k: v for k, v in data.items() if k in known})


def load_supernet(directory: str | Path, shared: SharedTargetModules | None = None,
                  device: str | torch.device = "cpu") -> DreamDraft:
    from safetensors.torch import load_file

    directory = Path(directory)
    weights = directory / SUPERNET_WEIGHTS
    if not weights.is_file():
        raise MissingArtefactError(f"no trained supernet in {directory}; run `dreams-nas train` "
                                   "or `dreams-nas demo` first")
    model = DreamDraft(read_supernet_config(directory), shared)
    model.load_state_dict(load_file(str(weights), device=str(device)))
    return model.to(device).eval()
