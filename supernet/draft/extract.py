"""Cut one subnet out of the supernet into a compact, standalone draft.

`extract(supernet, spec)` copies only the active heads' and MLP channels' weights (prefixes,
since both are importance-sorted), only the decoder layers of its depth (the first `depth`
before the cross-attention, the last `depth` after it), only the chosen layer's memory
adapter and, with a draft vocabulary, the token ids it predicts over into a `CompactDraft`
whose own config says what it is. It saves as safetensors + JSON config and loads back
without the supernet (the target's embedding and LM head are attached at load time, never
saved).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from dreams_nas.supernet.core.errors import InputError, MissingArtefactError
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.layers import skipped_layers
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.state import SharedTargetModules
from torch import Tensor

WEIGHTS_NAME = "draft.safetensors"
CONFIG_NAME = "config.json"
REEXPORT = "re-export the spec folder with `dreams-nas search` (it rewrites specs/<spec_id>/)"


class CompactDraft(DreamDraft):
    """A single subnet: `config.spec` fixes heads, visual_keep, inject_layer, depth, mlp and
    draft_vocab (with a share below 1 it keeps the `vocab_order` prefix it predicts over)."""

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
        from dreams_nas.supernet.draft.saving import save_weights_and_config

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
        from dreams_nas.supernet.draft.saving import (
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
    channels = supernet.channels_of(spec)
    dropped = skipped_layers(cfg.num_layers, spec.depth)
    shift = cfg.num_layers - spec.depth  # the kept last layers after the cross become 0..
    out: dict[str, Tensor] = {}
    for name, tensor in supernet.state_dict().items():
        if name.startswith("memory_inputs."):
            if not name.startswith(f"memory_inputs.{spec.inject_layer}."):
                continue
        if name.startswith(dropped):
            continue
        if name == "vocab_order":
            if spec.draft_vocab >= 1.0:
                continue
            tensor = tensor[:supernet.vocab_rows_of(spec)]
        if name.startswith("layers_out.") and shift:
            index, rest = name.removeprefix("layers_out.").split(".", 1)
            name = f"layers_out.{int(index) - shift}.{rest}"
        if ".attn." in name:
            if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
                tensor = tensor[:inner]
            elif name.endswith("o_proj.weight"):
                tensor = tensor[:, :inner]
        elif ".mlp." in name:
            if name.endswith(("gate_proj.weight", "up_proj.weight")):
                tensor = tensor[:channels]
            elif name.endswith("down_proj.weight"):
                tensor = tensor[:, :channels]
        out[name] = tensor.detach().clone().contiguous()
    return out


def extract(supernet: DreamDraft, spec: SubnetSpec) -> CompactDraft:
    """A standalone draft holding only `spec`'s weights; outputs equal the supernet's with
    `spec` active (the contract test checks this)."""
    with supernet.using(spec):  # validates the spec against the supernet
        pass
    cfg = supernet.config
    compact_cfg = DraftConfig(**{**cfg.__dict__, "num_heads": spec.heads,
                                 "inject_layers": (spec.inject_layer,), "spec": spec,
                                 "num_layers": spec.depth,
                                 "intermediate_size": supernet.channels_of(spec),
                                 "mlp_shares": (spec.mlp,),
                                 "vocab_shares": (spec.draft_vocab,)})
    compact = CompactDraft(compact_cfg, supernet.shared if supernet.is_attached else None)
    compact.load_state_dict(_slice_state(supernet, spec))
    param = next(supernet.parameters())
    return compact.to(device=param.device, dtype=param.dtype).eval()
