"""Cut one subnet out of the supernet into a compact, standalone draft.

`extract(supernet, spec)` copies only the active heads' weights (a prefix, since heads are
importance-sorted) and only the chosen layer's memory adapter into a `CompactDraft` whose own
config says what it is. It saves as safetensors + JSON config and loads back without the
supernet (the target's embedding and LM head are attached at load time, never saved).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from dreams_nas.supernet.core.errors import InputError, MissingArtefactError
from dreams_nas.supernet.core.space import SubnetSpec
from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.state import SharedTargetModules
from torch import Tensor

WEIGHTS_NAME = "draft.safetensors"
CONFIG_NAME = "config.json"
REEXPORT = "re-export the spec folder with `dreams-nas search` (it rewrites specs/<spec_id>/)"


class CompactDraft(DreamDraft):
    """A single subnet: `config.spec` fixes heads, visual_keep and inject_layer."""

    def __init__(self, config: DraftConfig, shared: SharedTargetModules | None = None) -> None:
        if config.spec is None:
            raise InputError("a CompactDraft needs config.spec (the subnet it was extracted as)")
        super().__init__(config, shared)

    @property
    def spec(self) -> SubnetSpec:
        assert self.config.spec is not None
        return self.config.spec

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write `draft.safetensors` and `config.json` into `directory` (atomically)."""
        from dreams_nas.supernet.draft.store import save_weights_and_config

        return save_weights_and_config(self, directory, WEIGHTS_NAME, CONFIG_NAME,
                                       {"kind": "dreams-nas-compact-draft",
                                        **self.config.to_dict()})

    @classmethod
    def from_pretrained(cls, directory: str | Path, shared: SharedTargetModules | None = None,
                        device: str | torch.device = "cpu",
                        dtype: torch.dtype | None = None) -> CompactDraft:
        """Load a draft written by `save_pretrained`; `shared` = the target's embedding/LM head.
        dtype: None keeps the dtype it was saved in (the run's: a bfloat16 export loads in
        bfloat16)."""
        from dreams_nas.supernet.draft.store import (
            draft_config_from,
            load_state,
            load_weights,
            read_config_json,
        )

        directory = Path(directory)
        config_path, weights = directory / CONFIG_NAME, directory / WEIGHTS_NAME
        for path in (config_path, weights):
            if not path.is_file():
                raise MissingArtefactError(
                    f"no extracted draft in {directory} ({path.name} is missing); export one with "
                    "`dreams-nas search` or `extract(supernet, spec).save_pretrained(DIR)`"
                )
        data: dict[str, Any] = read_config_json(config_path, REEXPORT)
        data.pop("kind", None)
        config = draft_config_from(config_path, data, REEXPORT)
        if config.spec is None:
            raise InputError(f"{config_path} names no subnet (spec), so it is not an extracted "
                             f"draft's config; {REEXPORT}")
        model = cls(config, shared)
        state = load_weights(weights, device, REEXPORT)
        saved = next((t.dtype for t in state.values() if t.is_floating_point()), None)
        model.to(device=device, dtype=dtype or saved)
        load_state(model, state, weights, REEXPORT)
        return model.eval()


def _slice_state(supernet: DreamDraft, spec: SubnetSpec) -> dict[str, Tensor]:
    cfg = supernet.config
    inner = spec.heads * cfg.head_dim
    out: dict[str, Tensor] = {}
    for name, tensor in supernet.state_dict().items():
        if name.startswith("memory_inputs."):
            if not name.startswith(f"memory_inputs.{spec.inject_layer}."):
                continue
        if ".attn." in name:
            if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
                tensor = tensor[:inner]
            elif name.endswith("o_proj.weight"):
                tensor = tensor[:, :inner]
        out[name] = tensor.detach().clone().contiguous()
    return out


def extract(supernet: DreamDraft, spec: SubnetSpec) -> CompactDraft:
    """A standalone draft holding only `spec`'s weights; outputs equal the supernet's with
    `spec` active (the contract test checks this)."""
    with supernet.using(spec):  # validates the spec against the supernet
        pass
    cfg = supernet.config
    compact_cfg = DraftConfig(**{**cfg.__dict__, "num_heads": spec.heads,
                                 "inject_layers": (spec.inject_layer,), "spec": spec})
    compact = CompactDraft(compact_cfg, supernet.shared if supernet.is_attached else None)
    compact.load_state_dict(_slice_state(supernet, spec))
    param = next(supernet.parameters())
    return compact.to(device=param.device, dtype=param.dtype).eval()
