"""The built-in target's variants: sizes and training recipe of each, and which one
`--target builtin` means."""

from __future__ import annotations

import os
from dataclasses import dataclass

from dreams_nas.supernet.builtin.training import (
    TargetTrainConfig,
)
from dreams_nas.supernet.core.errors import InputError

# Bump when the data, the architecture or the recipe changes: old cache folders are then ignored.
BUILTIN_VERSION = "builtin-v6"
# Which variant `--target builtin` means; for tests only (`tiny`), unset for real use.
VARIANT_ENV = "DREAMS_NAS_DEMO_VARIANT"
REQUIRED_EXACT_MATCH = 0.95


@dataclass(frozen=True)
class DemoSizes:
    """`dreams-nas demo`'s stage sizes on a variant, for the flags not given. None keeps the real
    pipeline's (`nas.stages.demo.DemoOptions` and `TrainConfig` hold them)."""

    train_prompts: int | None = None  # --train-prompts
    train_steps: int | None = None  # --train-steps: each of the two supernet training phases
    profile_budget: int | None = None  # --profile-budget: draft measurements of the profile
    profile_repeats: int | None = None  # --repeats: timed repeats per profiled step
    limit: int | None = None  # --limit: evaluation prompts scored
    max_new_tokens: int | None = None  # --max-new-tokens: when training, scoring, verifying
    verify_prompts: int | None = None  # --verify-prompts: prompts decoded to verify


@dataclass(frozen=True)
class BuiltinVariant:
    """Sizes and training recipe of one built-in target variant."""

    name: str
    vision_hidden: int
    vision_layers: int
    vision_heads: int
    text_hidden: int
    text_layers: int
    text_heads: int
    text_intermediate: int
    train: TargetTrainConfig
    n_eval: int
    timing_repeats: int
    # Progressive depth: train a `grow_from_layers`-layer Llama with `train`, grow it to
    # `text_layers` (function-preserving, see `grow_text_layers`), then fine-tune with `finetune`.
    grow_from_layers: int = 0
    finetune: TargetTrainConfig | None = None
    # Training runs data parallel over this many local processes (`builtin.parallel`), which
    # share the build's torch threads: the small model's step gains nothing from a second
    # thread, and a second process doubles the steps per second on two cores.
    build_ranks: int = 1
    # The demo's stage sizes on this variant (`dreams-nas demo` with DREAMS_NAS_DEMO_VARIANT)
    demo: DemoSizes = DemoSizes()


# Chart reading takes the most steps to learn, then scenes (telling four shapes apart at 8 x 8
# pixels), counting and arithmetic; OCR the fewest. Of every ten training samples: chart 3,
# scene, count and math 2 each, OCR 1 (validation and evaluation stay uniform over the tasks).
DEFAULT_TASK_MIX = ("scene", "count", "chart", "math", "scene", "count", "chart", "math", "ocr",
                    "chart")

# Weight of the auxiliary per-cell loss (`builtin.training.CellPatterns`) in the first training
# stage. It supervises what every image cell holds, where the answers name only a few cells.
CELL_AUX_WEIGHT = 0.5

VARIANTS: dict[str, BuiltinVariant] = {
    # 16 layers x 128 hidden: every layer costs about the same fixed time at batch 1, so the
    # three-layer draft costs well under a third of a target step (measured at build time).
    # Trained as a 4-layer model (a third of the cost per sample), grown to 16 layers
    # function-preservingly, then fine-tuned as a whole. It stops when validation exact match
    # reaches 1.00: a shorter cosine schedule built faster, but its target answered less exactly
    # and the supernets trained on it spread several times wider in tau over seeds.
    "default": BuiltinVariant(
        name="default", vision_hidden=128, vision_layers=1, vision_heads=2, text_hidden=128,
        text_layers=16, text_heads=4, text_intermediate=384,
        train=TargetTrainConfig(max_steps=2400, batch_size=32, lr=3e-3, warmup_steps=30,
                          eval_every=100, n_val=100, target_exact_match=0.995,
                          task_mix=DEFAULT_TASK_MIX, cell_aux_weight=CELL_AUX_WEIGHT),
        n_eval=250, timing_repeats=40, grow_from_layers=4,
        finetune=TargetTrainConfig(max_steps=40, batch_size=32, lr=5e-4, warmup_steps=5,
                             eval_every=40, n_val=100, target_exact_match=1.01),
        build_ranks=2),
    # A small same-family model for HF assisted generation (`assistant_model=`) in the peer
    # benchmark: the default's vision tower, processor and width, 2 text layers, trained on the
    # same synthetic data with the default's first-stage recipe, shorter and without growth
    # (about a minute on 2 cores).
    "assistant": BuiltinVariant(
        name="assistant", vision_hidden=128, vision_layers=1, vision_heads=2, text_hidden=128,
        text_layers=2, text_heads=4, text_intermediate=384,
        train=TargetTrainConfig(max_steps=400, batch_size=32, lr=3e-3, warmup_steps=30,
                          eval_every=50, n_val=100, target_exact_match=0.99,
                          task_mix=DEFAULT_TASK_MIX, cell_aux_weight=CELL_AUX_WEIGHT),
        n_eval=100, timing_repeats=10, build_ranks=2),
    # The same code at test size: builds in seconds, answers are not expected to be right. Its
    # demo runs every stage at a size to match (about 30 s on 2 quiet cores, its build
    # included): a supernet trained 20 + 20 steps on 16 prompts, a profile of 16 draft
    # measurements at 3 repeats, 4 evaluation prompts of 16 new tokens.
    "tiny": BuiltinVariant(
        name="tiny", vision_hidden=16, vision_layers=1, vision_heads=2, text_hidden=32,
        text_layers=2, text_heads=2, text_intermediate=64,
        train=TargetTrainConfig(max_steps=6, batch_size=4, lr=3e-3, warmup_steps=2, eval_every=3,
                          n_val=4, target_exact_match=1.01, cell_aux_weight=CELL_AUX_WEIGHT),
        n_eval=8, timing_repeats=3, grow_from_layers=1,
        finetune=TargetTrainConfig(max_steps=2, batch_size=4, lr=1e-3, warmup_steps=1, eval_every=2,
                             n_val=4, target_exact_match=1.01),
        demo=DemoSizes(train_prompts=16, train_steps=20, profile_budget=16, profile_repeats=3,
                       limit=4, max_new_tokens=16, verify_prompts=2)),
}


def get_variant(name: str) -> BuiltinVariant:
    if name not in VARIANTS:
        raise InputError(f"built-in target variant {name!r} is unknown; pick one of "
                         f"{list(VARIANTS)}")
    return VARIANTS[name]


def builtin_variant() -> str:
    """The variant `builtin` resolves to: ``$DREAMS_NAS_DEMO_VARIANT`` (tests set ``tiny``),
    else ``default``."""
    name = os.environ.get(VARIANT_ENV) or "default"
    get_variant(name)
    return name
