"""dreams_nas.supernet: what a subnet is, the target adapter, the elastic draft, decoding,
training, acceptance scoring, prompt data and the built-in target.

Rooms, bottom to top (a room imports only those below it; `lint-imports` holds this):
`core` (no torch), `ops`, `data`, `builtin`, `target`, `draft`, `decoding`, `training`,
`acceptance`.
The names below are imported lazily so that light uses (specs, the run folder, the CLI's
--help) never pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "InputError": "dreams_nas.supernet.core.errors",
    "MissingArtefactError": "dreams_nas.supernet.core.errors",
    "SubnetSpec": "dreams_nas.supernet.core.spec",
    "SearchSpace": "dreams_nas.supernet.core.space",
    "SPEC_FIELDS": "dreams_nas.supernet.core.spec",
    "RunFolder": "dreams_nas.supernet.core.runfolder",
    "DEFAULT_RUN_DIR": "dreams_nas.supernet.core.runfolder",
    "library_versions": "dreams_nas.supernet.core.versions",
    "DraftConfig": "dreams_nas.supernet.draft.config",
    "DreamDraft": "dreams_nas.supernet.draft.model",
    "SharedTargetModules": "dreams_nas.supernet.draft.state",
    "CompactDraft": "dreams_nas.supernet.draft.extract",
    "extract": "dreams_nas.supernet.draft.extract",
    "load_supernet": "dreams_nas.supernet.draft.saving",
    "save_supernet": "dreams_nas.supernet.draft.saving",
    "read_supernet_config": "dreams_nas.supernet.draft.saving",
    "DreamDrafter": "dreams_nas.supernet.decoding.dream",
    "AifdResult": "dreams_nas.supernet.training.aifd",
    "TrainConfig": "dreams_nas.supernet.training.config",
    "train_supernet": "dreams_nas.supernet.training.tppt",
    "train_run": "dreams_nas.supernet.training.recipe",
    "SupernetRecipe": "dreams_nas.supernet.training.recipe",
    "TrainingSet": "dreams_nas.supernet.training.tppt",
    "resolve_target": "dreams_nas.supernet.builtin.resolve",
    "TargetAdapter": "dreams_nas.supernet.target.adapter",
    "PrefillOutput": "dreams_nas.supernet.target.adapter",
    "VerifyOutput": "dreams_nas.supernet.target.adapter",
    "Drafter": "dreams_nas.supernet.decoding.protocol",
    "Proposal": "dreams_nas.supernet.decoding.protocol",
    "OracleDrafter": "dreams_nas.supernet.decoding.drafters",
    "ReplayDrafter": "dreams_nas.supernet.decoding.drafters",
    "PromptLookupDrafter": "dreams_nas.supernet.decoding.drafters",
    "load_drafter": "dreams_nas.supernet.decoding.registry",
    "SamplingConfig": "dreams_nas.supernet.decoding.sampling",
    "logits_to_probs": "dreams_nas.supernet.decoding.sampling",
    "greedy_accept": "dreams_nas.supernet.decoding.sampling",
    "rejection_accept": "dreams_nas.supernet.decoding.sampling",
    "generate": "dreams_nas.supernet.decoding.loop",
    "plain_generate": "dreams_nas.supernet.decoding.loop",
    "GenerationResult": "dreams_nas.supernet.decoding.loop",
    "GenerationStats": "dreams_nas.supernet.decoding.loop",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


def __dir__() -> list[str]:
    return __all__
