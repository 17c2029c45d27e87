"""The paper's three search dimensions, measured: what each restriction of the search finds.

    dreams-nas demo --run dreams-run             # first: an exhaustive search on this machine
    python benchmarks/bench_dimensions.py --run dreams-run [--prompts 16] [--repeats 3]
        [--threads 1]

Same supernet, same profile, same acceptance scores (the run's exhaustive trials.csv): the best
predicted subnet when the search may choose
  * all three architecture dimensions (heads, visual_keep, inject_layer),
  * none of them (the largest subnet at the middle inject layer: only the draft's shape),
  * each one alone (the other two as in "none"),
always with the draft's shape (draft_len, or a token tree) free. Each pick is then measured by real
speculative decoding against plain decoding, all picks interleaved in one run, `--repeats`
times (medians and ranges), every output checked token for token against greedy.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys

import torch

DIMENSIONS = ("heads", "visual_keep", "inject_layer")


def restricted_best(trials: list[dict], space, free: tuple[str, ...]) -> dict:
    """The trials row of the best predicted speedup among the subnets whose fixed dimensions
    sit at the default (largest heads and visual_keep, the middle inject layer)."""
    fixed = {"heads": max(space.heads), "visual_keep": max(space.visual_keep),
             "inject_layer": space.inject_layer[len(space.inject_layer) // 2]}
    rows = [r for r in trials if r.get("state", "complete").lower() == "complete" and r["speedup"]
            and all(d in free or float(r[d]) == float(fixed[d]) for d in DIMENSIONS)]
    return max(rows, key=lambda r: (float(r["speedup"]), r["spec_id"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="dreams-run")
    parser.add_argument("--hardware", default=None)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from dreams_nas.nas.stages.inputs import RunModels, load_eval_examples, resolve_hardware
    from dreams_nas.nas.stages.verify import measure_end_to_end
    from dreams_nas.supernet.core.runfolder import RunFolder
    from dreams_nas.supernet.core.spec import SubnetSpec

    run = RunFolder(args.run)
    hw = resolve_hardware(run, args.hardware)
    with open(run.trials_csv(hw), newline="") as handle:
        trials = list(csv.DictReader(handle))
    space = run.space()
    searches = {"all three": DIMENSIONS, "shape only": ()}
    searches.update({f"{d} alone": (d,) for d in DIMENSIONS})
    picks = {name: restricted_best(trials, space, free) for name, free in searches.items()}
    specs = {name: SubnetSpec.from_id(row["spec_id"]) for name, row in picks.items()}
    models = RunModels(run, "cpu")
    examples = load_eval_examples("builtin", args.prompts, 0)
    prompts = [models.target.build_inputs(ex.image_path, ex.prompt) for ex in examples]
    unique = list(dict.fromkeys(specs.values()))
    runs = [measure_end_to_end(models.target, models.draft, unique, prompts,
                               max_new_tokens=args.max_new_tokens)
            for _ in range(max(1, args.repeats))]
    measured = {spec: [r[i] for r in runs] for i, spec in enumerate(unique)}
    print(f"hardware {hw}; {len(prompts)} prompts, {args.max_new_tokens} new tokens, "
          f"{len(runs)} interleaved repeat(s), {args.threads} thread(s)")
    print("| search may choose | pick | predicted x | tau | measured x, median (range) | "
          "outputs equal to greedy |")
    print("|---|---|---:|---:|---|---:|")
    for name, spec in specs.items():
        ms = measured[spec]
        speed = [m.speedup for m in ms]
        print(f"| {name} | `{spec.id}` | {float(picks[name]['speedup']):.3f} | "
              f"{statistics.median(m.tau for m in ms):.2f} | {statistics.median(speed):.3f} "
              f"({min(speed):.3f}-{max(speed):.3f}) | "
              f"{sum(m.identical_prompts for m in ms)}/{sum(m.prompts for m in ms)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
