"""Latency predictor benchmark: profile the whole grid, fit on ~30 % of it, predict the rest.

    .venv/bin/python benchmarks/bench_latency.py [--target builtin|random-demo|PATH]
        [--clock wall|cpu] [--threads 1] [--repeats 30] [--train-fraction 0.3]
        [--tree-holdout 0] [--out DIR]

1. Times every step of the grid on this CPU with `dreams-nas profile`'s library call (draft
   step of every (heads, visual_keep, depth, mlp, draft_vocab) subnet extracted from a supernet
   at every context length, hot and right after a verify (draft_first), over each tree level's
   width for the largest and smallest subnet; the target's decode step, its verify step for
   k = 2..8 and its tree verify for each tree size), and reports the wall time taken.
2. Splits the rows by grid point (`latency.model.validation.grid_groups`: one draft architecture at
   one context with all its draft, draft_first and tree-level rows; one target (kind, k) at one
   context), never a point on both sides. Draft points: exactly those ``--budget 0.3`` would
   time (`latency.measure.plan.build_plan`: the largest and smallest subnets at every context, then
   a discrete Latin hypercube over the draft axes x context); as the plan always times the tree
   levels, draft_tree rows are all fitted on unless ``--tree-holdout`` moves a share of those points
   to the predicted side. Target points (a profile times them all): 70 % held out within each (kind,
   k), each keeping >= 2 contexts (`latency.model.validation.holdout_split`), since the predictor
   interpolates a target step per k from its own measurements. It fits the predictor on the training
   rows and predicts every other row, measured in the same run.
3. Prints MAPE, share within +-10 %, RMSE and Kendall's tau pooled and per kind of step
   (`latency.model.validation.metrics_by_kind`: draft, draft_tree, draft_first, decode, verify,
   verify_tree), and whether the pooled targets hold (MAPE <= 5 %, >= 95 % within 10 %,
   tau >= 0.9), for the rows' medians and, on a shared machine, their 10th percentiles; then
   one JSON line of it all.

Target: ``builtin`` if the built-in target is already cached, else ``random-demo``: the demo
target's exact architecture and processor with random weights (latency does not depend on the
weights' values, and building the trained target takes minutes). ``random-wide``: an
8-layer x 512-hidden LLaVA, wide enough that heads and visual tokens change a draft step's cost.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


def random_builtin_target(folder: Path) -> str:
    import torch
    from dreams_nas.supernet.builtin.build import build_config, build_processor
    from dreams_nas.supernet.builtin.variants import get_variant
    from transformers import LlavaForConditionalGeneration

    torch.manual_seed(0)
    processor = build_processor()
    model = LlavaForConditionalGeneration(build_config(get_variant("default"), processor.tokenizer))
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return str(folder)


def random_wide_target(folder: Path) -> str:
    """A LLaVA with an 8-layer x 512-hidden Llama (the engine benchmark's size), random weights:
    wide enough that a draft's heads and kept visual tokens visibly change its cost on a CPU."""
    import torch
    from dreams_nas.supernet.builtin.build import build_processor
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    torch.manual_seed(0)
    processor = build_processor()
    tok = processor.tokenizer
    text = LlamaConfig(vocab_size=len(tok), hidden_size=512, intermediate_size=1408,
                       num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
                       max_position_embeddings=1024, tie_word_embeddings=False)
    vision = CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                              num_attention_heads=2, image_size=48, patch_size=8)
    config = LlavaConfig(vision_config=vision, text_config=text,
                         image_token_id=tok.convert_tokens_to_ids("<image>"),
                         vision_feature_select_strategy="default", image_seq_length=36)
    LlavaForConditionalGeneration(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    return str(folder)


def pick_target(name: str, scratch: Path) -> str:
    if name == "builtin":
        from dreams_nas.supernet.builtin.cache import builtin_target_dir, read_complete_marker

        if read_complete_marker(builtin_target_dir()) is not None:
            return str(builtin_target_dir())
        print("builtin built-in target not cached: using its architecture with random weights",
              file=sys.stderr)
        name = "random-demo"
    if name == "random-demo":
        return random_builtin_target(scratch / "random-demo")
    if name == "random-wide":
        return random_wide_target(scratch / "random-wide")
    return name


def draft_points(rows: pd.DataFrame) -> list[tuple[int, float, int, float, float, int]]:
    """The draft grid point of each row, (heads, visual_keep, depth, mlp, draft_vocab,
    context_len); rows without a depth, mlp or draft_vocab column (profiled before it) are at
    1 there."""
    from dreams_nas.supernet.core.spec import SIZE_DEFAULTS

    def column(name: str) -> np.ndarray:
        if name in rows.columns:
            return pd.to_numeric(rows[name], errors="coerce").to_numpy(dtype=float)
        return np.full(len(rows), float(SIZE_DEFAULTS[name]))

    return [(int(h), round(float(v), 6), int(d), round(float(m), 6), round(float(n), 6), int(c))
            for h, v, d, m, n, c in zip(column("heads"), column("visual_keep"), column("depth"),
                                        column("mlp"), column("draft_vocab"),
                                        rows["context_len"].astype(int), strict=True)]


def plan_draft_points(rows: pd.DataFrame, fraction: float, seed: int) -> set[tuple]:
    """The draft grid points `dreams-nas profile --budget fraction --seed seed` times over the
    draft grid these rows span: `plan.build_plan`'s own choice (the largest and smallest subnet
    at every context, then a Latin hypercube over heads x visual_keep x depth x mlp x
    draft_vocab x context,
    ceil(fraction x grid) points in all), each point timed as draft and draft_first."""
    from dreams_nas.latency.kinds import DRAFT_KINDS
    from dreams_nas.latency.measure.plan import build_plan
    from dreams_nas.supernet.core.space import SearchSpace

    points = draft_points(rows[rows["kind"].isin(DRAFT_KINDS)])
    if not points:
        return set()
    heads, keeps, depths, mlps, vocabs, contexts = (sorted(set(axis))
                                                    for axis in zip(*points, strict=True))
    # inject_layer and draft_len do not change a step's cost, nor the plan's choice; a chain-only
    # space: the tree-level keys are not drawn, they are fixed (the extremes at every context)
    space = SearchSpace(heads=tuple(heads), visual_keep=tuple(keeps), inject_layer=(1,),
                        draft_len=(1,), depth=tuple(depths), mlp=tuple(mlps),
                        draft_vocab=tuple(vocabs))
    keys = build_plan(space, contexts, budget=fraction, seed=seed)
    return {(int(key.spec.heads), round(float(key.spec.visual_keep), 6), int(key.spec.depth),
             round(float(key.spec.mlp), 6), round(float(key.spec.draft_vocab), 6),
             int(key.context_len))
            for key in keys if key.kind == "draft" and key.k == 1}


def held_tree_points(rows: pd.DataFrame, share: float, rng: np.random.Generator) -> set[tuple]:
    """Draft grid points with tree-level rows to hold out whole: per subnet timed over tree
    levels (the largest and the smallest), round(share x its contexts) of its interior contexts
    (never its shortest or longest), so it keeps >= 2 contexts in training."""
    levels = rows[(rows["kind"] == "draft") & (rows["k"].astype(int) > 1)]
    by_arch: dict[tuple, list[int]] = {}
    for point in sorted(set(draft_points(levels))):
        by_arch.setdefault(point[:-1], []).append(point[-1])
    held: set[tuple] = set()
    for arch, contexts in sorted(by_arch.items()):
        interior = contexts[1:-1]
        n = min(len(interior), int(round(share * len(contexts))))
        if n > 0:
            held.update((*arch, int(c)) for c in rng.choice(interior, size=n, replace=False))
    return held


def training_mask(rows: pd.DataFrame, fraction: float, seed: int,
                  tree_holdout: float = 0.0) -> np.ndarray:
    """(rows,) True for the rows the predictor is fitted on, False for those it predicts.

    * Draft kinds: the grid points a ``--budget fraction`` plan times (`plan_draft_points`),
      whole -- a point's draft, draft_first and tree-level rows are on one side. The plan always
      times the tree levels of the largest and smallest subnet at every context, so their rows
      are all in training unless `tree_holdout` > 0 moves a share of those points (interior
      contexts only, `held_tree_points`) to the predicted side.
    * Target kinds (always all timed by a profile): `validation.holdout_split` over their grid
      points with 1 - fraction held out, within each (kind, k), every (kind, k) keeping at
      least 2 contexts in training -- the predictor interpolates a target step per k from its
      own measurements and refuses a k with none.
    """
    from dreams_nas.latency.kinds import DRAFT_KINDS
    from dreams_nas.latency.model.validation import holdout_split

    if not 0.0 < fraction < 1.0:
        raise ValueError(f"train fraction {fraction} must be in (0, 1)")
    if not 0.0 <= tree_holdout < 1.0:
        raise ValueError(f"tree holdout {tree_holdout} must be in [0, 1)")
    rows = rows.reset_index(drop=True)
    train = np.zeros(len(rows), dtype=bool)
    drafted = rows["kind"].isin(DRAFT_KINDS).to_numpy()
    if drafted.any():
        chosen = plan_draft_points(rows, fraction, seed)
        chosen -= held_tree_points(rows[drafted], tree_holdout, np.random.default_rng(seed))
        points = draft_points(rows[drafted])
        train[np.flatnonzero(drafted)] = [p in chosen for p in points]
    if (~drafted).any():
        target_train, _ = holdout_split(rows[~drafted], 1.0 - fraction, seed)
        train[np.flatnonzero(~drafted)] = target_train
    return train


def split_summary(rows: pd.DataFrame, train: np.ndarray) -> dict[str, int]:
    """Grid points and rows on each side of the split: draft points (each timed as draft,
    draft_first and, for the extremes, over tree levels) and target points."""
    from dreams_nas.latency.kinds import DRAFT_KINDS
    from dreams_nas.latency.model.validation import grid_groups

    groups = grid_groups(rows)
    drafted = rows["kind"].isin(DRAFT_KINDS).to_numpy()
    out: dict[str, int] = {"train_rows": int(train.sum()), "holdout_rows": int((~train).sum())}
    for name, sel in (("draft", drafted), ("target", ~drafted)):
        out[f"{name}_points"] = len(set(groups[sel]))
        out[f"{name}_points_train"] = len(set(groups[sel & train]))
    return out


def evaluate(rows: pd.DataFrame, train: np.ndarray, hardware_id: str, *,
             stat: str = "median_ms", visual_tokens: int = 0, seed: int = 0
             ) -> tuple[Any, dict[str, dict[str, float]]]:
    """Fit the predictor on rows[train] (its own hold-out off: the held-out rows are the rest)
    and predict rows[~train]: (predictor, {"overall": pooled metrics, metric kind: its
    metrics}), each `estimators.latency_metrics` (MAPE, RMSE, within 10 %, Kendall's tau) plus
    ``n``, the kinds `validation.metrics_by_kind`'s (draft, draft_tree, draft_first, decode,
    verify, verify_tree) that hold predicted rows."""
    from dreams_nas.latency.model.draft_regression import latency_metrics
    from dreams_nas.latency.model.predictor import LatencyPredictor
    from dreams_nas.latency.model.validation import metrics_by_kind

    pred = LatencyPredictor.fit(rows[train], hardware_id, stat=stat,
                                visual_tokens=visual_tokens, holdout=0.0, seed=seed)
    hold = rows[~train]
    measured = hold[stat].to_numpy(dtype=float)
    predicted = pred.predict_rows(hold)
    report = {"overall": {**latency_metrics(measured, predicted), "n": int(len(hold))},
              **metrics_by_kind(hold, measured, predicted)}
    return pred, report


def report_lines(rows: pd.DataFrame, train: np.ndarray, stat: str,
                 report: dict[str, dict[str, float]]) -> list[str]:
    """The metric table: pooled, then each metric kind (one with no predicted rows says so)."""
    from dreams_nas.latency.model.validation import METRIC_KINDS, metric_kinds

    kinds = metric_kinds(rows)
    measured = rows[stat].to_numpy(dtype=float)
    lines = [f"{'rows':<12}{'n':>5}{'MAPE':>9}{'within10':>10}{'RMSE ms':>10}{'tau':>7}"
             f"{'ms min..max':>16}"]
    for name in ("overall", *METRIC_KINDS):
        sel = ~train & (True if name == "overall" else kinds == name)
        m = report.get(name)
        if m is None:
            fitted = int((train & (kinds == name)).sum())
            if fitted:
                lines.append(f"{name:<12}{0:>5}  none predicted: all {fitted} rows in training")
            continue
        lines.append(f"{name:<12}{int(m['n']):>5}{m['mape']:>9.2%}{m['within_10pct']:>10.1%}"
                     f"{m['rmse']:>10.3f}{m['kendall_tau']:>7.3f}"
                     f"{measured[sel].min():>8.2f}..{measured[sel].max():.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="builtin")
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=100,
                        help="as `dreams-nas profile --repeats`")
    parser.add_argument("--passes", type=int, default=10, help="as `dreams-nas profile --passes`")
    parser.add_argument("--chunk", type=int, default=256,
                        help="steps interleaved together over the passes (0: the whole grid)")
    parser.add_argument("--train-fraction", type=float, default=0.3,
                        help="the --budget whose draft points are fitted on; the target's "
                        "points held out: 1 - this, each kind and k keeping >= 2 contexts")
    parser.add_argument("--tree-holdout", type=float, default=0.0,
                        help="share of the tree-level draft points (the largest and smallest "
                        "subnet, interior contexts) to predict rather than fit on, so draft_tree "
                        "is measured (default 0: exactly the plan's points, all fitted on)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="run folder to keep (default: a temp folder)")
    args = parser.parse_args(argv)

    if not 0.0 < args.train_fraction < 1.0:
        parser.error(f"--train-fraction {args.train_fraction} must be in (0, 1)")
    if not 0.0 <= args.tree_holdout < 1.0:
        parser.error(f"--tree-holdout {args.tree_holdout} must be in [0, 1)")

    from dreams_nas.latency.measure.profile_store import ProfileStore
    from dreams_nas.latency.model.validation import METRIC_KINDS, grid_groups, metric_kinds
    from dreams_nas.nas.stages.profile import ProfileOptions, profile
    from dreams_nas.supernet.core.runfolder import RunFolder

    scratch = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    run = RunFolder(args.out or scratch / "run")
    target = pick_target(args.target, scratch)
    start = time.perf_counter()
    summary = profile(run, ProfileOptions(target=target, device="cpu", threads=args.threads,
                                          clock=args.clock, repeats=args.repeats, holdout=0.0,
                                          passes=args.passes, chunk=args.chunk,
                                          seed=args.seed))
    profile_s = time.perf_counter() - start
    rows = ProfileStore(summary["profile"]).ok_rows().reset_index(drop=True)
    plan = json.loads((Path(summary["profile"]).parent / "plan.json").read_text())
    train = training_mask(rows, args.train_fraction, args.seed, args.tree_holdout)
    groups = grid_groups(rows)
    assert not set(groups[train]) & set(groups[~train]), "a grid point straddles the split"
    split = split_summary(rows, train)
    print(f"hardware {summary['hardware_id']}  clock {args.clock}  threads {args.threads}  "
          f"repeats<= {args.repeats}  passes {args.passes}  chunk {args.chunk or 'all'}  "
          f"target {target}")
    kinds = metric_kinds(rows)
    counts = ", ".join(f"{int((kinds == k).sum())} {k}" for k in METRIC_KINDS if (kinds == k).any())
    print(f"grid: {len(rows)} rows ({counts}), "
          f"contexts {plan['context_lengths']}, "
          f"visual tokens {plan['visual_tokens']}")
    print(f"split: draft points {split['draft_points_train']}/{split['draft_points']} in training "
          f"(as --budget {args.train_fraction:g} --seed {args.seed} plans them"
          f"{f', tree levels {args.tree_holdout:g} held out' if args.tree_holdout else ''}), "
          f"target points {split['target_points_train']}/{split['target_points']} "
          "(every kind and k keeps >= 2 contexts); no grid point on both sides")
    spread = (rows.p90_ms / rows.p10_ms).median()
    print(f"profile: {summary.get('measured', 0)} steps timed "
          f"({summary.get('resumed', 0)} resumed) in {profile_s:.1f} s wall; "
          f"median p90/p10 spread of a row's samples {spread:.3f}")
    halves = []
    for text in rows.samples_ms:
        samples = np.array([float(v) for v in str(text).split()])
        if len(samples) >= 4:
            a, b = np.median(samples[0::2]), np.median(samples[1::2])
            halves.append(abs(a - b) / np.median(samples))
    floor = float(np.mean(halves)) if halves else float("nan")
    print(f"noise floor: two halves of a row's own samples differ by {floor:.2%} on average "
          "(a predictor cannot be more exact than its measurements)")
    results: dict[str, Any] = {"profile_s": round(profile_s, 1), "noise_floor": round(floor, 4),
                               "split": split}
    for stat in ("median_ms", "p10_ms"):
        fit_start = time.perf_counter()
        pred, report = evaluate(rows, train, summary["hardware_id"], stat=stat,
                                visual_tokens=plan["visual_tokens"], seed=args.seed)
        fit_s = time.perf_counter() - fit_start
        overall = report["overall"]
        checks = {"mape<=5%": overall["mape"] <= 0.05,
                  "within10>=95%": overall["within_10pct"] >= 0.95,
                  "tau>=0.9": overall["kendall_tau"] >= 0.9}
        print(f"\n[{stat}] train {int(train.sum())} rows ({train.mean():.0%}), held out "
              f"{int((~train).sum())} ({(~train).mean():.0%}); regressor "
              f"{pred.report()['regressor']}; fit + predict {fit_s:.1f} s")
        print("\n".join(report_lines(rows, train, stat, report)))
        print("targets: " + ", ".join(f"{k} {'PASS' if v else 'FAIL'}" for k, v in checks.items()))
        results[stat] = {name: {m: v if m == "n" else round(v, 4) for m, v in d.items()}
                         for name, d in report.items()}
    print(json.dumps(results, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
