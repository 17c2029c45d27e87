"""`dreams-nas train` as a library call: data -> self-distillation -> AIFD -> TPPT -> run folder.

`train_run` takes what to train (`SupernetRecipe`: the supernet's sizes, its distillation, the
data's budget) beside how to optimise it (`config.TrainConfig`). It writes `supernet/`
(model.safetensors + config.json, `checkpoint/` for resume, the target's answers
`selfdistill.json` and features `features/`) and the run.json keys `target`, `space`,
`supernet` and `aifd` (SCHEMAS.md).

Memory does not grow with the prompts: a prompt's processor inputs (pixels included) are built
when a pass needs them (`selfdistill.PromptInputs`), and the target's features go to the run's
feature store (`feature_store`) as they are computed; training reads them back a batch at a
time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from dreams_nas.supernet.core.dist import current
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.io import read_json
from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.core.space import SearchSpace, default_draft_vocab, vocab_rows
from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.saving import save_supernet
from dreams_nas.supernet.draft.state import SharedTargetModules
from dreams_nas.supernet.target.adapter import TargetAdapter
from dreams_nas.supernet.training.aifd import AifdResult
from dreams_nas.supernet.training.config import TrainConfig
from dreams_nas.supernet.training.convergence import HeldOut, split_heldout
from dreams_nas.supernet.training.feature_store import (
    DEFAULT_SHARD_SAMPLES,
    FeatureStore,
    StoreLayout,
    build_store,
    store_key,
)
from dreams_nas.supernet.training.features import TargetSample
from dreams_nas.supernet.training.selfdistill import (
    answers_key,
    collect_samples,
    measure_aifd,
    prompt_inputs,
    self_distilled_answers,
)
from dreams_nas.supernet.training.tppt import TrainingSet, TrainOutcome, train_supernet
from dreams_nas.supernet.training.vocab import coverage, frequency_order
from torch import Tensor

log = logging.getLogger("dreams_nas")
# supernet/curve.csv: the losses of every step, held-out tau where evaluated (SCHEMAS.md)
CURVE_COLUMNS = ("step", "phase", "loss", "kl", "distill", "feat", "tau_full", "tau_smallest",
                 "score")
DistillMode = Literal["aifd", "middle", "last", "none"]
# The supernet `dreams-nas train` trains by default: the paper's single-size draft (one decoder
# layer a side, the whole MLP). Elastic depth and width (`--depth 3 --mlp 0.25,0.5,1`, the
# space's DEFAULT_DEPTHS and DEFAULT_MLP) widen the search's cost range, but on the built-in
# target the weight sharing costs every subnet more acceptance than the search wins back
# (BENCHMARKS.md, 'Acceptance of the elastic supernet's subnets'), so it is a choice, not the
# default.
DEFAULT_DEPTH = 1
DEFAULT_MLP_SHARES: tuple[float, ...] = (1.0,)


@dataclass(frozen=True)
class SupernetRecipe:
    """What `train_run` trains, and on how much of the target's data (`TrainConfig`: how).

    num_heads:       the draft's attention heads (None: the target's).
    depth:           decoder layers on each side of the cross-attention; the search space's
                     `depth` is 1..depth.
    mlp:             the MLP widths trained (the space's `mlp`); the defaults train the paper's
                     single-size draft.
    draft_vocab:     the vocabulary shares the search may give the draft (None:
                     `default_draft_vocab` of the target's vocabulary), ranked by the answers'
                     token frequency (`supernet.training.vocab`; training itself uses the whole
                     vocabulary).
    cross_attention: False drops the cross-attention layer.
    visual_in_self:  False keeps the visual tokens out of the draft's own sequence
                     (`DraftConfig.visual_in_self`; with neither: text only).
    distill:         whose features supervise the cross block: the AIFD layers, the middle or
                     last layer, or none.
    max_new_tokens:  the budget of the target's self-distilled answers.
    aifd_prompts:    the prompts AIFD measures attention entropy on.
    holdout:         training prompts held out for the convergence check (None:
                     `convergence.default_holdout`).
    samples_per_shard: prompts per shard of the feature store.
    """

    num_heads: int | None = None
    depth: int = DEFAULT_DEPTH
    mlp: tuple[float, ...] = DEFAULT_MLP_SHARES
    draft_vocab: tuple[float, ...] | None = None
    cross_attention: bool = True
    visual_in_self: bool = True
    distill: DistillMode = "aifd"
    max_new_tokens: int = 64
    aifd_prompts: int = 16
    holdout: int | None = None
    samples_per_shard: int = DEFAULT_SHARD_SAMPLES

    def __post_init__(self) -> None:
        object.__setattr__(self, "mlp", tuple(self.mlp))
        if self.draft_vocab is not None:
            object.__setattr__(self, "draft_vocab", tuple(self.draft_vocab))

    def heads_for(self, target: TargetAdapter) -> int:
        """The draft's attention heads on `target`."""
        return int(self.num_heads or target.text_config.num_attention_heads)

    def space_for(self, space: SearchSpace, target: TargetAdapter) -> SearchSpace:
        """`space` (the prepared data's) with this recipe's sizes: depth 1..`depth`, the MLP
        widths and the draft vocabularies."""
        vocab = (default_draft_vocab(int(target.text_config.vocab_size))
                 if self.draft_vocab is None else self.draft_vocab)
        return replace(space, depth=tuple(range(1, int(self.depth) + 1)), mlp=self.mlp,
                       draft_vocab=tuple(vocab))


@dataclass(frozen=True)
class PreparedData:
    """Everything the trainer needs from the target, computed once. `samples`: a list in
    memory, or the run's `FeatureStore` (read per sample)."""

    samples: Sequence[TargetSample]
    aifd: AifdResult
    space: SearchSpace
    num_target_layers: int
    answers: tuple[Tensor, ...] = ()  # the self-distilled answers (the draft vocabulary's order)


def prepare_data(target: TargetAdapter, examples: Sequence[Any], recipe: SupernetRecipe, *,
                 distill: Sequence[DistillMode] | None = None, answers_cache: Any = None,
                 feature_store: str | Path | None = None,
                 show_progress: bool | None = None) -> PreparedData:
    """Self-distilled answers, AIFD and the target's features of every prompt, as `recipe`
    budgets them; `distill`: the distillation modes whose layers' features to keep (an ablation
    keeps several; None: the recipe's).

    answers_cache: a JSON file caching the answers (`selfdistill.self_distilled_answers`);
    feature_store: a folder for the features (`feature_store.build_store`: sharded, resumable,
    read per sample; `samples` is then a `FeatureStore`); None keeps them in memory (a list)."""
    if not examples:
        raise InputError("the training data hold no examples; give a JSONL file with at least one")
    prompts = prompt_inputs(target, examples)
    answers = self_distilled_answers(target, prompts,
                                     answers_key(target, examples, recipe.max_new_tokens),
                                     answers_cache, recipe.max_new_tokens, show_progress)
    keep = [i for i, a in enumerate(answers) if a.numel() > 0]
    if not keep:
        raise InputError("the target answered none of the training prompts "
                         "(every answer is empty); check the target and the prompts")
    examples = [examples[i] for i in keep]
    prompts, answers = prompt_inputs(target, examples), [answers[i] for i in keep]
    n = max(1, min(recipe.aifd_prompts, len(prompts)))
    world = current()  # several ranks: rank 0 measures, the others take its result
    aifd = world.broadcast(measure_aifd(target.model, prompts[:n], answers[:n])
                           if world.is_main else None)
    layers = target.num_layers
    space = SearchSpace.default_for(layers, recipe.heads_for(target))
    kept = sorted({i for mode in (distill or (recipe.distill,))
                   for i in mode_layers(mode, aifd, layers)})
    samples: Sequence[TargetSample]
    if feature_store is None and world.distributed:
        raise InputError("training with several ranks shares the target's features through "
                         "the run's feature store; give prepare_data a feature_store folder")
    if feature_store is None:
        samples = collect_samples(target, prompts, answers, space.inject_layer, kept,
                                  show_progress=show_progress)
    else:
        per_shard = recipe.samples_per_shard
        layout = StoreLayout(store_key(target, examples, answers, space.inject_layer, kept,
                                       per_shard), space.inject_layer, kept, per_shard)
        samples = build_store(feature_store, target, prompts, answers, layout,
                              show_progress=show_progress)
    return PreparedData(samples, aifd, space, layers, tuple(answers))


def mode_layers(mode: DistillMode, aifd: AifdResult, num_layers: int) -> tuple[int, ...]:
    """The target layers whose features supervise the draft's cross block in `mode`."""
    if mode == "aifd":
        return tuple(aifd.chosen)
    if mode == "middle":
        return (max(1, num_layers // 2),)
    if mode == "last":
        return (num_layers,)
    if mode == "none":
        return ()
    raise InputError(f"distillation mode {mode!r} is not one of aifd, middle, last, none")


def distill_layers_for(mode: DistillMode, data: PreparedData) -> tuple[int, ...]:
    return mode_layers(mode, data.aifd, data.num_target_layers)


def build_draft(target: TargetAdapter, data: PreparedData, recipe: SupernetRecipe, *,
                seed: int, device: str | torch.device = "cpu") -> DreamDraft:
    """An initialised supernet of `recipe`'s heads, layers, MLP widths and vocabulary shares
    (`SupernetRecipe.space_for` over `data.space`), attached to `target`."""
    space = recipe.space_for(data.space, target)
    cfg = DraftConfig.for_target(target.text_config, space.inject_layer,
                                 num_heads=recipe.heads_for(target),
                                 cross_attention=recipe.cross_attention,
                                 visual_in_self=recipe.visual_in_self,
                                 num_layers=max(space.depth), mlp_shares=tuple(space.mlp),
                                 vocab_shares=tuple(space.draft_vocab))
    shared = SharedTargetModules(target.embed_tokens, target.lm_head)
    return DreamDraft.initialised(cfg, shared, seed).to(device)


def draft_vocabulary(draft: DreamDraft, data: PreparedData) -> dict[str, Any] | None:
    """Rank the target's tokens by the answers' frequency for a draft offering vocabulary
    shares below 1 (`supernet.training.vocab`); what run.json records of it (None: the whole
    vocabulary only)."""
    cfg = draft.config
    if not cfg.has_vocab_order:
        return None
    if not data.answers:
        raise InputError("a draft vocabulary is ranked by the self-distilled answers; these "
                         "prepared data hold none (prepare them with `prepare_data`)")
    order = frequency_order(data.answers, cfg.vocab_size)
    draft.set_vocab_order(order)
    rows = {f"{s:g}": vocab_rows(cfg.vocab_size, s) for s in cfg.vocab_shares}
    cover = {k: round(coverage(data.answers, order, n), 4) for k, n in rows.items()}
    log.info("draft vocabulary: shares %s = %s tokens cover %s of the answers' tokens",
             list(rows), list(rows.values()), list(cover.values()))
    return {"shares": list(cfg.vocab_shares), "tokens": rows, "answer_coverage": cover,
            "answer_tokens": int(sum(int(a.numel()) for a in data.answers))}


def train_run(run: RunFolder, target: TargetAdapter, examples: Sequence[Any],
              config: TrainConfig, recipe: SupernetRecipe | None = None, *,
              device: str | torch.device = "cpu", show_progress: bool | None = None,
              data: PreparedData | None = None) -> dict[str, Any]:
    """Train the supernet `recipe` describes (None: the default one) of `target` on `examples`
    into `run`, optimised as `config` says; returns the command's summary.

    data: the prompts' target side when already prepared (`prepare_data` over `examples`
    with at least the recipe's distillation layers: a benchmark shares it between runs).
    Without it the target's features go to the run's feature store `supernet/features/`,
    which the run keeps: a resumed or repeated training over the same prompts, answers and
    layers reads it instead of running the target again. Deleting the folder frees the disk;
    the next training recomputes it."""
    start = time.perf_counter()
    recipe = recipe or SupernetRecipe()
    run.supernet_dir.mkdir(parents=True, exist_ok=True)
    if data is None:
        data = prepare_data(target, examples, recipe,
                            answers_cache=run.supernet_dir / "selfdistill.json",
                            feature_store=run.supernet_dir / "features",
                            show_progress=show_progress)
    log.info("AIFD: attention entropy per layer %s -> distillation layer(s) %s",
             [round(a, 3) for a in data.aifd.ae], list(data.aifd.chosen))
    layers = distill_layers_for(recipe.distill, data)
    data = replace(data, space=recipe.space_for(data.space, target))
    config = _settled(config, recipe, data.space)
    draft = build_draft(target, data, recipe, seed=config.seed, device=device)
    vocab = draft_vocabulary(draft, data)
    train_samples, held = split_heldout(data.samples, recipe.holdout)
    heldout = (HeldOut(held, data.space.max_draft_len, recipe.max_new_tokens,
                       target.eos_token_ids) if held else None)
    # fp32 master weights; the forward runs in the target's dtype under autocast
    outcome = train_supernet(draft, TrainingSet(train_samples, layers, heldout), config,
                             run.supernet_dir / "checkpoint", show_progress=show_progress,
                             compute_dtype=target.dtype)
    if isinstance(data.samples, FeatureStore):
        data.samples.close()  # unmap its shards (a later read would map them again)
    world = current()
    best = outcome.best
    if outcome.stopped and world.is_main:
        log.info("training stopped at step %d of %d (%s); keeping step %s (held-out tau %s)",
                 outcome.steps, config.total_steps, outcome.stopped, outcome.best_step,
                 best and best.get("score"))
    if not world.is_main:  # rank 0 writes the run's files; every rank returns its summary
        world.barrier()
        return _summary(run, read_json(run.run_json)["supernet"], outcome, config, data,
                        layers, start)
    write_curve(run.supernet_dir / "curve.csv", outcome)
    digest = save_supernet(draft, run.supernet_dir, extra={"distill_layers": list(layers)})
    counts = {"n_samples": len(train_samples), "n_heldout": len(held),
              "n_examples": len(examples)}
    supernet = {
        "hash": digest, "config": draft.config.to_dict(),
        "num_params": sum(p.numel() for p in draft.parameters()),  # every candidate's adapter
        "num_params_largest_subnet": draft.num_params(draft.config.largest()),
        "distill_layers": list(layers),
        "draft_vocab": vocab,
        "train": _train_record(config, recipe, outcome, counts, str(target.dtype), start,
                               data.space.max_draft_len),
    }
    run.update_run(target=target.describe(), space=data.space.to_dict(), supernet=supernet,
                   aifd=data.aifd.to_dict(), dtype=str(target.dtype).removeprefix("torch."))
    world.barrier()
    return _summary(run, supernet, outcome, config, data, layers, start)


def _settled(config: TrainConfig, recipe: SupernetRecipe, space: SearchSpace) -> TrainConfig:
    """`config` as this recipe trains: no distillation weight without distillation layers, and
    the training-time test as deep as the space drafts when `config.unroll` is None."""
    if recipe.distill == "none":
        config = replace(config, weights=replace(config.weights, distill=0.0))
    if config.unroll is None:
        config = replace(config, unroll=space.max_draft_len - 1)
    return config


def _train_record(config: TrainConfig, recipe: SupernetRecipe, outcome: TrainOutcome,
                  counts: Mapping[str, int], dtype: str, start: float, draft_len: int
                  ) -> dict[str, Any]:
    """run.json's `supernet.train` (SCHEMAS.md)."""
    best = outcome.best
    return {"warmup_steps": config.warmup_steps, "multires_steps": config.multires_steps,
            "batch_size": config.batch_size, "lr": config.lr,
            "lambdas": {"kl": config.weights.kl, "distill": config.weights.distill,
                        "feat": config.weights.feat},
            **counts,
            "max_new_tokens": recipe.max_new_tokens, "distill": recipe.distill,
            "config": config.to_dict(), "compute_dtype": dtype.removeprefix("torch."),
            "master_dtype": "float32",
            "seconds": round(time.perf_counter() - start, 1),
            "loss_curve": outcome.loss_curve,
            "convergence": {
                "evals": outcome.evals, "best_step": outcome.best_step,
                "best": best, "stopped": outcome.stopped, "steps": outcome.steps,
                "draft_len": draft_len, "eval_every": config.eval_every,
                "patience": config.patience, "tolerance": config.tolerance,
                "max_seconds": config.max_seconds}}


def _summary(run: RunFolder, supernet: Mapping[str, Any], outcome: TrainOutcome,
             config: TrainConfig, data: PreparedData, layers: Sequence[int], start: float
             ) -> dict[str, Any]:
    """`dreams-nas train`'s summary."""
    best = outcome.best
    last = outcome.loss_curve[-1] if outcome.loss_curve else {}
    return {"supernet": str(run.supernet_dir), "hash": supernet["hash"],
            "num_params": supernet["num_params"], "aifd_chosen": list(data.aifd.chosen),
            "distill_layers": list(layers), "steps": outcome.steps,
            "max_steps": config.total_steps, "stopped": outcome.stopped,
            "best_step": outcome.best_step,
            "heldout_tau": best and best.get("score"),
            "resumed_from": outcome.resumed_from, "final_loss": last.get("loss"),
            "final_kl": last.get("kl"), "n_samples": len(data.samples),
            "seconds": round(time.perf_counter() - start, 1)}


def write_curve(path: Any, outcome: TrainOutcome) -> None:
    """The training curve as CSV: one row per step (losses), held-out tau where evaluated."""
    import csv
    import io

    from dreams_nas.supernet.core.io import atomic_write_text

    evals = {e["step"]: e for e in outcome.evals}
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CURVE_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for row in outcome.loss_curve:
        writer.writerow({**row, **{k: v for k, v in evals.get(row["step"], {}).items()
                                   if k in ("tau_full", "tau_smallest", "score")}})
    atomic_write_text(path, buffer.getvalue())


def draft_for_run(target: TargetAdapter, run: RunFolder, device: str | torch.device = "cpu"
                  ) -> DreamDraft:
    """The trained supernet of `run`, attached to `target`'s embedding and LM head, in the
    target's dtype (its fp32 master weights cast once: the draft is deployed, scored and
    extracted in the dtype it was profiled in)."""
    from dreams_nas.supernet.draft.saving import load_supernet

    shared = SharedTargetModules(target.embed_tokens, target.lm_head)
    return load_supernet(run.require_supernet(), shared, device=device).to(target.dtype)
