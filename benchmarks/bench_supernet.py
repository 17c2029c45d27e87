"""Supernet benchmark: `dreams-nas train` over seeds, and the ablations, with intervals.

    python benchmarks/bench_supernet.py --seeds 3 --jobs 2 [--variants ours,middle,...]
                                        [--out bench-supernet] [--threads 1]
                                        [--seed-list 3,4] [--multires-steps N]
                                        [--n-eval 256 --eval-seed 1]

For each seed s in 0..K-1 the training prompts `dreams-nas train --seed s` uses on the demo
target (384 synthetic prompts drawn with seed s) are prepared once (self-distilled answers,
AIFD, the target's features), then every variant trains through `train_run` -- the code of
`dreams-nas train` -- with the default settings and seed s:

  ours           the default: distillation from the AIFD-chosen layer, the kept visual
                 tokens in the draft's own sequence and in its cross-attention memory
  memory-only    the kept visual tokens in the cross-attention memory only (the draft's own
                 sequence is text: `--visual-context cross`)
  self-only      no cross-attention: the kept visual tokens in the draft's own sequence only
                 (the inject layer then changes nothing but the distillation)
  middle         distillation from the fixed middle layer
  last           distillation from the last layer
  no-distill     no feature distillation
  text-only      no image at all: no cross-attention, no visual tokens in the draft's own
                 sequence (and no distillation: nothing to distil into)
  random-keep    visual tokens kept by random scores instead of the attention they receive
                 (the scores are replaced in training and evaluation alike; only the smallest
                 subnet, which keeps a quarter, can tell)
  natural-heads  no head ranking before phase 2 (heads keep their natural order)

Each supernet is scored teacher-forced (at temperature 0 this is the tau of real speculative
decoding; tests check it) on the demo's 32 evaluation prompts: the largest and the smallest
subnet at draft_len = 5, inject layer in the middle of the space. Per variant: the mean over seeds
with a 95 % t-interval and the spread (max - min) / mean; against ours, a paired t-test over
seeds and a Wilcoxon signed-rank test over the (seed, prompt) pairs of per-prompt tau.

`--n-eval N --eval-seed S` scores on N evaluation prompts drawn with seed S instead (the 32
prompts' pooled tau is coarse: one drafting cycle more on a 20-token answer moves that
prompt's tau by 1.0-1.5). The results of such an evaluation go to their own files, and a
training already done for the default evaluation is scored again, not retrained. Each result
also holds the full subnet's tau per synthetic task (eval prompt i is task i mod 5) and the
opening of the cross-attention's gate (tanh of it; 0: closed).

Jobs run in `--jobs` processes of `--threads` threads, the default's seeds first; each job's
result is a JSON file in `--out` and each training checkpoints in its run folder, so a killed
benchmark resumes where it stopped (a resumed job's `train_s` counts its last attempt only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

VARIANTS = ("ours", "memory-only", "self-only", "middle", "last", "no-distill", "text-only",
            "random-keep", "natural-heads")
GAMMA = 5
N_EVAL = 32  # the demo's evaluation prompts (seed 0): the default evaluation


def _target():
    from dreams_nas.supernet.builtin.cache import ensure_builtin_target_with_metrics
    from dreams_nas.supernet.builtin.variants import builtin_variant
    from dreams_nas.supernet.target.adapter import TargetAdapter

    folder, _, _ = ensure_builtin_target_with_metrics(variant=builtin_variant(), progress=False)
    return TargetAdapter.load(str(folder))


def _random_scores(items, seed: int):
    """The items (samples or traces) with their visual scores replaced by uniform noise."""
    import torch

    gen = torch.Generator().manual_seed(10_007 + seed)
    out = []
    for item in items:
        noise = torch.rand(item.visual_scores.shape, generator=gen)
        out.append(replace(item, visual_scores=torch.where(item.visual_mask, noise,
                                                           torch.zeros_like(noise))))
    return out


def eval_tag(n_eval: int, eval_seed: int) -> str:
    """'' for the default evaluation, else a suffix naming it (traces and result files)."""
    return "" if (n_eval, eval_seed) == (N_EVAL, 0) else f"-eval-n{n_eval}-s{eval_seed}"


def prepare(out: Path, seeds: list[int], threads: int, n_train: int | None = None,
            n_eval: int = N_EVAL, eval_seed: int = 0) -> None:
    """The evaluation traces and each seed's training data, once (skipped when on disk)."""
    import torch
    from dreams_nas.nas.stages.train import load_examples
    from dreams_nas.supernet.acceptance.teacher_forced import TeacherForcedScorer
    from dreams_nas.supernet.data.prompts import builtin_dataset
    from dreams_nas.supernet.training.recipe import SupernetRecipe, build_draft, prepare_data
    from dreams_nas.supernet.training.selfdistill import prompt_inputs

    torch.set_num_threads(threads)
    target = _target()
    heads = int(target.text_config.num_attention_heads)
    for seed in seeds:
        path = out / f"data-s{seed}.pt"
        if path.is_file():
            continue
        start = time.perf_counter()
        data = prepare_data(target, load_examples("builtin", n_train, seed),
                            SupernetRecipe(num_heads=heads), distill=("aifd", "middle", "last"),
                            show_progress=False)
        torch.save(data, path)
        print(f"seed {seed}: prepared in {time.perf_counter() - start:.0f} s", flush=True)
    traces = out / f"traces{eval_tag(n_eval, eval_seed)}.pt"
    if not traces.is_file():
        start = time.perf_counter()
        data = torch.load(out / f"data-s{seeds[0]}.pt", weights_only=False)
        prompts = prompt_inputs(target, builtin_dataset("eval", n_eval, seed=eval_seed))
        scorer = TeacherForcedScorer(target, build_draft(target, data,
                                                         SupernetRecipe(num_heads=heads), seed=0),
                                     prompts, supernet_hash="-", dataset_id="-",
                                     show_progress=False)
        torch.save(scorer.traces(), traces)
        print(f"{n_eval} evaluation traces (seed {eval_seed}) in "
              f"{time.perf_counter() - start:.0f} s", flush=True)


def per_prompt_tau(draft, traces, spec) -> list[tuple[int, int]]:
    """(tokens, target verify forwards) per prompt of a draft_len chain of `spec`."""
    from dreams_nas.supernet.acceptance.teacher_forced import batched_ranks
    from dreams_nas.supernet.decoding.cycles import accepted_levels, simulate_cycles

    ranks = batched_ranks(draft, traces, spec, (1,) * spec.draft_len)
    out = []
    for trace, rank in zip(traces, ranks, strict=True):
        lengths, _ = simulate_cycles(accepted_levels(rank, (1,) * spec.draft_len),
                                     spec.draft_len, trace.max_new_tokens, trace.eos_index)
        out.append((sum(lengths), len(lengths)))
    return out


def run_job(out: str, variant: str, seed: int, threads: int, steps: str | None = None,
            overrides: dict | None = None, n_train: int | None = None, n_eval: int = N_EVAL,
            eval_seed: int = 0, seed_shift: int = 0, depth: int = 1,
            mlp: tuple[float, ...] = (1.0,)) -> dict:
    """Train one variant on seed `seed`'s prompts and score it; the result is also written to
    disk. `overrides`: TrainConfig fields set to other values; `seed_shift`: the training's own
    seed (initialisation, batches, subnets, held-out slice) is seed + seed_shift; `depth`, `mlp`:
    an elastic supernet (`dreams-nas train --depth --mlp`), whose full subnet is the deepest
    with the whole MLP and smallest the shallowest at the narrowest; with depth > 1 the
    one-layer subnet (all heads and visual tokens, the whole MLP) is scored too. A training
    done for the default evaluation is only scored again on another."""
    import torch
    from dreams_nas.nas.stages.train import load_examples
    from dreams_nas.supernet.core.runfolder import RunFolder
    from dreams_nas.supernet.core.spec import SubnetSpec
    from dreams_nas.supernet.training.config import TrainConfig
    from dreams_nas.supernet.training.recipe import SupernetRecipe, draft_for_run, train_run

    torch.set_num_threads(threads)
    root = Path(out)
    target = _target()
    data = torch.load(root / f"data-s{seed}.pt", weights_only=False)
    tag = eval_tag(n_eval, eval_seed)
    traces = torch.load(root / f"traces{tag}.pt", weights_only=False)
    config = replace(TrainConfig(seed=seed + seed_shift), **(overrides or {}))
    if steps:  # smoke runs only: the benchmark is the default settings
        warmup, multires = (int(x) for x in steps.split(","))
        config = replace(config, warmup_steps=warmup, multires_steps=multires, eval_every=2)
    distill, cross, in_self = "aifd", True, True
    if variant in ("middle", "last"):
        distill = variant
    elif variant == "memory-only":
        in_self = False
    elif variant == "self-only":
        cross = False
    elif variant == "no-distill":
        distill = "none"
    elif variant == "text-only":
        distill, cross, in_self = "none", False, False
    elif variant == "random-keep":
        data = replace(data, samples=_random_scores(data.samples, seed))
        traces = _random_scores(traces, seed)
    elif variant == "natural-heads":
        config = replace(config, sort_heads=False)
    elif variant != "ours":
        raise SystemExit(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")
    run = RunFolder(root / "runs" / f"{variant}-s{seed}")
    trained = root / f"result-{variant}-s{seed}.json"
    if tag and trained.is_file():  # trained for the default evaluation: score it again
        result = {k: v for k, v in json.loads(trained.read_text()).items()
                  if k in ("variant", "seed", "train_s", "steps", "stopped", "best_step",
                           "heldout_tau")}
    else:
        start = time.perf_counter()
        recipe = SupernetRecipe(distill=distill, cross_attention=cross, visual_in_self=in_self,
                                depth=depth, mlp=mlp)
        summary = train_run(run, target, load_examples("builtin", n_train, seed), config,
                            recipe, data=data, show_progress=False)
        result = {"variant": variant, "seed": seed,
                  "train_s": round(time.perf_counter() - start, 1), "steps": summary["steps"],
                  "stopped": summary["stopped"], "best_step": summary["best_step"],
                  "heldout_tau": summary["heldout_tau"]}
    draft = draft_for_run(target, run)
    space = data.space
    layer = space.inject_layer[len(space.inject_layer) // 2]
    result["n_eval"], result["eval_seed"] = len(traces), eval_seed
    gate = getattr(getattr(draft, "cross", None), "attn_gate", None)
    result["cross_gate"] = None if gate is None else float(torch.tanh(gate.detach()).item())
    subnets = [("full", max(space.heads), max(space.visual_keep), depth, 1.0),
               ("smallest", min(space.heads), min(space.visual_keep), 1, min(mlp))]
    if depth > 1:
        subnets.append(("one_layer", max(space.heads), max(space.visual_keep), 1, 1.0))
    for name, heads, keep, d, m in subnets:
        spec = SubnetSpec(heads, keep, layer, GAMMA, depth=d, mlp=m)
        pairs = per_prompt_tau(draft, traces, spec)
        result[f"tau_{name}"] = sum(t for t, _ in pairs) / sum(c for _, c in pairs)
        result[f"prompts_{name}"] = [t / c for t, c in pairs]
        if name == "full":
            result["tau_full_by_task"] = by_task(pairs)
    (root / f"result-{variant}-s{seed}{tag}.json").write_text(json.dumps(result))
    tasks = ", ".join(f"{t} {v:.2f}" for t, v in result["tau_full_by_task"].items())
    one = f", one layer {result['tau_one_layer']:.3f}" if depth > 1 else ""
    print(f"{variant} seed {seed}: tau full {result['tau_full']:.3f} ({tasks}){one}, smallest "
          f"{result['tau_smallest']:.3f} ({result['train_s']:.0f} s, {result['steps']} steps, "
          f"{result['stopped'] or 'step cap'})", flush=True)
    return result


def by_task(pairs: list[tuple[int, int]]) -> dict[str, float]:
    """Pooled tau per synthetic task (the builtin set's prompt i is task i mod len(TASKS))."""
    from dreams_nas.supernet.data.synth import TASKS

    out = {}
    for k, task in enumerate(TASKS):
        mine = pairs[k::len(TASKS)]
        if mine:
            out[task] = sum(t for t, _ in mine) / sum(c for _, c in mine)
    return out


def interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and its 95 % t-interval."""
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


def summarise(results: list[dict], variants: list[str], seeds: list[int]) -> dict:
    from scipy import stats

    by = {(r["variant"], r["seed"]): r for r in results}
    table = {}
    for variant in variants:
        rows = [by[(variant, s)] for s in seeds if (variant, s) in by]
        if not rows:
            continue
        entry = {"seeds": [r["seed"] for r in rows], "train_s": [r["train_s"] for r in rows],
                 "steps": [r["steps"] for r in rows]}
        for name in ("full", "smallest"):
            values = [r[f"tau_{name}"] for r in rows]
            mean, lo, hi = interval(values)
            entry[name] = {"values": values, "mean": mean, "lo": lo, "hi": hi,
                           "spread_pct": 100 * (max(values) - min(values)) / mean}
            base = [by[("ours", r["seed"])] for r in rows if ("ours", r["seed"]) in by]
            if variant != "ours" and len(base) == len(rows) and len(rows) >= 2:
                ours = [b[f"tau_{name}"] for b in base]
                entry[name]["delta"] = mean - statistics.fmean(ours)
                entry[name]["p_seeds"] = float(stats.ttest_rel(values, ours).pvalue)
                diffs = [a - b for r, b0 in zip(rows, base, strict=True)
                         for a, b in zip(r[f"prompts_{name}"], b0[f"prompts_{name}"],
                                         strict=True)]
                nonzero = [d for d in diffs if d != 0]
                entry[name]["p_prompts"] = (float(stats.wilcoxon(nonzero).pvalue)
                                            if nonzero else 1.0)
        table[variant] = entry
    return table


def markdown(table: dict) -> str:
    lines = ["| variant | tau full, mean [95 % CI] | per seed | spread | vs ours | p (t, seeds) "
             "| p (Wilcoxon, prompts) | tau smallest, mean [95 % CI] | train s |",
             "|---|---|---|---:|---:|---:|---:|---|---:|"]
    for variant, e in table.items():
        f, s = e["full"], e["smallest"]
        lines.append(
            f"| {variant} | {f['mean']:.3f} [{f['lo']:.3f}, {f['hi']:.3f}] | "
            + ", ".join(f"{v:.3f}" for v in f["values"])
            + f" | {f['spread_pct']:.1f} % | "
            + (f"{f['delta']:+.3f}" if "delta" in f else "-") + " | "
            + (f"{f['p_seeds']:.3f}" if "p_seeds" in f else "-") + " | "
            + (f"{f['p_prompts']:.3g}" if "p_prompts" in f else "-") + " | "
            + f"{s['mean']:.3f} [{s['lo']:.3f}, {s['hi']:.3f}] | "
            + f"{statistics.median(e['train_s']):.0f} |")
    return "\n".join(lines)


def train_overrides(pairs: list[str]) -> dict:
    """`--set FIELD=VALUE` pairs -> TrainConfig fields, each VALUE parsed as its field's type;
    ValueError naming the pair and the fix when it is not one."""
    from dataclasses import fields

    from dreams_nas.supernet.training.config import TrainConfig

    kinds = {f.name: type(getattr(TrainConfig(), f.name)) for f in fields(TrainConfig)
             if isinstance(getattr(TrainConfig(), f.name), (int, float, bool))}
    out: dict = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in kinds or name == "seed":
            raise ValueError(f"--set {pair!r} is not FIELD=VALUE with FIELD one of "
                             f"{', '.join(sorted(set(kinds) - {'seed'}))}")
        kind = kinds[name]
        try:
            out[name] = (value.lower() in ("1", "true", "yes")) if kind is bool else kind(value)
        except ValueError:
            raise ValueError(f"--set {pair!r}: {value!r} is not a {kind.__name__}") from None
    try:
        replace(TrainConfig(), **out)
    except Exception as err:  # the config's own check (InputError), named as it words it
        raise ValueError(f"--set: {err}") from None
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..K-1 (default 3)")
    parser.add_argument("--seed-list", default=None, metavar="S,S,...",
                        help="these seeds instead of 0..K-1 (e.g. 3,4 to add two seeds)")
    parser.add_argument("--multires-steps", type=int, default=None, metavar="N",
                        help="cap phase 2 at N steps instead of the default (evaluated as usual)")
    parser.add_argument("--ema-decay", type=float, default=None, metavar="D",
                        help="phase 2's weight average at decay D instead of the default "
                             "(0: none)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a TrainConfig field at another value (repeatable), e.g. "
                             "--set weight_decay=0.1 --set warmup_steps=500")
    parser.add_argument("--seed-shift", type=int, default=0, metavar="K",
                        help="train with seed s+K on seed s's prompts (data and training "
                             "randomness crossed; default 0)")
    parser.add_argument("--depth", type=int, default=1, metavar="N",
                        help="decoder layers a side of the cross-attention, elastic 1..N "
                             "(default 1: the single-size draft)")
    parser.add_argument("--mlp", default="1", metavar="S,S,...",
                        help="MLP width shares of an elastic supernet (default 1: whole)")
    parser.add_argument("--n-train", type=int, default=None, metavar="N",
                        help="training prompts per seed instead of the default (384)")
    parser.add_argument("--n-eval", type=int, default=N_EVAL, metavar="N",
                        help=f"evaluation prompts (default {N_EVAL}, the demo's)")
    parser.add_argument("--eval-seed", type=int, default=0, metavar="S",
                        help="seed the evaluation prompts are drawn with (default 0, the demo's)")
    parser.add_argument("--variants", default="all",
                        help=f"comma-separated, or all: {','.join(VARIANTS)}")
    parser.add_argument("--jobs", type=int, default=2, help="trainings at once (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per job")
    parser.add_argument("--out", default="bench-supernet", help="folder of data and results")
    parser.add_argument("--train-steps", default=None, metavar="WARMUP,MULTIRES",
                        help="smoke runs only (the benchmark is the default settings)")
    args = parser.parse_args()
    variants = list(VARIANTS) if args.variants == "all" else args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        print(f"error: unknown variant(s) {unknown}; use {','.join(VARIANTS)}", file=sys.stderr)
        return 2
    try:
        seeds = ([int(x) for x in args.seed_list.split(",")] if args.seed_list
                 else list(range(args.seeds)))
    except ValueError:
        print(f"error: --seed-list {args.seed_list!r} is not a comma-separated list of "
              "integers; use e.g. 3,4", file=sys.stderr)
        return 2
    if args.ema_decay is not None and not 0.0 <= args.ema_decay < 1.0:
        print(f"error: --ema-decay {args.ema_decay} is outside [0, 1); use e.g. 0.99 (0: none)",
              file=sys.stderr)
        return 2
    if args.n_train is not None and args.n_train < 16:
        print(f"error: --n-train {args.n_train} is too few; use 16 or more", file=sys.stderr)
        return 2
    if args.multires_steps is not None and args.multires_steps < 0:
        print(f"error: --multires-steps {args.multires_steps} is negative; use N >= 0",
              file=sys.stderr)
        return 2
    try:
        overrides = train_overrides(args.set)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.multires_steps is not None:  # a longer or shorter phase 2, evaluated as usual
        overrides["multires_steps"] = args.multires_steps
    if args.ema_decay is not None:  # phase 2's weight average at another decay (0: none)
        overrides["ema_decay"] = args.ema_decay
    try:
        mlp = tuple(sorted({float(x) for x in args.mlp.split(",")}))
    except ValueError:
        mlp = ()
    if not mlp or not all(0.0 < x <= 1.0 for x in mlp) or 1.0 not in mlp:
        print(f"error: --mlp {args.mlp!r} must be shares in (0, 1] including 1; use e.g. "
              "0.25,0.5,1", file=sys.stderr)
        return 2
    if args.depth < 1:
        print(f"error: --depth {args.depth} must be at least 1; use e.g. 3", file=sys.stderr)
        return 2
    if args.n_eval < 1:
        print(f"error: --n-eval {args.n_eval} must be at least 1; use e.g. 256",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    prepare(out, seeds, max(1, args.threads * args.jobs), args.n_train, args.n_eval,
            args.eval_seed)
    tag = eval_tag(args.n_eval, args.eval_seed)
    # the default's seeds first (the convergence claim), then each ablation over its seeds in
    # the order given (a benchmark cut short leaves whole rows of the table)
    order = sorted(((v, s) for s in seeds for v in variants),
                   key=lambda job: (job[0] != "ours", variants.index(job[0]), job[1]))
    jobs = [job for job in order
            if not (out / f"result-{job[0]}-s{job[1]}{tag}.json").is_file()]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_job, str(out), v, s, args.threads, args.train_steps,
                               overrides, args.n_train, args.n_eval, args.eval_seed,
                               args.seed_shift, args.depth, mlp)
                   for v, s in jobs]
        for future in futures:
            future.result()
    results = [json.loads((out / f"result-{v}-s{s}{tag}.json").read_text())
               for s in seeds for v in variants if (out / f"result-{v}-s{s}{tag}.json").is_file()]
    table = summarise(results, variants, seeds)
    (out / "summary.json").write_text(json.dumps(table, indent=2))
    print(markdown(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
