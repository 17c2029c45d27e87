"""The tiny LLaVA target's self-distilled training samples and a supernet draft for it, shared
by the training tests."""

from __future__ import annotations

from typing import Any

from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.state import SharedTargetModules
from dreams_nas.supernet.target.adapter import TargetAdapter
from dreams_nas.supernet.training.selfdistill import (
    collect_samples,
    measure_aifd,
    regenerate_answers,
)

from _support.models import build_tiny_llava, tiny_prompts

LAYERS = (1, 2, 4)


def tiny_target_data(n_prompts: int = 12) -> tuple[Any, list[Any], Any]:
    """(target, samples, aifd): the tiny target's greedy answers to `n_prompts` prompts as
    training samples over `LAYERS`, and the AIFD measurement they were collected with."""
    target = build_tiny_llava()
    prompts = tiny_prompts(n_prompts)
    answers = regenerate_answers(target, prompts, max_new_tokens=8, show_progress=False)
    aifd = measure_aifd(target, prompts[:4], answers[:4])
    adapter = TargetAdapter.from_model(target)
    samples = collect_samples(adapter, prompts, answers, LAYERS, aifd.chosen, show_progress=False)
    return target, samples, aifd


def tiny_supernet(target: Any, seed: int = 0) -> DreamDraft:
    """An initialised supernet draft for the tiny target (reading `LAYERS`)."""
    shared = SharedTargetModules(target.get_input_embeddings(), target.lm_head)
    cfg = DraftConfig.for_target(target.config.text_config, LAYERS)
    return DreamDraft.initialised(cfg, shared, seed)


class Killed(Exception):
    """Raised from `on_step`, as a kill would end a run half-way."""


def killed_then_resumed(target: Any, samples: Any, aifd: Any, config: Any, folder: Any,
                        heldout: Any, kill_at: int) -> tuple[DreamDraft, Any]:
    """Train in `folder` until step `kill_at` ends the run, then resume it with a draft of
    another init (the checkpoint overrides it): (the resumed draft, its outcome)."""
    import pytest
    from dreams_nas.supernet.training.tppt import TrainingSet, train_supernet

    def kill(step: int, _losses: Any) -> None:
        if step == kill_at:
            raise Killed

    with pytest.raises(Killed):
        train_supernet(tiny_supernet(target), TrainingSet(samples, aifd.chosen, heldout), config,
                       folder, on_step=kill, show_progress=False)
    resumed = tiny_supernet(target, seed=5)
    outcome = train_supernet(resumed, TrainingSet(samples, aifd.chosen, heldout), config, folder,
                             show_progress=False)
    return resumed, outcome
