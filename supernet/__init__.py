"""dreams_nas.supernet: what a subnet is, the target adapter, the elastic draft and decoding.

Names are imported lazily so that light uses (specs, the run folder, the CLI's --help)
never pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "InputError": ".errors",
    "MissingArtefactError": ".errors",
    "SubnetSpec": ".space",
    "SearchSpace": ".space",
    "SPEC_FIELDS": ".space",
    "RunFolder": ".runfolder",
    "DEFAULT_RUN_DIR": ".runfolder",
    "library_versions": ".versions",
    "DraftConfig": ".draft",
    "DreamDraft": ".draft",
    "SharedTargetModules": ".draft",
    "CompactDraft": ".extract",
    "extract": ".extract",
    "load_supernet": ".store",
    "save_supernet": ".store",
    "read_supernet_config": ".store",
    "DreamDrafter": ".dream_drafter",
    "AifdResult": ".aifd",
    "TrainConfig": ".train",
    "train_supernet": ".train",
    "train_run": ".training_run",
    "TargetAdapter": ".target",
    "PrefillOutput": ".target",
    "VerifyOutput": ".target",
    "Drafter": ".drafting",
    "Proposal": ".drafting",
    "OracleDrafter": ".drafting",
    "ReplayDrafter": ".drafting",
    "PromptLookupDrafter": ".drafting",
    "load_drafter": ".drafting",
    "SamplingConfig": ".sampling",
    "logits_to_probs": ".sampling",
    "greedy_accept": ".sampling",
    "rejection_accept": ".sampling",
    "generate": ".decoding",
    "plain_generate": ".decoding",
    "GenerationResult": ".decoding",
    "GenerationStats": ".decoding",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


def __dir__() -> list[str]:
    return __all__
