"""Save and load the trained supernet (run folder `supernet/`: model.safetensors + config.json)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from dreams_nas.supernet.core.errors import InputError, MissingArtefactError
from dreams_nas.supernet.core.io import atomic_write_json, file_sha256
from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.state import SharedTargetModules

SUPERNET_WEIGHTS = "model.safetensors"
SUPERNET_CONFIG = "config.json"
RETRAIN = "retrain the supernet with `dreams-nas train` (it rewrites both files)"


def file_hash(path: str | Path) -> str:
    """First 16 hex chars of the file's sha256 (the run's `supernet.hash`)."""
    return file_sha256(path)[:16]


def save_weights_and_config(module: torch.nn.Module, directory: str | Path, weights_name: str,
                            config_name: str, config: dict[str, Any]) -> Path:
    """Write `module`'s weights (safetensors) and its JSON config, each atomically."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in module.state_dict().items()}
    tmp = directory / f".{weights_name}.tmp"
    save_tensors(tensors, tmp, directory / weights_name)
    tmp.replace(directory / weights_name)
    atomic_write_json(directory / config_name, config)
    return directory


# safetensors reports an I/O failure as "... I/O error: Read-only file system (os error 30) ...".
_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def save_tensors(tensors: dict[str, torch.Tensor], tmp: Path, final: Path) -> None:
    """safetensors' `save_file` into `tmp`; an I/O failure (a read-only or full disk) is
    re-raised as the OSError it is, naming `final`, so that the CLI reports the user's disk
    in one line instead of an internal SafetensorError."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    except SafetensorError as exc:
        found = _OS_ERROR.search(str(exc))
        if found is None:
            raise
        code = int(found[1])
        raise OSError(code, os.strerror(code), str(final)) from exc
    os.chmod(tmp, 0o666 & ~_umask())  # safetensors writes 0600; every other file obeys the umask


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
    data = read_config_json(path, RETRAIN)
    known = set(DraftConfig.__dataclass_fields__) | {"schema_version"}
    return draft_config_from(path, {k: v for k, v in data.items() if k in known}, RETRAIN)


def read_config_json(path: Path, fix: str) -> dict[str, Any]:
    """The JSON object in `path`; anything else (cut short, not JSON, not UTF-8, not an object)
    is one InputError naming the file, what is wrong and `fix`."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg}); {fix}"
                         ) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text (byte {exc.start}); {fix}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} holds a JSON {type(data).__name__}, not the config object; "
                         f"{fix}")
    return data


def draft_config_from(path: Path, data: dict[str, Any], fix: str) -> DraftConfig:
    """`DraftConfig.from_dict(data)`, with a missing key or a value of the wrong type reported
    as one InputError naming the file `data` came from and `fix`."""
    try:
        config = DraftConfig.from_dict(data)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(f"{path} is not a valid draft config ({why}); {fix}") from None
    wrong = _wrong_sizes(config)
    if wrong:
        raise InputError(f"{path} is not a valid draft config ({wrong}); {fix}")
    return config


def _wrong_sizes(config: DraftConfig) -> str | None:
    """What is wrong with the config's sizes and switches (the dataclass checks no types; a
    string or a 0 here would fail deep inside the model's construction), else None."""
    for field in fields(config):
        value = getattr(config, field.name)
        if field.type == "int" and (isinstance(value, bool) or not isinstance(value, int)
                                    or value < 1):
            return f"{field.name}={value!r} is not a whole number >= 1"
        if field.type == "float" and (isinstance(value, bool)
                                      or not isinstance(value, int | float) or not value > 0):
            return f"{field.name}={value!r} is not a number > 0"
        if field.type == "bool" and not isinstance(value, bool):
            return f"{field.name}={value!r} is not true or false"
    return None


def load_weights(path: Path, device: str | torch.device, fix: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; a truncated or corrupt file is one InputError naming
    it and `fix` (safetensors' own error names neither)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device=str(device))
    except SafetensorError as exc:
        why = " ".join(str(exc).split())
        raise InputError(f"{path} is not a readable safetensors file, likely cut short by a "
                         f"kill or a full disk ({why}); {fix}") from None


def load_state(model: torch.nn.Module, state: dict[str, torch.Tensor], path: Path,
               fix: str) -> None:
    """`model.load_state_dict(state)`; weights that do not fit the config (missing, extra or
    differently shaped tensors, or the names of another dreams-nas version) are one InputError
    naming `path` and `fix`."""
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        first = next((line.strip() for line in str(exc).splitlines()[1:] if line.strip()),
                     " ".join(str(exc).split()))
        raise InputError(f"{path} does not fit its config.json ({first[:300]}); {fix}"
                         ) from None


def load_supernet(directory: str | Path, shared: SharedTargetModules | None = None,
                  device: str | torch.device = "cpu") -> DreamDraft:
    directory = Path(directory)
    weights = directory / SUPERNET_WEIGHTS
    if not weights.is_file():
        raise MissingArtefactError(f"no trained supernet in {directory}; run `dreams-nas train` "
                                   "or `dreams-nas demo` first")
    model = DreamDraft(read_supernet_config(directory), shared)
    load_state(model, load_weights(weights, device, RETRAIN), weights, RETRAIN)
    return model.to(device).eval()
