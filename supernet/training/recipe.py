"""`dreams-nas train` as a library call: data -> self-distillation -> AIFD -> TPPT -> run folder.

Writes `supernet/` (model.safetensors + config.json, `checkpoint/` for resume, the target's
answers `selfdistill.json` and features `features/`) and the run.json keys `target`, `space`,
`supernet` and `aifd` (SCHEMAS.md).

Memory does not grow with the prompts: a prompt's processor inputs (pixels included) are built
when a pass needs them (`PromptInputs`), and the target's features go to the run's feature
store (`store`) as they are computed; training reads them back a batch at a time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, overload

import torch
from dreams_nas.supernet.core.dist import current
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.io import atomic_write_json, read_json
from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.core.space import SearchSpace, default_draft_vocab, vocab_rows
from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.saving import save_supernet
from dreams_nas.supernet.draft.state import SharedTargetModules
from dreams_nas.supernet.target.adapter import TargetAdapter
from dreams_nas.supernet.training.aifd import AifdResult
from dreams_nas.supernet.training.convergence import HeldOut
from dreams_nas.supernet.training.feature_store import (
    DEFAULT_SHARD_SAMPLES,
    FeatureStore,
    build_store,
    store_key,
)
from dreams_nas.supernet.training.features import TargetSample
from dreams_nas.supernet.training.selfdistill import (
    collect_samples,
    measure_aifd,
    regenerate_answers,
)
from dreams_nas.supernet.training.tppt import TrainConfig, TrainOutcome, train_supernet
from dreams_nas.supernet.training.vocab import coverage, frequency_order
from torch import Tensor

log = logging.getLogger("dreams_nas")
# supernet/curve.csv: the losses of every step, held-out tau where evaluated (SCHEMAS.md)
CURVE_COLUMNS = ("step", "phase", "loss", "kl", "distill", "feat", "tau_full", "tau_smallest",
                 "score")
DistillMode = Literal["aifd", "middle", "last", "none"]
# The supernet `dreams-nas train` trains by default: the paper's single-size draft (one decoder
# layer a side, the whole MLP). Elastic depth and width (`--depth 3 --mlp 0.25,0.5,1`, the
# space's DEFAULT_DEPTHS and DEFAULT_MLP) widen the search's cost range past 3x, but on the demo
# target the weight sharing costs every subnet more acceptance than the search wins back
# (BENCHMARKS.md, 'Elastic depth and MLP width'), so it is a choice, not the default.
DEFAULT_DEPTH = 1
DEFAULT_MLP_SHARES: tuple[float, ...] = (1.0,)
ANSWER_BATCH = 8  # prompts the target answers in one left-padded batch


@dataclass(frozen=True)
class PreparedData:
    """Everything the trainer needs from the target, computed once. `samples`: a list in
    memory, or the run's `FeatureStore` (read per sample)."""

    samples: Sequence[TargetSample]
    aifd: AifdResult
    space: SearchSpace
    num_target_layers: int
    answers: tuple[Tensor, ...] = ()  # the self-distilled answers (the draft vocabulary's order)


class PromptInputs(Sequence[dict[str, Tensor]]):
    """Chat-templated model inputs (image first) of each example's question, built by
    `target.build_inputs` when an item is read (and not kept: read it once per pass), so that
    the pixels of all prompts are never held at once; a slice is another lazy sequence."""

    def __init__(self, target: TargetAdapter, examples: Sequence[Any]) -> None:
        self.target = target
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    @overload
    def __getitem__(self, item: int) -> dict[str, Tensor]: ...

    @overload
    def __getitem__(self, item: slice) -> PromptInputs: ...

    def __getitem__(self, item: int | slice) -> dict[str, Tensor] | PromptInputs:
        if isinstance(item, slice):
            return PromptInputs(self.target, self.examples[item])
        example = self.examples[item]
        return self.target.build_inputs(example.image_path, example.prompt)

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        for i in range(len(self)):
            yield self[i]


def prompt_inputs(target: TargetAdapter, examples: Sequence[Any]) -> PromptInputs:
    """Chat-templated model inputs (image first) for each example's question, built lazily."""
    return PromptInputs(target, examples)


def _answers_key(target: TargetAdapter, examples: Sequence[Any], max_new_tokens: int) -> str:
    digest = hashlib.sha256(json.dumps(
        {"target": str(target.path or target.target_id), "max_new_tokens": max_new_tokens,
         "dtype": str(target.dtype),
         "examples": [[str(ex.id), str(ex.image_path), ex.prompt] for ex in examples]}
    ).encode())
    return digest.hexdigest()[:16]


def self_distilled_answers(target: TargetAdapter, prompts: Sequence[Mapping[str, Tensor]],
                           key: str, cache_file: Any, max_new_tokens: int,
                           show_progress: bool | None) -> list[Tensor]:
    """The target's own answers, cached in the run folder (a resumed run does not regenerate).

    Several ranks (`dist.current()`) split the prompts by chunks of `ANSWER_BATCH` (the batches
    one process generates, so each answer is generated in the same left-padded batch as it
    would be alone); each rank caches its part beside `cache_file` until rank 0 has written
    the merged file."""
    world = current()
    cached = _cached_answers(cache_file, key)
    if cached is not None:
        return cached
    if not world.distributed:
        answers = regenerate_answers(target.model, prompts, max_new_tokens,
                                     batch_size=ANSWER_BATCH, show_progress=show_progress)
    else:
        chunks = [range(i, min(i + ANSWER_BATCH, len(prompts)))
                  for i in range(0, len(prompts), ANSWER_BATCH)]
        part = None if cache_file is None else Path(cache_file).with_name(
            f"{Path(cache_file).stem}.rank{world.rank}of{world.size}.json")
        mine = _cached_answers(part, key)
        if mine is None:
            rows = [i for c in world.mine(chunks) for i in c]
            mine = regenerate_answers(target.model, [prompts[i] for i in rows], max_new_tokens,
                                      batch_size=ANSWER_BATCH, show_progress=show_progress)
            if part is not None:
                atomic_write_json(part, {"key": key, "answers": [a.tolist() for a in mine]})
        parts = world.gather([a.tolist() for a in mine])
        by_chunk = [parts[j % world.size] for j in range(len(chunks))]
        offsets = [0] * world.size
        answers = []
        for j, chunk in enumerate(chunks):
            r = j % world.size
            got = by_chunk[j][offsets[r]: offsets[r] + len(chunk)]
            offsets[r] += len(chunk)
            answers += [torch.tensor(a, dtype=torch.long, device="cpu") for a in got]
    if cache_file is not None and world.is_main:
        atomic_write_json(cache_file, {"key": key, "answers": [a.tolist() for a in answers]})
        for stale in Path(cache_file).parent.glob(f"{Path(cache_file).stem}.rank*of*.json"):
            stale.unlink(missing_ok=True)
    return answers


def _cached_answers(cache_file: Any, key: str) -> list[Tensor] | None:
    if cache_file is None or not Path(cache_file).is_file():
        return None
    data = read_json(cache_file)
    if isinstance(data, dict) and data.get("key") == key:
        return [torch.tensor(a, dtype=torch.long, device="cpu") for a in data["answers"]]
    return None


def prepare_data(target: TargetAdapter, examples: Sequence[Any], *, num_draft_heads: int,
                 max_new_tokens: int = 64, aifd_prompts: int = 16,
                 answers_cache: Any = None, distill: Sequence[DistillMode] = ("aifd",),
                 feature_store: str | Path | None = None,
                 samples_per_shard: int = DEFAULT_SHARD_SAMPLES,
                 show_progress: bool | None = None) -> PreparedData:
    """Self-distilled answers, AIFD and the target's features of every prompt; `distill`:
    the distillation modes whose layers' features to keep (an ablation keeps several).

    feature_store: a folder for the features (`feature_store.build_store`: sharded, resumable, read per
    sample; `samples` is then a `FeatureStore`); None keeps them in memory (a list)."""
    if not examples:
        raise InputError("the training data hold no examples; give a JSONL file with at least one")
    prompts = prompt_inputs(target, examples)
    key = _answers_key(target, examples, max_new_tokens)
    answers = self_distilled_answers(target, prompts, key, answers_cache, max_new_tokens,
                                     show_progress)
    keep = [i for i, a in enumerate(answers) if a.numel() > 0]
    if not keep:
        raise InputError("the target answered none of the training prompts "
                         "(every answer is empty); check the target and the prompts")
    examples = [examples[i] for i in keep]
    prompts, answers = prompt_inputs(target, examples), [answers[i] for i in keep]
    n = max(1, min(aifd_prompts, len(prompts)))
    world = current()  # several ranks: rank 0 measures, the others take its result
    aifd = world.broadcast(measure_aifd(target.model, prompts[:n], answers[:n])
                           if world.is_main else None)
    layers = target.num_layers
    space = SearchSpace.default_for(layers, num_draft_heads)
    kept = sorted({i for mode in distill for i in mode_layers(mode, aifd, layers)})
    samples: Sequence[TargetSample]
    if feature_store is None and world.distributed:
        raise InputError("training with several ranks shares the target's features through "
                         "the run's feature store; give prepare_data a feature_store folder")
    if feature_store is None:
        samples = collect_samples(target, prompts, answers, space.inject_layer, kept,
                                  show_progress=show_progress)
    else:
        key = store_key(target, examples, answers, space.inject_layer, kept, samples_per_shard)
        samples = build_store(feature_store, target, prompts, answers, space.inject_layer, kept,
                              key, samples_per_shard=samples_per_shard,
                              show_progress=show_progress)
    return PreparedData(samples, aifd, space, layers, tuple(answers))


def default_holdout(n_samples: int) -> int:
    """Training prompts held out for the convergence check: an eighth, at most 32, none below
    8 prompts (too few to both train and judge)."""
    return min(32, n_samples // 8)


def split_heldout(samples: Sequence[TargetSample], holdout: int | None
                  ) -> tuple[Sequence[TargetSample], Sequence[TargetSample]]:
    """(training samples, held-out samples): the last `holdout` (None: `default_holdout`);
    slices of `samples` (of a `FeatureStore`: views, nothing read)."""
    n = default_holdout(len(samples)) if holdout is None else int(holdout)
    if n >= len(samples):
        raise InputError(f"--holdout {n} keeps all {len(samples)} prompts out of training; "
                         f"give fewer than {len(samples)} (or 0 to train to the step cap)")
    if n <= 0:
        return samples, samples[:0]
    return samples[:-n], samples[-n:]


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


def build_draft(target: TargetAdapter, data: PreparedData, *, num_heads: int, seed: int,
                cross_attention: bool = True, visual_in_self: bool = True,
                num_layers: int = 1, mlp_shares: Sequence[float] = (1.0,),
                vocab_shares: Sequence[float] = (1.0,),
                device: str | torch.device = "cpu") -> DreamDraft:
    cfg = DraftConfig.for_target(target.text_config, data.space.inject_layer, num_heads=num_heads,
                                 cross_attention=cross_attention, visual_in_self=visual_in_self,
                                 num_layers=num_layers, mlp_shares=tuple(mlp_shares),
                                 vocab_shares=tuple(vocab_shares))
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


def train_run(run: RunFolder, target: TargetAdapter, examples: Sequence[Any], config: TrainConfig,
              *, num_heads: int | None = None, max_new_tokens: int = 64, aifd_prompts: int = 16,
              distill: DistillMode = "aifd", device: str | torch.device = "cpu",
              holdout: int | None = None, show_progress: bool | None = None,
              data: PreparedData | None = None, cross_attention: bool = True,
              visual_in_self: bool = True, depth: int = 1,
              mlp: Sequence[float] = (1.0,),
              draft_vocab: Sequence[float] | None = None,
              samples_per_shard: int = DEFAULT_SHARD_SAMPLES) -> dict[str, Any]:
    """Train the supernet of `target` on `examples` into `run`; returns the command's summary.

    data: the prompts' target side when already prepared (`prepare_data` over `examples`
    with at least `distill`'s layers: a benchmark shares it between runs); cross_attention:
    False drops the cross-attention layer; visual_in_self: False keeps the visual tokens out of
    the draft's own sequence (`DraftConfig.visual_in_self`; with neither: text only);
    depth, mlp: the supernet's decoder layers on each side of the cross-attention and the MLP
    widths it trains (the search space's `depth` = 1..depth and `mlp`; the defaults train the
    paper's single-size draft); draft_vocab: the vocabulary shares the search may give the
    draft (None: `default_draft_vocab` of the target's vocabulary), ranked by the answers'
    token frequency (`supernet.training.vocab`; training itself uses the whole vocabulary).

    Without `data` the target's features go to the run's feature store `supernet/features/`
    (`store`), which the run keeps: a resumed or repeated training over the same prompts,
    answers and layers reads it instead of running the target again. Deleting the folder
    frees the disk; the next training recomputes it."""
    start = time.perf_counter()
    heads = int(num_heads or target.text_config.num_attention_heads)
    run.supernet_dir.mkdir(parents=True, exist_ok=True)
    if data is None:
        data = prepare_data(target, examples, num_draft_heads=heads,
                            max_new_tokens=max_new_tokens, aifd_prompts=aifd_prompts,
                            answers_cache=run.supernet_dir / "selfdistill.json",
                            distill=(distill,), feature_store=run.supernet_dir / "features",
                            samples_per_shard=samples_per_shard, show_progress=show_progress)
    log.info("AIFD: attention entropy per layer %s -> distillation layer(s) %s",
             [round(a, 3) for a in data.aifd.ae], list(data.aifd.chosen))
    layers = distill_layers_for(distill, data)
    vocab_size = int(target.text_config.vocab_size)
    shares = default_draft_vocab(vocab_size) if draft_vocab is None else tuple(draft_vocab)
    data = replace(data, space=replace(data.space, depth=tuple(range(1, int(depth) + 1)),
                                       mlp=tuple(mlp), draft_vocab=tuple(shares)))
    if distill == "none":
        config = replace(config, weights=replace(config.weights, distill=0.0))
    if config.unroll is None:  # the training-time test runs as deep as the space drafts
        config = replace(config, unroll=data.space.max_draft_len - 1)
    draft = build_draft(target, data, num_heads=heads, seed=config.seed,
                        cross_attention=cross_attention, visual_in_self=visual_in_self,
                        num_layers=depth, mlp_shares=data.space.mlp,
                        vocab_shares=data.space.draft_vocab, device=device)
    vocab = draft_vocabulary(draft, data)
    # fp32 master weights; the forward runs in the target's dtype under autocast
    dtype = str(target.dtype).removeprefix("torch.")
    train_samples, held = split_heldout(data.samples, holdout)
    heldout = (HeldOut(held, data.space.max_draft_len, max_new_tokens, target.eos_token_ids)
               if held else None)
    outcome: TrainOutcome = train_supernet(draft, train_samples, layers, config,
                                           run.supernet_dir / "checkpoint",
                                           show_progress=show_progress,
                                           compute_dtype=target.dtype, heldout=heldout)
    if isinstance(data.samples, FeatureStore):
        data.samples.close()  # unmap its shards (a later read would map them again)
    world = current()
    best = next((e for e in outcome.evals if e["step"] == outcome.best_step), None)
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
    supernet = {
        "hash": digest, "config": draft.config.to_dict(),
        "num_params": sum(p.numel() for p in draft.parameters()),  # every candidate's adapter
        "num_params_largest_subnet": draft.num_params(draft.config.largest()),
        "distill_layers": list(layers),
        "draft_vocab": vocab,
        "train": {"warmup_steps": config.warmup_steps, "multires_steps": config.multires_steps,
                  "batch_size": config.batch_size, "lr": config.lr,
                  "lambdas": {"kl": config.weights.kl, "distill": config.weights.distill,
                              "feat": config.weights.feat},
                  "n_samples": len(train_samples), "n_heldout": len(held),
                  "n_examples": len(examples),
                  "max_new_tokens": max_new_tokens, "distill": distill,
                  "config": config.to_dict(), "compute_dtype": dtype,
                  "master_dtype": "float32",
                  "seconds": round(time.perf_counter() - start, 1),
                  "loss_curve": outcome.loss_curve,
                  "convergence": {
                      "evals": outcome.evals, "best_step": outcome.best_step,
                      "best": best, "stopped": outcome.stopped, "steps": outcome.steps,
                      "draft_len": data.space.max_draft_len, "eval_every": config.eval_every,
                      "patience": config.patience, "tolerance": config.tolerance,
                      "max_seconds": config.max_seconds}},
    }
    run.update_run(target=target.describe(), space=data.space.to_dict(), supernet=supernet,
                   aifd=data.aifd.to_dict(), dtype=dtype)
    world.barrier()
    return _summary(run, supernet, outcome, config, data, layers, start)


def _summary(run: RunFolder, supernet: Mapping[str, Any], outcome: TrainOutcome,
             config: TrainConfig, data: PreparedData, layers: Sequence[int], start: float
             ) -> dict[str, Any]:
    """`dreams-nas train`'s summary."""
    best = next((e for e in outcome.evals if e["step"] == outcome.best_step), None)
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
