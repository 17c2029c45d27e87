"""Load a VLM checkpoint (hub id or local folder) with its processor, with clear errors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.ops.linear import use_fast_linears
from dreams_nas.supernet.target.families import SUPPORTED_FAMILIES

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


def check_checkpoint_folder(folder: Path) -> None:
    """InputError unless `folder` holds a config.json of a VLM and weights."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise InputError(f"{str(folder)!r} holds no config.json, so it is not a Hugging Face "
                         "checkpoint; pass a folder written by save_pretrained or a hub id")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{str(config_path)!r} is not valid JSON ({exc}); "
                         "re-save the checkpoint") from exc
    if "vision_config" not in config:
        raise InputError(f"{str(folder)!r} holds a {config.get('model_type', 'unknown')!r} "
                         "checkpoint without a vision_config, not a VLM; "
                         f"supported families: {', '.join(SUPPORTED_FAMILIES)}")
    if not any((folder / name).is_file() for name in _WEIGHT_FILES):
        raise InputError(f"{str(folder)!r} has a config.json but no model weights "
                         "(model.safetensors); copy the whole checkpoint folder")


@dataclass(frozen=True)
class LoadedTarget:
    """A loaded checkpoint: the model, its processor and tokenizer (None when absent), where
    it came from, and why the processor could not be loaded (None when it was)."""

    model: Any
    processor: Any
    tokenizer: Any
    source: str
    processor_error: str | None = None


def _source(target: str | Path) -> str:
    """The resolved checkpoint folder of `target`, or its hub id; a one-line error for a
    folder that is not there or not a VLM checkpoint."""
    path = Path(target).expanduser()
    if path.exists():
        if not path.is_dir():
            raise InputError(f"target {str(target)!r} is a file; "
                             "pass a checkpoint folder or a hub id")
        check_checkpoint_folder(path)
        return str(path.resolve())
    if str(target).startswith((".", "/", "~")) or str(target).count("/") > 1:
        raise InputError(f"target folder {str(target)!r} does not exist; pass an existing "
                         "checkpoint folder, a hub id such as llava-hf/llava-1.5-7b-hf, "
                         "or builtin")
    check_hub_reachable(str(target))
    return str(target)


def check_hub_reachable(repo_id: str, timeout_s: float = 3.0) -> None:
    """A hub id that is not in the local cache needs the hub: fail at once, in one line, when
    it cannot be reached (offline mode, or no connection within `timeout_s`) instead of after
    the download's retries (about 30 s)."""
    import os
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants, try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        return
    why = None
    if constants.HF_HUB_OFFLINE:
        why = "offline mode is on (HF_HUB_OFFLINE)"
    else:
        url = urlparse(os.environ.get("HF_ENDPOINT") or constants.ENDPOINT)
        try:
            socket.create_connection((url.hostname or "huggingface.co",
                                      url.port or (443 if url.scheme == "https" else 80)),
                                     timeout=timeout_s).close()
        except OSError as exc:
            why = f"{url.hostname} cannot be reached ({exc.strerror or exc})"
    if why is not None:
        raise InputError(f"hub id {repo_id!r} is not in the local Hugging Face cache and {why}; "
                         "download it once where the hub is reachable, or pass a checkpoint "
                         "folder")


def load_config(target: str | Path) -> Any:
    """The checkpoint's config alone (no weights)."""
    from transformers import AutoConfig

    source = _source(target)
    try:
        return AutoConfig.from_pretrained(source)
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"cannot read the config of {source!r}: {type(exc).__name__}: "
                         f"{exc}") from exc


def load_model_and_processor(target: str | Path, *, device: str | torch.device = "cpu",
                             dtype: torch.dtype | None = None) -> LoadedTarget:
    """The model, processor and tokenizer of a hub id or a local checkpoint folder."""
    from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

    source = _source(target)
    try:
        model = AutoModelForImageTextToText.from_pretrained(source, dtype=dtype or "auto")
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"cannot load a VLM from {source!r}: {type(exc).__name__}: {exc}") from exc
    model = model.to(device).eval()
    use_fast_linears(model)  # a CPU without native 16-bit products: no slow kernels
    processor = tokenizer = processor_error = None
    try:
        processor = AutoProcessor.from_pretrained(source)
        tokenizer = getattr(processor, "tokenizer", None)
    except Exception as exc:  # noqa: BLE001 - a processor needing an absent optional library (torchvision...)
        processor_error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        try:
            tokenizer = AutoTokenizer.from_pretrained(source)
        except Exception:  # noqa: BLE001
            tokenizer = None
    return LoadedTarget(model, processor, tokenizer, source, processor_error)
