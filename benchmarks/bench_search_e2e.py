"""End to end on this machine: the searched subnet vs the full draft vs an EAGLE-like setting.

    dreams-nas search --run dreams-run          # first: score + search on this hardware
    python benchmarks/bench_search_e2e.py --run dreams-run [--prompts 8] [--max-new-tokens 64]
        [--repeats 5]

Measures, in one interleaved run against plain decoding of the same prompts:
  * the search's best subnet (best.json),
  * the full supernet draft (all heads, all visual tokens, last inject layer) at its own best
    draft length by the same prediction,
  * a fixed EAGLE-like configuration: all heads, all visual tokens, last layer, draft_len = 5,
and prints predicted and measured speedups (target: predicted within 10% of measured for the
best subnet), the searched best over the better of the two fixed configurations, and the cost
range of a draft step across the space (the slowest over the fastest subnet the profile timed,
at each context length). With --repeats R the whole measurement runs R times; the table shows
the median of each figure over the repeats and the range of the measured decode-phase speedup.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="dreams-run")
    parser.add_argument("--hardware", default=None)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from dreams_nas.nas.stages.inputs import RunModels, load_eval_examples, resolve_hardware
    from dreams_nas.nas.stages.verify import measure_end_to_end
    from dreams_nas.supernet.core.runfolder import RunFolder
    from dreams_nas.supernet.core.spec import SubnetSpec
    from peers import full_and_eagle_specs, predicted_speedups

    run = RunFolder(args.run)
    hw = resolve_hardware(run, args.hardware)
    best = json.loads(run.best_json(hw).read_text())
    predicted = predicted_speedups(run.trials_csv(hw))
    trials = {r["spec_id"]: r for r in _read_csv(run.trials_csv(hw))}
    full_best, eagle = full_and_eagle_specs(run.space(), predicted)
    chosen = {"searched best": SubnetSpec.from_dict(best["spec"]), "full draft": full_best,
              "EAGLE-like (draft_len 5)": eagle}
    models = RunModels(run, "cpu")
    examples = load_eval_examples("builtin", args.prompts, 0)  # the eval prompts the search scored
    prompts = [models.target.build_inputs(ex.image_path, ex.prompt) for ex in examples]
    runs = [measure_end_to_end(models.target, models.draft, list(dict.fromkeys(chosen.values())),
                               prompts, max_new_tokens=args.max_new_tokens)
            for _ in range(max(1, args.repeats))]
    results = [_median_measured([r[i] for r in runs]) for i in range(len(runs[0]))]
    spread = {runs[0][i].spec: (min(r[i].speedup for r in runs), max(r[i].speedup for r in runs))
              for i in range(len(runs[0]))}
    by_spec = {m.spec: m for m in results}
    print(f"hardware {hw}; {len(prompts)} evaluation prompts, {args.max_new_tokens} new tokens, "
          f"{len(runs)} repeat(s) (medians); "
          f"plain decoding {results[0].baseline_tokens_per_s:.1f} tokens/s")
    print(f"{'configuration':24} {'spec':26} {'pred. tau':>9} {'meas. tau':>9} "
          f"{'pred. x':>8} {'meas. x':>8} {'gap':>6} {'whole calls x':>13} {'meas. x range':>14}")
    for name, spec in chosen.items():
        m, t = by_spec[spec], trials[spec.id]
        pred = predicted[spec.id]
        print(f"{name:24} {spec.id:26} {float(t['tau']):9.2f} {m.tau:9.2f} {pred:8.2f} "
              f"{m.speedup:8.2f} {abs(m.speedup - pred) / pred:6.1%} {m.speedup_end_to_end:13.2f} "
              f"{spread[spec][0]:9.2f}-{spread[spec][1]:.2f}")
    b, f, e = (by_spec[chosen[k]] for k in chosen)
    print("meas. x: decode phase (tokens after the first / time after the prefill, both sides), "
          "what the formula predicts; whole calls x: prefill included")
    print(f"searched / full draft: {b.speedup / f.speedup:.2f}x; searched / EAGLE-like: "
          f"{b.speedup / e.speedup:.2f}x; searched / best fixed: "
          f"{b.speedup / max(f.speedup, e.speedup):.2f}x")
    for ctx, (slow, fast) in sorted(draft_cost_range(run.profile_csv(hw)).items()):
        print(f"draft step at context {ctx}: slowest {slow[1]:.3f} ms ({slow[0]}), fastest "
              f"{fast[1]:.3f} ms ({fast[0]}): {slow[1] / fast[1]:.2f}x")
    return 0


def draft_cost_range(profile_csv) -> dict[int, tuple[tuple[str, float], tuple[str, float]]]:
    """context -> ((slowest spec, ms), (fastest spec, ms)) over the profile's one-token
    ``draft`` steps (the median of each point's repeats; several passes: their median)."""
    import statistics
    from collections import defaultdict

    points: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in _read_csv(profile_csv):
        if row["kind"] == "draft" and row["k"] == "1" and row.get("status", "ok") == "ok":
            points[int(row["context_len"])][row["spec_id"]].append(float(row["median_ms"]))
    out = {}
    for ctx, specs in points.items():
        ms = {spec: statistics.median(v) for spec, v in specs.items()}
        slow, fast = max(ms, key=ms.get), min(ms, key=ms.get)
        out[ctx] = ((slow, ms[slow]), (fast, ms[fast]))
    return out


def _median_measured(ms):
    """One `Measured` whose rates are the medians over repeats of the same spec."""
    import statistics
    from dataclasses import fields, replace

    numeric = {f.name: statistics.median(getattr(m, f.name) for m in ms)
               for f in fields(ms[0]) if f.name != "spec"}
    return replace(ms[0], **numeric)


def _read_csv(path):
    import csv

    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


if __name__ == "__main__":
    sys.exit(main())
