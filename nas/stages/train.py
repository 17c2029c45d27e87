"""The supernet stage as a library call: reuse the run's trained supernet, or train one.

`dreams-nas train` always trains (resuming a killed run); `dreams-nas search` and
`dreams-nas demo` call `ensure_supernet`, which trains with the default settings only when the
run folder holds no supernet weights at all. Weights that run.json does not record (truncated,
replaced, run.json lost) are refused, never trained over: only `dreams-nas train` overwrites.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from dreams_nas.supernet.core.runfolder import RunFolder

log = logging.getLogger("dreams_nas")
DEFAULT_TRAIN_PROMPTS = 384


@dataclass(frozen=True)
class TrainOptions:
    """The training settings a stage may change; None keeps `TrainConfig`'s default."""

    target: str = "builtin"  # builtin | hub id | checkpoint folder
    data: str = "builtin"  # builtin | FILE.jsonl
    n_train: int | None = None
    warmup_steps: int | None = None
    multires_steps: int | None = None
    batch_size: int | None = None
    unroll: int | None = None  # None: the space's deepest draft - 1 (`train_run`)
    lr: float | None = None
    inplace_distill: float | None = None
    ema_decay: float | None = None  # phase 2's weight average (TrainConfig.ema_decay)
    phase1_shallowest: bool | None = None  # TrainConfig.phase1_shallowest (elastic depth)
    phase2_shallowest: bool | None = None  # TrainConfig.phase2_shallowest (elastic depth)
    eval_every: int | None = None
    patience: int | None = None
    tolerance: float | None = None
    time_budget: float | None = None  # seconds of optimisation (TrainConfig.max_seconds)
    holdout: int | None = None  # held-out training prompts (None: `convergence.default_holdout`)
    lambda_kl: float | None = None
    lambda_distill: float | None = None
    lambda_feat: float | None = None
    distill: str = "aifd"  # aifd | middle | last | none
    heads: int | None = None  # heads of the maximal draft (None: the target's)
    visual_context: str = "self"  # self: kept visual tokens in the draft's own sequence too
    depth: int | None = None  # decoder layers a side of the largest draft (None: DEFAULT_DEPTH)
    mlp: tuple[float, ...] | None = None  # MLP widths trained (None: DEFAULT_MLP_SHARES)
    # draft vocabulary shares offered (None: `default_draft_vocab` of the target's vocabulary)
    draft_vocab: tuple[float, ...] | None = None
    max_new_tokens: int = 64
    device: str = "auto"
    dtype: str | None = None  # None/auto: the run's dtype, else auto (RunFolder.dtype)
    seed: int = 0
    show_progress: bool | None = None

    def sizes(self) -> tuple[int, tuple[float, ...]]:
        """(depth, MLP shares) of the supernet these options train."""
        from dreams_nas.supernet.training.recipe import DEFAULT_DEPTH, DEFAULT_MLP_SHARES

        depth = DEFAULT_DEPTH if self.depth is None else int(self.depth)
        shares = DEFAULT_MLP_SHARES if self.mlp is None else self.mlp
        return depth, tuple(sorted({float(x) for x in shares}))

    def vocab_shares(self) -> tuple[float, ...] | None:
        """The draft vocabulary shares asked for, sorted (None: the target's default)."""
        if self.draft_vocab is None:
            return None
        return tuple(sorted({float(x) for x in self.draft_vocab}))

    def config(self) -> Any:
        """The `TrainConfig` these options ask for (None keeps its default)."""
        from dreams_nas.supernet.training.batching import LossWeights
        from dreams_nas.supernet.training.config import TrainConfig

        base = TrainConfig()
        changes = {name: getattr(self, name) for name in
                   ("warmup_steps", "multires_steps", "batch_size", "lr", "unroll",
                    "inplace_distill", "ema_decay", "eval_every", "patience", "tolerance",
                    "phase1_shallowest", "phase2_shallowest")
                   if getattr(self, name) is not None}
        if self.time_budget is not None:
            changes["max_seconds"] = self.time_budget
        weights = LossWeights(
            kl=base.weights.kl if self.lambda_kl is None else self.lambda_kl,
            distill=base.weights.distill if self.lambda_distill is None else self.lambda_distill,
            feat=base.weights.feat if self.lambda_feat is None else self.lambda_feat)
        return replace(base, **changes, weights=weights, seed=self.seed)


def load_examples(data: str, n: int | None, seed: int) -> list[Any]:
    """The training prompts: the built-in synthetic train split or a LLaVA-style JSONL."""
    from dreams_nas.supernet.data.prompts import load_examples as _load

    return _load(data, "train", n, DEFAULT_TRAIN_PROMPTS, seed, "--n-train")


def trained_supernet(run: RunFolder) -> dict[str, Any] | None:
    """run.json's `supernet` block when its weights are on disk and match its hash; None when
    the run has no supernet weights (train one). Weights that do not match run.json (or with
    run.json gone) are an InputError, never a reason to train over them
    (`inputs.checked_supernet`)."""
    from dreams_nas.nas.stages.inputs import checked_supernet

    return checked_supernet(run)


def training_changes(block: dict[str, Any], options: TrainOptions) -> list[str]:
    """The asked training settings (steps, prompts, max_new_tokens) that differ from those the
    run's supernet was trained with, as "name recorded -> asked"; unknown ones are skipped."""
    trained = block.get("train") if isinstance(block.get("train"), dict) else {}
    config = options.config()
    prompts = options.n_train
    if prompts is None and options.data == "builtin":
        prompts = DEFAULT_TRAIN_PROMPTS
    asked = {"warmup_steps": config.warmup_steps, "multires_steps": config.multires_steps,
             "n_examples": prompts, "max_new_tokens": options.max_new_tokens}
    names = {"n_examples": "prompts"}
    changes = [f"{names.get(key, key)} {trained[key]} -> {value}" for key, value in asked.items()
               if value is not None and key in trained and trained[key] != value]
    draft = block.get("config") if isinstance(block.get("config"), dict) else None
    if draft is not None:
        recorded = "self" if draft["visual_in_self"] else "cross"
        if recorded != options.visual_context:
            changes.append(f"visual-context {recorded} -> {options.visual_context}")
        depth, shares = options.sizes()
        had_depth = draft["num_layers"]
        had_shares = tuple(float(x) for x in draft["mlp_shares"])
        if had_depth != depth:
            changes.append(f"depth {had_depth} -> {depth}")
        if had_shares != shares:
            changes.append(f"mlp {_shares(had_shares)} -> {_shares(shares)}")
        had_vocab = tuple(float(x) for x in draft.get("vocab_shares", (1.0,)))
        vocab = options.vocab_shares()
        if vocab is not None and had_vocab != vocab:
            changes.append(f"draft-vocab {_shares(had_vocab)} -> {_shares(vocab)}")
    return changes


def _shares(shares: tuple[float, ...]) -> str:
    return ",".join(f"{x:g}" for x in shares)


def retrain_command(run: RunFolder, options: TrainOptions) -> str:
    """The `dreams-nas train` call that trains `options`' supernet into `run` (overwriting)."""
    import shlex

    config = options.config()
    parts = ["dreams-nas", "train", "--run", str(run.root), "--target", options.target]
    if options.data != "builtin":
        parts += ["--data", options.data]
    if options.n_train is not None:
        parts += ["--n-train", str(options.n_train)]
    if options.visual_context != "self":
        parts += ["--visual-context", options.visual_context]
    from dreams_nas.supernet.training.recipe import DEFAULT_DEPTH, DEFAULT_MLP_SHARES

    depth, shares = options.sizes()
    if depth != DEFAULT_DEPTH:
        parts += ["--depth", str(depth)]
    if shares != tuple(DEFAULT_MLP_SHARES):
        parts += ["--mlp", _shares(shares)]
    if options.vocab_shares() is not None:
        parts += ["--draft-vocab", _shares(options.vocab_shares() or ())]
    parts += ["--warmup-steps", str(config.warmup_steps),
              "--multires-steps", str(config.multires_steps),
              "--max-new-tokens", str(options.max_new_tokens)]
    return shlex.join(parts)


def same_target(info: dict[str, Any], target: str, target_path: str | None) -> bool:
    """Whether run.json's target block describes `target` (loaded from `target_path`)."""
    if not info:
        return True
    if target_path is not None:
        from dreams_nas.supernet.builtin.resolve import same_folder

        return info.get("path") is not None and same_folder(str(info["path"]), target_path)
    return info.get("id") == target


def ensure_supernet(run: RunFolder, options: TrainOptions, *, target_path: str | None = None
                    ) -> tuple[dict[str, Any], bool]:
    """(summary, reused): the run's trained supernet, trained first when it is missing.

    `target_path` is the folder `options.target` loads from when known (the built-in target's
    cache folder); a run trained on another target is refused rather than overwritten.

    A supernet trained with other settings is reused all the same -- retraining would silently
    invalidate every acceptance row, profile and search of the run -- with a warning that names
    the differing settings and the command that retrains."""
    from dreams_nas.nas.stages.inputs import check_run_folder, other_target

    check_run_folder(run)
    block = trained_supernet(run)
    info = run.read_run().get("target") or {}
    if block is not None:
        if not same_target(info, options.target, target_path):
            raise other_target(run, str(info.get("path") or info.get("id")),
                               str(target_path or options.target),
                               rebuilt=info.get("id") == options.target)
        changes = training_changes(block, options)
        if changes:
            log.warning("warning: reusing the supernet in %s, trained with other settings (%s); "
                        "everything downstream was computed with it. To retrain with these "
                        "settings (which redoes scoring and search): `%s`", run.supernet_dir,
                        ", ".join(changes), retrain_command(run, options))
        return {"supernet": str(run.supernet_dir), "hash": block["hash"],
                "num_params": block.get("num_params")}, True
    config = options.config()
    examples = load_examples(options.data, options.n_train, options.seed)
    log.info("no trained supernet in %s: training one now on %d %s prompts (%d + %d steps, "
             "batch %d; `dreams-nas train` sets these)", run.supernet_dir, len(examples),
             options.data, config.warmup_steps, config.multires_steps, config.batch_size)
    return train(run, options, examples), False


def train(run: RunFolder, options: TrainOptions, examples: list[Any] | None = None
          ) -> dict[str, Any]:
    """Train the supernet of `options.target` into `run` (resuming a killed run); the summary.
    `examples`: the training prompts when already loaded (else read from `options.data`)."""
    from dreams_nas.nas.stages.inputs import check_run_folder
    from dreams_nas.supernet.core.device import resolve_device
    from dreams_nas.supernet.core.runlock import stage_lock

    check_run_folder(run)
    config = options.config()  # bad settings fail here, before the (slow) target load
    resolve_device(options.device)  # a device not here too: before the run folder is written
    with stage_lock(run.root, ["supernet"], "dreams-nas train"):
        return _train(run, options, config, examples)


def _train(run: RunFolder, options: TrainOptions, config: Any, examples: list[Any] | None
           ) -> dict[str, Any]:
    from dreams_nas.supernet.builtin.resolve import resolve_target
    from dreams_nas.supernet.core.device import resolve_device, torch_dtype
    from dreams_nas.supernet.core.dist import local_device
    from dreams_nas.supernet.target.adapter import TargetAdapter
    from dreams_nas.supernet.training.recipe import SupernetRecipe, train_run

    device = local_device(resolve_device(options.device))  # several ranks: one GPU each
    dtype = run.dtype(options.dtype, device)
    if examples is None:
        examples = load_examples(options.data, options.n_train, options.seed)
    where = resolve_target(options.target, show_progress=options.show_progress)
    target = TargetAdapter.load(where, target_id=options.target, device=device,
                                dtype=torch_dtype(dtype))
    depth, mlp = options.sizes()
    recipe = SupernetRecipe(num_heads=options.heads, depth=depth, mlp=mlp,
                            draft_vocab=options.vocab_shares(),
                            visual_in_self=options.visual_context == "self",
                            distill=options.distill,
                            max_new_tokens=options.max_new_tokens, holdout=options.holdout)
    return train_run(run, target, examples, config, recipe, device=device,
                     show_progress=options.show_progress)
