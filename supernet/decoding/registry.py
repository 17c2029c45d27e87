"""Drafters by name: the training-free ones, or a deployable spec folder (specs/<spec_id>/)."""

from __future__ import annotations

from pathlib import Path

from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.decoding.drafters import OracleDrafter, PromptLookupDrafter
from dreams_nas.supernet.decoding.protocol import Drafter
from dreams_nas.supernet.decoding.spec import load_spec_drafter
from dreams_nas.supernet.target.adapter import TargetAdapter


def load_drafter(name_or_path: str | Path, target: TargetAdapter, *,
                 max_new_tokens: int = 256) -> Drafter:
    """A drafter by name (lookup, oracle) or from a deployable spec folder (specs/<spec_id>/)."""
    name = str(name_or_path)
    if name == "lookup":
        return PromptLookupDrafter()
    if name == "oracle":
        return OracleDrafter(horizon=max_new_tokens)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "spec.json").is_file():
            raise InputError(f"drafter folder {name!r} holds no spec.json; pass a folder "
                             "written by `dreams-nas search` (specs/<spec_id>/) or one of: "
                             "lookup, oracle")
        return load_spec_drafter(path, target)
    raise InputError(f"unknown drafter {name!r}; pick lookup, oracle or the path of a spec folder "
                     "(specs/<spec_id>/ in the run folder)")
