"""Latency predictor benchmark: profile the whole grid, fit on <= 30 %, predict the other >= 70 %.

    .venv/bin/python benchmarks/bench_latency.py [--target builtin|random-demo|PATH]
        [--clock wall|cpu] [--threads 1] [--repeats 30] [--train-fraction 0.3] [--out DIR]

1. Times every step of the grid on this CPU with `dreams-nas profile`'s library call (draft
   step of every (heads, visual_keep) subnet extracted from a supernet at every context length,
   the target's decode step and its verify step for k = 2..8), and reports the wall time taken.
2. Picks the training rows the way ``--budget 0.3`` would (a discrete Latin hypercube over
   heads x visual_keep x context with the largest and smallest subnets at every context; the
   same over k x context for the target steps, with k = 1 and 8 at the shortest and longest
   context), fits the predictor on them and predicts every other row, measured in the same run.
3. Prints MAPE, share within +-10 %, RMSE and Kendall's tau overall and per kind of step, and
   whether the targets hold (MAPE <= 5 %, >= 95 % within 10 %, tau >= 0.9), for the
   rows' medians and, on a shared machine, their 10th percentiles.

Target: ``builtin`` if the demo target is already cached, else ``random-demo``: the demo
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

import numpy as np
import pandas as pd


def random_demo_target(folder: Path) -> str:
    import torch
    from dreams_nas.supernet.demo.build import build_config, build_processor
    from dreams_nas.supernet.demo.variants import get_variant
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
    from dreams_nas.supernet.demo.build import build_processor
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
        from dreams_nas.supernet.demo.cache import demo_target_dir, read_complete_marker

        if read_complete_marker(demo_target_dir()) is not None:
            return str(demo_target_dir())
        print("builtin demo target not cached: using its architecture with random weights",
              file=sys.stderr)
        name = "random-demo"
    if name == "random-demo":
        return random_demo_target(scratch / "random-demo")
    if name == "random-wide":
        return random_wide_target(scratch / "random-wide")
    return name


def training_mask(rows: pd.DataFrame, fraction: float, seed: int) -> np.ndarray:
    """Rows a `--budget fraction` plan would have timed: LHS over each kind's grid + extremes."""
    from dreams_nas.latency.plan import latin_hypercube_grid

    rng = np.random.default_rng(seed)
    train = np.zeros(len(rows), dtype=bool)
    draft = rows.kind == "draft"
    first = rows.kind == "draft_first"  # the same points as draft, timed after a verify
    target = ~(draft | first)
    for mask, axes in ((draft, ("heads", "visual_keep", "context_len")),
                       (first, ("heads", "visual_keep", "context_len")),
                       (target, ("k", "context_len"))):
        if not mask.any():
            continue
        sub = rows[mask]
        levels = [sorted(set(sub[a])) for a in axes]
        index = {tuple(levels[i].index(v) for i, v in enumerate(vals)): j
                 for j, vals in zip(sub.index, sub[list(axes)].itertuples(index=False),
                                    strict=True)}
        top = tuple(len(v) - 1 for v in levels[:-1])
        anchors = [(*(0,) * (len(axes) - 1), c) for c in (0, len(levels[-1]) - 1)]
        anchors += [(*top, c) for c in (0, len(levels[-1]) - 1)]
        if mask is not target:  # largest and smallest subnet at every context, as the plan does
            anchors = [(*(0,) * 2, c) for c in range(len(levels[-1]))] + [
                (*top, c) for c in range(len(levels[-1]))]
        anchors = sorted(set(anchors) & set(index))
        n = int(np.floor(fraction * len(sub)))
        picks = anchors + latin_hypercube_grid([len(v) for v in levels], max(0, n - len(anchors)),
                                               rng, taken=anchors)
        train[[index[p] for p in picks if p in index]] = True
    return train


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
    parser.add_argument("--train-fraction", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="run folder to keep (default: a temp folder)")
    args = parser.parse_args(argv)

    from dreams_nas.latency.estimators import latency_metrics
    from dreams_nas.latency.predictor import LatencyPredictor
    from dreams_nas.latency.store import ProfileStore
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
    rows = ProfileStore(summary["profile"]).ok_rows()
    plan = json.loads((Path(summary["profile"]).parent / "plan.json").read_text())
    train = training_mask(rows, args.train_fraction, args.seed)
    assert train.mean() <= args.train_fraction + 1e-9
    print(f"hardware {summary['hardware_id']}  clock {args.clock}  threads {args.threads}  "
          f"repeats<= {args.repeats}  passes {args.passes}  chunk {args.chunk or 'all'}  "
          f"target {target}")
    print(f"grid: {len(rows)} rows ({(rows.kind == 'draft').sum()} draft, "
          f"{(rows.kind == 'draft_first').sum()} draft_first, "
          f"{(~rows.kind.isin(['draft', 'draft_first'])).sum()} target), "
          f"contexts {plan['context_lengths']}, "
          f"visual tokens {plan['visual_tokens']}")
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
    results = {"profile_s": round(profile_s, 1), "noise_floor": round(floor, 4)}
    for stat in ("median_ms", "p10_ms"):
        fit_start = time.perf_counter()
        pred = LatencyPredictor.fit(rows[train], summary["hardware_id"], stat=stat,
                                    visual_tokens=plan["visual_tokens"], holdout=0.0,
                                    seed=args.seed)
        fit_s = time.perf_counter() - fit_start
        hold = rows[~train]
        measured = hold[stat].to_numpy()
        predicted = pred.predict_rows(hold)
        report = {"overall": latency_metrics(measured, predicted)}
        for kind in ("draft", "draft_first", "decode", "verify"):
            sel = (hold.kind == kind).to_numpy()
            if sel.sum() > 1:
                report[kind] = latency_metrics(measured[sel], predicted[sel])
        overall = report["overall"]
        checks = {"mape<=5%": overall["mape"] <= 0.05,
                  "within10>=95%": overall["within_10pct"] >= 0.95,
                  "tau>=0.9": overall["kendall_tau"] >= 0.9}
        print(f"\n[{stat}] train {int(train.sum())} rows ({train.mean():.0%}), held out "
              f"{int((~train).sum())} ({(~train).mean():.0%}); regressor "
              f"{pred.report()['regressor']}; fit {fit_s:.1f} s")
        print(f"{'rows':<12}{'n':>5}{'MAPE':>9}{'within10':>10}{'RMSE ms':>10}{'tau':>7}"
              f"{'ms min..max':>16}")
        for name, m in report.items():
            sel = np.ones(len(hold), bool) if name == "overall" else (hold.kind == name).to_numpy()
            print(f"{name:<12}{int(sel.sum()):>5}{m['mape']:>9.2%}{m['within_10pct']:>10.1%}"
                  f"{m['rmse']:>10.3f}{m['kendall_tau']:>7.3f}"
                  f"{measured[sel].min():>8.2f}..{measured[sel].max():.2f}")
        print("targets: " + ", ".join(f"{k} {'PASS' if v else 'FAIL'}" for k, v in checks.items()))
        results[stat] = {k: {m: round(v, 4) for m, v in d.items()} for k, d in report.items()}
    print(json.dumps(results, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
