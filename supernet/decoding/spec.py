"""Load a deployable spec folder (specs/<spec_id>/) as a drafter for the speculative loop.

The folder holds `spec.json` (the subnet and its provenance), `config.json` and
`draft.safetensors` (the extracted compact draft). The target's embedding and LM head are
attached from the target being decoded; nothing of the supernet is needed.

A folder is refused, in one line, unless its spec.json is a JSON object of this code's schema
version, and unless the target being decoded is the one the spec was searched for (the same
architecture hash) and is loaded in the spec's dtype: the draft was trained against that
target's features, and its measured acceptance and predicted speedup hold for that target
only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.io import read_json
from dreams_nas.supernet.core.spec import SPEC_SCHEMA_VERSION, SubnetSpec
from dreams_nas.supernet.decoding.dream import DreamDrafter
from dreams_nas.supernet.draft.extract import CompactDraft
from dreams_nas.supernet.draft.state import SharedTargetModules
from dreams_nas.supernet.target.adapter import TargetAdapter

_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number",
               float: "a number", bool: "a boolean", type(None): "null"}


def read_spec_json(path: str | Path) -> dict[str, Any]:
    """The checked spec.json of the spec folder `path` ({} when the folder has none): a JSON
    object of this code's `schema_version` (SPEC_SCHEMA_VERSION)."""
    meta_path = Path(path) / "spec.json"
    if not meta_path.is_file():
        return {}
    meta = read_json(meta_path)
    if not isinstance(meta, dict):
        kind = _JSON_TYPES.get(type(meta), type(meta).__name__)
        raise InputError(f"{meta_path} holds {kind}, not a JSON object; export the spec again "
                         "(`dreams-nas search`)")
    version = meta.get("schema_version")
    if isinstance(version, bool) or version != SPEC_SCHEMA_VERSION:
        raise InputError(
            f"{meta_path} has schema_version={version!r}; this dreams-nas reads schema "
            f"{SPEC_SCHEMA_VERSION}: export the spec again with this version "
            "(`dreams-nas search`), or use the dreams-nas that wrote it")
    return meta


def spec_dtype(path: str | Path) -> str | None:
    """The dtype a spec folder was searched and exported in (spec.json ``dtype``; None for a
    folder whose spec.json records none: one written by hand)."""
    value = read_spec_json(path).get("dtype")
    return str(value) if value else None


def _describe(target: Mapping[str, Any]) -> str:
    """A {Target} block in words: its id and shape, e.g. ``'builtin' (llava, 2 layers, hidden
    32, architecture 0123456789abcdef)``."""
    name = repr(target["id"]) if target.get("id") else "a model built in memory"
    parts = [str(target["family"])] if target.get("family") else []
    if target.get("num_layers") is not None:
        parts.append(f"{target['num_layers']} layers")
    if target.get("hidden_size") is not None:
        parts.append(f"hidden {target['hidden_size']}")
    if target.get("architecture_hash"):
        parts.append(f"architecture {target['architecture_hash']}")
    return f"{name} ({', '.join(parts)})" if parts else name


def check_spec_target(meta: Mapping[str, Any], target: TargetAdapter, where: str | Path) -> None:
    """Refuse `target` unless it is the one spec.json's `target` records: the same architecture
    hash. A spec that records no target ({}: written without a run.json target) is not
    checked; a target recorded without its architecture hash (another dreams-nas version wrote
    it) is refused."""
    recorded = meta.get("target")
    if recorded is None or recorded == {}:
        return
    if not isinstance(recorded, Mapping):
        raise InputError(f"{Path(where) / 'spec.json'} has target={recorded!r}, not a target "
                         "object; export the spec again (`dreams-nas search`)")
    if not recorded.get("architecture_hash"):
        raise InputError(f"{Path(where) / 'spec.json'} records its target without an "
                         "architecture_hash: another dreams-nas version wrote it; export the "
                         "spec again (`dreams-nas search`)")
    loaded = target.describe()
    if recorded["architecture_hash"] == loaded.get("architecture_hash"):
        return
    source = recorded.get("path") or recorded.get("id")
    raise InputError(
        f"the spec in {where} was searched for target {_describe(recorded)}, but the loaded "
        f"target is {_describe(loaded)}; its draft and speedup hold only for its own target: "
        "pass the target the spec was searched for"
        + (f" (--target {source})" if source else ""))


def _check_dtype(meta: Mapping[str, Any], target: TargetAdapter, where: Path) -> None:
    exported = str(meta["dtype"]) if meta.get("dtype") else None
    loaded = str(target.dtype).removeprefix("torch.")
    if exported is not None and exported != loaded:
        raise InputError(
            f"the spec in {where} was searched and exported in {exported}, but the target is "
            f"loaded in {loaded}; pass --dtype {exported} (its latency and acceptance were "
            "measured in that dtype)")


def _recorded_spec(meta: Mapping[str, Any], default: SubnetSpec, where: Path) -> SubnetSpec:
    """spec.json's `spec` (the subnet as searched), else the one the draft's config records."""
    data = meta.get("spec")
    if data is None:
        return default
    if not isinstance(data, Mapping):
        raise InputError(f"{where / 'spec.json'} has spec={data!r}, not a subnet object; "
                         "export the spec again (`dreams-nas search`)")
    try:
        return SubnetSpec.from_dict(data)
    except InputError as exc:
        raise InputError(f"{where / 'spec.json'}: {exc}") from None


def load_spec_drafter(path: str | Path, target: TargetAdapter) -> DreamDrafter:
    """The spec folder's draft on `target`'s device and in its dtype. The target must be the one
    the spec was searched for, loaded in the dtype it was searched in: its draft, measured
    acceptance and predicted speedup hold only there."""
    path = Path(path)
    meta = read_spec_json(path)
    _check_dtype(meta, target, path)
    check_spec_target(meta, target, path)
    shared = SharedTargetModules(target.embed_tokens, target.lm_head)
    draft = CompactDraft.from_pretrained(path, shared, device=target.device, dtype=target.dtype)
    if draft.config.hidden_size != target.hidden_size:
        raise InputError(
            f"the draft in {path} is {draft.config.hidden_size} wide but the target is "
            f"{target.hidden_size}; use a spec exported for this target"
        )
    return DreamDrafter(draft, _recorded_spec(meta, draft.spec, path))
