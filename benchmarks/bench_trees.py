"""Token trees vs chains, measured: the best chain and the best tree of one search, side by side.

    dreams-nas train && dreams-nas profile --threads 1 && dreams-nas search --threads 1
    python benchmarks/bench_trees.py --run dreams-run [--hardware HW] [--device cpu]
        [--prompts 32] [--repeats 5] [--threads 1] [--max-new-tokens 64] [--json] [--out F]

From the search's trials.csv: the chain subnet and the token-tree subnet with the highest
predicted speedup, and the search's own choice (best.json). Both decode the built-in evaluation
prompts the search scored through `nas.stages.verify.measure_end_to_end` (the code path of the
search's verification: each prompt decoded plainly, then with each draft, every output checked
against plain greedy), the order of the two alternating per repeat. Reported: tau, and the
decode-phase speedup over plain decoding (what the expected-speedup formula predicts), median
and range over the repeats; the ratio tree / chain per repeat, median; and whether the search's
choice between chain and tree is the one measured faster. Both decode as the hardware id was
profiled (hardware.json's ``steps``: a ``<id>-compiled`` search's in compiled steps), on
`--device`. Logs and a bar on stderr.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path
from typing import Any


def best_of_each_shape(trials_csv: Path) -> dict[str, dict[str, Any]]:
    """The completed chain and tree rows of trials.csv with the highest predicted speedup."""
    import pandas as pd

    frame = pd.read_csv(trials_csv, dtype={"spec_id": str, "tree": str}, keep_default_na=False)
    frame = frame[frame["state"].astype(str).str.lower() == "complete"]
    frame = frame[pd.to_numeric(frame["speedup"], errors="coerce").notna()]
    if "tree" not in frame:
        raise SystemExit(f"{trials_csv} has no tree column: search a space with token trees")
    out = {}
    is_tree = frame["tree"] != ""
    for shape, rows in (("chain", frame[~is_tree]), ("tree", frame[is_tree])):
        if rows.empty:
            raise SystemExit(f"{trials_csv} holds no {shape} subnet: search a space with both")
        row = rows.loc[pd.to_numeric(rows["speedup"]).idxmax()]
        out[shape] = {"spec_id": str(row["spec_id"]), "predicted_speedup": float(row["speedup"]),
                      "scored_tau": float(row["tau"]), "cycle_ms": float(row["cycle_ms"])}
    return out


def bench(run_dir: str | Path, *, hardware: str | None = None, prompts: int = 32,
          max_new_tokens: int = 64, repeats: int = 5, threads: int | None = 1,
          device: str = "cpu", show_progress: bool | None = None) -> dict[str, Any]:
    import torch
    from dreams_nas.nas.stages.inputs import (
        RunModels,
        hardware_identity,
        load_eval_examples,
        resolve_hardware,
    )
    from dreams_nas.nas.stages.verify import measure_end_to_end
    from dreams_nas.nas.stages.verify_pick import deploy_steps
    from dreams_nas.supernet.core.device import torch_threads
    from dreams_nas.supernet.core.io import read_json
    from dreams_nas.supernet.core.runfolder import RunFolder
    from dreams_nas.supernet.core.spec import SubnetSpec

    run = RunFolder(run_dir)
    hw = resolve_hardware(run, hardware)
    best = best_of_each_shape(run.trials_csv(hw))
    chosen = str(read_json(run.best_json(hw))["spec_id"])
    specs = {shape: SubnetSpec.from_id(b["spec_id"]) for shape, b in best.items()}
    dtype = run.read_run().get("dtype") or "float32"
    models = RunModels(run, device, dtype)
    per_repeat: dict[str, list[Any]] = {"chain": [], "tree": []}
    with torch_threads(threads):
        target, supernet = models.target, models.draft
        examples = load_eval_examples("builtin", prompts, 0)  # the prompts the search scored
        inputs = [target.build_inputs(ex.image_path, ex.prompt) for ex in examples]
        steps = hardware_identity(run, hw)
        deploy_steps(target, steps, inputs, list(specs.values()), max_new_tokens)
        for r in range(repeats):
            order = ["chain", "tree"] if r % 2 == 0 else ["tree", "chain"]
            print(f"repeat {r + 1}/{repeats}: {', '.join(specs[s].id for s in order)}",
                  file=sys.stderr)
            measured = measure_end_to_end(target, supernet, [specs[s] for s in order], inputs,
                                          max_new_tokens=max_new_tokens,
                                          show_progress=show_progress)
            for shape, m in zip(order, measured, strict=True):
                per_repeat[shape].append(m)
        n_threads = torch.get_num_threads()
    rows = {}
    for shape, ms in per_repeat.items():
        speedups = [m.speedup for m in ms]
        rows[shape] = {**best[shape], "measured_tau": ms[0].tau,
                       "measured_speedup": statistics.median(speedups),
                       "measured_range": [min(speedups), max(speedups)],
                       "identical_prompts": min(m.identical_prompts for m in ms),
                       "prompts": ms[0].prompts,
                       "draft_ms": statistics.median(m.draft_ms for m in ms),
                       "verify_ms": statistics.median(m.verify_ms for m in ms)}
    ratios = [t.speedup / c.speedup for c, t in zip(per_repeat["chain"], per_repeat["tree"],
                                                     strict=True)]
    measured_winner = "tree" if statistics.median(ratios) > 1 else "chain"
    chosen_shape = "tree" if SubnetSpec.from_id(chosen).tree else "chain"
    return {"run": str(run.root), "hardware_id": hw, "prompts": len(inputs),
            "device": device, "steps": steps.get("steps") or "dynamic",
            "max_new_tokens": max_new_tokens, "repeats": repeats, "threads": n_threads,
            "dtype": dtype, "torch": torch.__version__, "python": platform.python_version(),
            "rows": rows, "tree_over_chain": statistics.median(ratios),
            "tree_over_chain_range": [min(ratios), max(ratios)], "search_choice": chosen,
            "search_choice_shape": chosen_shape, "measured_winner": measured_winner,
            "agrees": chosen_shape == measured_winner, "table": markdown(rows)}


def markdown(rows: dict[str, dict[str, Any]]) -> str:
    lines = ["| shape | subnet | predicted speedup | scored tau | measured tau | measured decode "
             "speedup (median, range) | identical to greedy |",
             "|---|---|---:|---:|---:|---:|:---:|"]
    for shape, r in rows.items():
        lo, hi = r["measured_range"]
        lines.append(f"| best {shape} | `{r['spec_id']}` | {r['predicted_speedup']:.2f}x | "
                     f"{r['scored_tau']:.2f} | {r['measured_tau']:.2f} | "
                     f"**{r['measured_speedup']:.2f}x** ({lo:.2f}-{hi:.2f}) | "
                     f"{r['identical_prompts']}/{r['prompts']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="dreams-run")
    parser.add_argument("--hardware", default=None,
                        help="hardware id of the search (default: the only one)")
    parser.add_argument("--device", default="cpu", help="where to decode (the profile's)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="one JSON line on stdout")
    parser.add_argument("--out", default=None, metavar="FILE.json")
    args = parser.parse_args(argv)
    result = bench(args.run, hardware=args.hardware, prompts=args.prompts,
                   max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                   threads=args.threads, device=args.device)
    out = sys.stderr if args.json else sys.stdout
    print(f"hardware {result['hardware_id']}; {result['prompts']} prompts, max "
          f"{result['max_new_tokens']} new tokens, median of {result['repeats']} interleaved "
          f"repeats, {result['threads']} thread(s), {result['dtype']}, {result['device']}, "
          f"{result['steps']} steps\n", file=out)
    print(result["table"], file=out)
    lo, hi = result["tree_over_chain_range"]
    print(f"\ntree / chain measured: {result['tree_over_chain']:.3f}x ({lo:.3f}-{hi:.3f}); "
          f"the search chose {result['search_choice']} ({result['search_choice_shape']}), "
          f"measured faster: {result['measured_winner']} -> "
          f"{'agrees' if result['agrees'] else 'disagrees'}", file=out)
    if args.json:  # one line on stdout, the table went to stderr
        print(json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
