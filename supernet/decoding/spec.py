"""Load a deployable spec folder (specs/<spec_id>/) as a drafter for the speculative loop.

The folder holds `spec.json` (the subnet and its provenance), `config.json` and
`draft.safetensors` (the extracted compact draft). The target's embedding and LM head are
attached from the target being decoded; nothing of the supernet is needed.
"""

from __future__ import annotations

from pathlib import Path

from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.io import read_json
from dreams_nas.supernet.core.space import SubnetSpec
from dreams_nas.supernet.decoding.dream import DreamDrafter
from dreams_nas.supernet.draft.extract import CompactDraft
from dreams_nas.supernet.draft.state import SharedTargetModules
from dreams_nas.supernet.target.adapter import TargetAdapter


def load_spec_drafter(path: str | Path, target: TargetAdapter) -> DreamDrafter:
    path = Path(path)
    shared = SharedTargetModules(target.embed_tokens, target.lm_head)
    draft = CompactDraft.from_pretrained(path, shared, device=target.device)
    if draft.config.hidden_size != target.hidden_size:
        raise InputError(
            f"the draft in {path} is {draft.config.hidden_size} wide but the target is "
            f"{target.hidden_size}; use a spec exported for this target"
        )
    spec = draft.spec
    meta = read_json(path / "spec.json") if (path / "spec.json").is_file() else {}
    if isinstance(meta, dict) and isinstance(meta.get("spec"), dict):
        spec = SubnetSpec.from_dict(meta["spec"])
    return DreamDrafter(draft, spec)
