"""What each training step trains on: its samples and its subnets, a function of (seed, step).

Every random choice of step `s` -- the batch order, the subnets, each row's feature noise -- comes
from generators seeded with (seed, s), so a run restored from a checkpoint continues exactly like
an uninterrupted one, and every data-parallel rank draws the same subnets.
"""

from __future__ import annotations

import torch
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.training.config import TrainConfig


def _step_generator(seed: int, step: int, salt: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + step) * 7 + salt)


def batch_indices(num_samples: int, batch_size: int, seed: int, step: int) -> list[int]:
    """Sample indices of step `step`: epochs are seeded permutations, the tail is dropped."""
    per_epoch = max(1, num_samples // batch_size)
    epoch, offset = divmod(step, per_epoch)
    gen = _step_generator(seed, epoch, salt=1)
    perm = torch.randperm(num_samples, generator=gen, device=gen.device)
    size = min(batch_size, num_samples)
    return perm[offset * size: offset * size + size].tolist()


def training_space(model: DreamDraft) -> SearchSpace:
    """The subnets training visits (draft_len is inference-only, fixed to 1 here)."""
    space = model.space()
    return SearchSpace(heads=space.heads, visual_keep=space.visual_keep,
                       inject_layer=space.inject_layer, draft_len=(1,), depth=space.depth,
                       mlp=space.mlp)


def step_specs(model: DreamDraft, space: SearchSpace, step: int, config: TrainConfig
               ) -> list[SubnetSpec]:
    """Phase 1: the full draft at a random layer (with elastic depth and
    `config.phase1_shallowest`, also its one-layer form at that layer). Phase 2: largest,
    smallest, random ones (with elastic depth and `config.phase2_shallowest`, then the
    largest's one-layer form)."""
    gen = _step_generator(config.seed, step, salt=2)
    layers = space.inject_layer

    def layer() -> int:
        return layers[int(torch.randint(len(layers), (1,), generator=gen, device=gen.device))]

    largest = SubnetSpec(max(space.heads), max(space.visual_keep), layer(), 1,
                         depth=max(space.depth), mlp=max(space.mlp))
    if step < config.warmup_steps:
        if config.phase1_shallowest and min(space.depth) < largest.depth:
            return [largest, largest.replace(depth=min(space.depth))]
        return [largest]
    smallest = SubnetSpec(min(space.heads), min(space.visual_keep), layer(), 1,
                          depth=min(space.depth), mlp=min(space.mlp))
    everything = list(space.enumerate())
    picks = torch.randint(len(everything), (config.random_subnets,), generator=gen,
                          device=gen.device).tolist()
    specs = [largest, smallest, *(everything[i] for i in picks)]
    if config.phase2_shallowest and min(space.depth) < largest.depth:
        specs.append(largest.replace(depth=min(space.depth)))
    return specs


def noise_seed(seed: int, step: int, subnet: int, sample: int) -> int:
    """The seed of one sample's feature noise for one subnet of one step (`row_noise`)."""
    return ((seed * 1_000_003 + step) * 1_000_033 + sample) * 64 + subnet + 11
