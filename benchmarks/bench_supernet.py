"""Supernet benchmark: acceptance length of trained subnets, ablations, end-to-end speed.

    python benchmarks/bench_supernet.py [--run DIR] [--n-eval N] [--max-new-tokens N]

1. `dreams-nas train` with default settings on the demo target (skipped when the run folder
   already holds a supernet; its recorded training time is reported then).
2. tau (tokens per target forward, bonus included) at gamma = 5, greedy, by real speculative
   decoding on held-out synthetic eval prompts: the full subnet at every inject layer, the
   smallest subnet, and a heads x visual_keep table at the chosen layer. Every speculative
   output is checked token for token against plain greedy decoding.
3. Ablation in the same run, same data and step budget: distillation from the AIFD-chosen
   layer (ours) vs a fixed middle layer vs no distillation, and a text-only draft (no
   cross-attention).
4. End-to-end tokens/s of the full subnet vs plain decoding (median of 3 passes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.core.space import SearchSpace, SubnetSpec
from dreams_nas.supernet.data.prompts import builtin_dataset
from dreams_nas.supernet.decoding.dream import DreamDrafter
from dreams_nas.supernet.decoding.loop import generate, plain_generate
from dreams_nas.supernet.target.adapter import TargetAdapter
from dreams_nas.supernet.training.recipe import (
    build_draft,
    distill_layers_for,
    draft_for_run,
    prepare_data,
    prompt_inputs,
)
from dreams_nas.supernet.training.tppt import TrainConfig, train_supernet

GAMMA = 5


def measure_tau(target, prompts, references, drafter, max_new_tokens):
    produced = forwards = 0
    for prompt, ref in zip(prompts, references, strict=True):
        out = generate(target, prompt, drafter, gamma=GAMMA, max_new_tokens=max_new_tokens)
        if out.tokens.tolist() != ref:
            raise AssertionError("speculative output differs from plain greedy decoding")
        produced += sum(out.stats.cycle_lengths)
        forwards += len(out.stats.cycle_lengths)
    return produced / max(1, forwards)


def scored_taus(run, meta):
    """(file, {spec_id: row}) of the run's teacher-forced greedy scores of this supernet, if any."""
    import csv

    digest = meta.get("supernet", {}).get("hash")
    for path in sorted((run.root / "acceptance").glob("*.csv")):
        with path.open(newline="") as handle:
            rows = [r for r in csv.DictReader(handle)
                    if float(r["temperature"]) == 0.0
                    and (digest is None or r["supernet_hash"] == digest)]
        if rows:
            out = {r["spec_id"]: {"tau": float(r["tau"]), "tau_lo": float(r["tau_lo"]),
                                  "tau_hi": float(r["tau_hi"]), "draft_len": int(r["draft_len"]),
                                  "n_prompts": int(r["n_prompts"])} for r in rows}
            return str(path), out
    return None


def tokens_per_s(fn, prompts, repeats=3):
    rates = []
    for _ in range(repeats):
        tokens, start = 0, time.perf_counter()
        for prompt in prompts:
            tokens += fn(prompt).stats.new_tokens
        rates.append(tokens / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="bench-run", help="run folder (trained here if empty)")
    parser.add_argument("--n-eval", type=int, default=30)
    parser.add_argument("--n-table", type=int, default=16, help="prompts per cell of the table")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--skip-ablation", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (train and eval)")
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    parser.add_argument("--train-args", default="",
                        help="extra `dreams-nas train` options (smoke tests only; the benchmark "
                             "is the default settings)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    run = RunFolder(args.run)
    results: dict = {}

    if not (run.supernet_dir / "model.safetensors").is_file():
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "dreams_nas.nas.cli", "train", "--run", args.run,
                        "--json", *args.train_args.split()], check=True,
                       env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
        results["train_wall_s"] = round(time.perf_counter() - start, 1)
    meta = run.read_run()
    results["train_recorded_s"] = meta["supernet"]["train"].get("seconds")
    results["aifd"] = {k: meta["aifd"][k] for k in ("chosen", "ae", "delta_ae")}
    target = TargetAdapter.load(meta["target"]["id"])
    draft = draft_for_run(target, run)
    space = SearchSpace.from_dict(meta["space"])

    examples = builtin_dataset("eval", args.n_eval, seed=0)
    prompts = prompt_inputs(target, examples)
    refs = [plain_generate(target, p, max_new_tokens=args.max_new_tokens).tokens.tolist()
            for p in prompts]

    full_h, small_h = max(space.heads), min(space.heads)
    full_v, small_v = max(space.visual_keep), min(space.visual_keep)
    by_layer = {}
    for layer in space.inject_layer:
        spec = SubnetSpec(full_h, full_v, layer, GAMMA)
        by_layer[layer] = measure_tau(target, prompts, refs, DreamDrafter(draft, spec),
                                      args.max_new_tokens)
        print(f"full subnet {spec.id}: tau {by_layer[layer]:.3f}", flush=True)
    chosen = max(by_layer, key=by_layer.get)
    smallest = SubnetSpec(small_h, small_v, chosen, GAMMA)
    results["tau_full_by_layer"] = by_layer
    results["chosen_layer"] = chosen
    results["tau_full"] = by_layer[chosen]
    results["tau_smallest"] = measure_tau(target, prompts, refs, DreamDrafter(draft, smallest),
                                          args.max_new_tokens)
    print(f"smallest {smallest.id}: tau {results['tau_smallest']:.3f}", flush=True)

    scored = scored_taus(run, meta)
    if scored is not None and all(SubnetSpec(h, v, chosen, GAMMA).id in scored[1]
                                  for h in space.heads for v in space.visual_keep):
        # The run's own teacher-forced scores (equal to real speculative runs at temperature 0,
        # a test checks it) on its evaluation prompts: the whole space, with 95% intervals.
        results["table_source"] = f"teacher-forced scores in {scored[0]}"
        results["table"] = {k: r["tau"] for k, r in scored[1].items() if r["draft_len"] == GAMMA}
        results["table_ci"] = {k: (r["tau_lo"], r["tau_hi"]) for k, r in scored[1].items()
                               if r["draft_len"] == GAMMA}
    else:
        table = {}
        tp, tr = prompts[: args.n_table], refs[: args.n_table]
        for h in space.heads:
            for v in space.visual_keep:
                spec = SubnetSpec(h, v, chosen, GAMMA)
                table[spec.id] = measure_tau(target, tp, tr, DreamDrafter(draft, spec),
                                             args.max_new_tokens)
        results["table_source"] = f"real speculative decoding, {len(tp)} prompts per cell"
        results["table"] = table

    full = SubnetSpec(full_h, full_v, chosen, GAMMA)
    drafter = DreamDrafter(draft, full)
    plain = tokens_per_s(lambda p: plain_generate(target, p, max_new_tokens=args.max_new_tokens),
                         prompts[:10])
    spec_rate = tokens_per_s(lambda p: generate(target, p, drafter, gamma=GAMMA,
                                                max_new_tokens=args.max_new_tokens), prompts[:10])
    results["tokens_per_s"] = {"plain": plain, "full_subnet": spec_rate,
                               "speedup": spec_rate / plain}

    if not args.skip_ablation:
        train_meta = meta["supernet"]["train"]
        cfg = TrainConfig.from_dict(train_meta["config"])
        heads = draft.config.num_heads
        data = prepare_data(target, builtin_dataset("train", train_meta["n_examples"], seed=0),
                            num_draft_heads=heads, max_new_tokens=train_meta["max_new_tokens"],
                            answers_cache=run.supernet_dir / "selfdistill.json")
        ablation = {f"ours (AIFD layer {list(data.aifd.chosen)})": results["tau_full"]}
        variants = [("fixed middle layer", "middle", True), ("no distillation", "none", True),
                    ("text-only draft (no cross-attention)", "none", False)]
        for name, mode, cross in variants:
            layers = distill_layers_for(mode, data)
            config = (cfg if mode != "none"
                      else replace(cfg, weights=replace(cfg.weights, distill=0.0)))
            model = build_draft(target, data, num_heads=heads, seed=cfg.seed, cross_attention=cross)
            start = time.perf_counter()
            train_supernet(model, data.samples, layers, config,
                           Path(args.run) / "bench-ablation" / mode
                           / ("cross" if cross else "text"))
            spec = SubnetSpec(full_h, full_v, chosen, GAMMA)
            ablation[name] = measure_tau(target, prompts, refs, DreamDrafter(model, spec),
                                         args.max_new_tokens)
            print(f"{name}: tau {ablation[name]:.3f} "
                  f"(trained in {time.perf_counter() - start:.0f} s)", flush=True)
        results["ablation"] = ablation

    print(json.dumps(results, indent=2, default=str))
    _print_markdown(results, space, chosen)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2, default=str))
    return 0


def _print_markdown(results, space, chosen):
    print(f"\ntau table at layer {chosen}, gamma {GAMMA}: {results.get('table_source')}")
    print("\n| heads \\ visual_keep | " + " | ".join(f"{v:.2f}" for v in space.visual_keep) + " |")
    print("|---|" + "---|" * len(space.visual_keep))
    for h in space.heads:
        cells = [results["table"][SubnetSpec(h, v, chosen, GAMMA).id] for v in space.visual_keep]
        print(f"| {h} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    for name, tau in results.get("ablation", {}).items():
        print(f"| {name} | {tau:.2f} |")


if __name__ == "__main__":
    torch.set_grad_enabled(True)
    raise SystemExit(main())
