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


def spec_dtype(path: str | Path) -> str | None:
    """The dtype a spec folder was searched and exported in (spec.json ``dtype``; None for a
    folder written before specs recorded it)."""
    meta_path = Path(path) / "spec.json"
    meta = read_json(meta_path) if meta_path.is_file() else {}
    value = meta.get("dtype") if isinstance(meta, dict) else None
    return str(value) if value else None


def load_spec_drafter(path: str | Path, target: TargetAdapter) -> DreamDrafter:
    """The spec folder's draft on `target`'s device and in its dtype, which must be the dtype
    the spec was searched in: its predicted speedup holds only there."""
    path = Path(path)
    exported = spec_dtype(path)
    loaded = str(target.dtype).removeprefix("torch.")
    if exported is not None and exported != loaded:
        raise InputError(
            f"the spec in {path} was searched and exported in {exported}, but the target is "
            f"loaded in {loaded}; pass --dtype {exported} (its latency and acceptance were "
            "measured in that dtype)")
    shared = SharedTargetModules(target.embed_tokens, target.lm_head)
    draft = CompactDraft.from_pretrained(path, shared, device=target.device, dtype=target.dtype)
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
