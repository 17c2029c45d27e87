"""Checkpoints of supernet training: weights and AdamW moments as safetensors, the step, the
loss curve, the held-out evaluations and float16's loss scale as JSON, all written atomically
(state.json last: it names the step the weight files belong to); the best evaluation's weights
beside them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.io import atomic_write_json, read_json
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.training.convergence import Tracker
from dreams_nas.supernet.training.features import TargetSample, sample_input_ids

BEST = "best.safetensors"
# settings that bound a run without changing what its steps compute: a resumed run may differ
NOT_FINGERPRINTED = ("max_seconds", "checkpoint_every")


@dataclass
class TrainState:
    step: int = 0
    heads_sorted: bool = False
    loss_curve: list[dict[str, float]] = field(default_factory=list)
    tracker: Tracker = field(default_factory=Tracker)
    ema: dict[str, torch.Tensor] | None = None  # phase 2's weight average (`ema`), if any
    # float16's loss scaler (`GradScaler.state_dict()`: its scale and growth count); {} when
    # the run scales no loss (float32, bfloat16)
    scaler: dict[str, Any] = field(default_factory=dict)


def save_checkpoint(directory: Path, model: DreamDraft, optimizer: torch.optim.Optimizer,
                     state: TrainState, fingerprint: str) -> None:
    from dreams_nas.supernet.draft.saving import save_tensors

    directory.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    opt = optimizer.state_dict()
    moments = {f"{idx}.{key}": (val.detach().cpu().contiguous() if val.dim() else val.reshape(1))
               for idx, entry in opt["state"].items() for key, val in entry.items()
               if torch.is_tensor(val)}
    files = [("model", weights), ("optimizer", moments)]
    if state.ema is not None:
        files.append(("ema", state.ema))
    for name, tensors in files:
        tmp = directory / f".{name}.safetensors.tmp"
        save_tensors(tensors, tmp, directory / f"{name}.safetensors")
        tmp.replace(directory / f"{name}.safetensors")
    # state.json last: it names the step the two weight files belong to
    atomic_write_json(directory / "state.json", {
        "fingerprint": fingerprint, "step": state.step, "heads_sorted": state.heads_sorted,
        "loss_curve": state.loss_curve, "param_groups": opt["param_groups"],
        "convergence": state.tracker.to_dict(), "ema": state.ema is not None,
        "scaler": state.scaler,
    })


def weights_of(model: DreamDraft) -> dict[str, torch.Tensor]:
    """A CPU copy of the model's weights (the best evaluation's, kept while training on)."""
    return {k: v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items()}


def save_best(directory: Path | None, weights: dict[str, torch.Tensor]) -> None:
    """Write the best evaluation's weights beside the checkpoint (atomically)."""
    from dreams_nas.supernet.draft.saving import save_tensors

    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{BEST}.tmp"
    save_tensors(weights, tmp, directory / BEST)
    tmp.replace(directory / BEST)


def load_best(directory: Path | None, device: torch.device) -> dict[str, Any] | None:
    from dreams_nas.supernet.draft.saving import load_weights

    if directory is None or not (directory / BEST).is_file():
        return None
    fix = f"delete {directory} and rerun `dreams-nas train` to train from the start"
    return load_weights(directory / BEST, device, fix)


def load_checkpoint(directory: Path, model: DreamDraft, optimizer: torch.optim.Optimizer,
                     fingerprint: str) -> TrainState | None:
    from dreams_nas.supernet.draft.saving import load_weights

    if not (directory / "state.json").is_file():
        return None
    meta = read_json(directory / "state.json")
    if meta.get("fingerprint") != fingerprint:
        raise InputError(
            f"the checkpoint in {directory} belongs to another training set-up (data, target, "
            "settings or dreams-nas version differ); use another --run folder or delete that "
            "checkpoint folder"
        )
    device = next(model.parameters()).device
    fix = f"delete {directory} and rerun `dreams-nas train` to train from the start"
    model.load_state_dict(load_weights(directory / "model.safetensors", device, fix))
    flat = load_weights(directory / "optimizer.safetensors", device, fix)
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in flat.items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = tensor.reshape(()) if key == "step" else tensor
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    ema = load_weights(directory / "ema.safetensors", device, fix) if meta["ema"] else None
    return TrainState(step=int(meta["step"]), heads_sorted=bool(meta["heads_sorted"]),
                      loss_curve=list(meta["loss_curve"]),
                      tracker=Tracker.from_dict(meta["convergence"]), ema=ema,
                      # a checkpoint written before the scaler was saved: it starts afresh
                      scaler=dict(meta.get("scaler") or {}))


def fingerprint_of(model: DreamDraft, samples: Sequence[TargetSample],
                   distill_layers: Sequence[int], settings: dict[str, Any],
                   compute_dtype: torch.dtype | None = None) -> str:
    """The identity of a training set-up: a checkpoint resumes only the run it belongs to.
    `settings`: the `TrainConfig` as a dict."""
    digest = hashlib.sha256()
    train = {k: v for k, v in settings.items() if k not in NOT_FINGERPRINTED}
    if model.config.num_layers == 1:  # no elastic depth: the settings change nothing
        train.pop("phase1_shallowest", None)
        train.pop("phase2_shallowest", None)
    fields = {"draft": model.config.to_dict(), "train": train,
              "distill": list(distill_layers)}
    fields["compute_dtype"] = str(compute_dtype or torch.float32)
    digest.update(json.dumps(fields, sort_keys=True).encode())
    for ids in sample_input_ids(samples):  # a feature store reads the ids alone
        digest.update(ids.numpy().tobytes())
    return digest.hexdigest()[:16]
