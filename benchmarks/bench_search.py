"""Optuna vs exhaustive search on the same recorded acceptance + latency tables.

    python benchmarks/bench_search.py                    # synthetic recorded tables (no model)
    python benchmarks/bench_search.py --run dreams-run --hardware cpu-...   # a real run's tables

For each seed it runs the Optuna strategy (in memory) and records how many distinct subnet
evaluations it needed until its best expected speedup reached 98% of the exhaustive best.
Target: median over 5 seeds <= 25% of the space.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np
from dreams_nas.nas.search.candidate import DraftCost, Pricing
from dreams_nas.nas.search.config import SearchConfig
from dreams_nas.nas.search.replay import RecordedAcceptance, RecordedLatency
from dreams_nas.nas.search.strategies import search
from dreams_nas.supernet.acceptance.table import AcceptanceRow
from dreams_nas.supernet.core.space import SearchSpace


def synthetic_tables(seed: int = 0):
    """A landscape shaped like the demo's: acceptance rises with heads, visual tokens and
    deeper injected features with diminishing returns, decays per drafted position; the draft
    step costs more with heads and visual tokens; a verify pass grows slowly with k."""
    space = SearchSpace.default_for(num_target_layers=16, num_draft_heads=8, trees=())
    rng = np.random.default_rng(seed)
    rows, draft = [], {}
    for h in space.heads:
        for v in space.visual_keep:
            for lyr in space.inject_layer:
                a0 = (0.45 + 0.25 * (1 - np.exp(-h / 3)) + 0.12 * np.sqrt(v)
                      + 0.10 * (1 - (lyr / max(space.inject_layer) - 0.8) ** 2)
                      + rng.normal(0, 0.015))
                draft[(h, v, lyr)] = 0.9 + 0.45 * h + 1.1 * v + rng.normal(0, 0.03)
                for g in space.draft_len:
                    rates = [float(np.clip(a0 * 0.96**j, 0.01, 0.99)) for j in range(g)]
                    tau = 1 + sum(np.prod(rates[: i + 1]) for i in range(g))
                    rows.append(AcceptanceRow(
                        spec=space.validate(type(space.largest())(h, v, lyr, g)),
                        tau=float(tau), tau_lo=float(tau) - 0.05, tau_hi=float(tau) + 0.05,
                        supernet_hash="synthetic", dataset_id="synthetic", accept_rates=rates))
    verify = {k: 18.0 + 1.2 * k for k in range(2, max(space.draft_len) + 2)}
    return space, rows, RecordedLatency(draft, verify, decode=17.5), 32


def run_tables(run_dir: str, hardware: str | None, dataset: str | None):
    """A run's recorded tables: its acceptance CSV (all scored rows) and latency predictor."""
    from dreams_nas.nas.stages.inputs import load_latency, resolve_hardware, supernet_hash
    from dreams_nas.supernet.acceptance.table import AcceptanceTable
    from dreams_nas.supernet.core.runfolder import RunFolder

    run = RunFolder(run_dir)
    hw = resolve_hardware(run, hardware)
    dataset = dataset or run.dataset_ids()[0]
    rows = list(AcceptanceTable(run.acceptance_csv(dataset), supernet_hash(run), dataset)
                .load().values())
    space = run.space()
    missing = [s.id for s in space.enumerate() if s not in {r.spec for r in rows}]
    if missing:
        raise SystemExit(f"{len(missing)} subnets lack acceptance rows; run `dreams-nas score`")
    context = sorted(r.context_len for r in rows)[len(rows) // 2]
    return space, rows, load_latency(run, hw), context


def evaluations_to_reach(history, target: float) -> int | None:
    for i, (_, _, best) in enumerate(history, start=1):
        if best >= target:
            return i
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default=None)
    parser.add_argument("--hardware", default=None)
    parser.add_argument("--dataset", default=None, help="acceptance/<dataset>.csv of the run")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.25, help="fraction of the space")
    parser.add_argument("--objective", default="speedup")
    args = parser.parse_args(argv)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.run:
        space, rows, latency, context = run_tables(args.run, args.hardware, args.dataset)
        source = f"run {args.run} / {args.hardware}"
    else:
        space, rows, latency, context = synthetic_tables()
        source = "synthetic recorded tables"
    params = lambda s: 1000 * s.heads  # noqa: E731 - cost axis only
    pricing = Pricing(latency, context, DraftCost(params))
    exhaustive = search(space, RecordedAcceptance(rows), pricing,
                        SearchConfig(show_progress=False))
    target = 0.98 * exhaustive.best.speedup
    budget = max(1, int(round(args.budget * space.size)))
    needed, finals = [], []
    for seed in range(args.seeds):
        res = search(space, RecordedAcceptance(rows), pricing,
                     SearchConfig(method="optuna", n_trials=budget, seed=seed,
                                  show_progress=False))
        n = evaluations_to_reach(res.history, target)
        needed.append(n if n is not None else float("inf"))
        finals.append(res.best.speedup / exhaustive.best.speedup)
    med = statistics.median(needed)
    summary = {
        "source": source, "space_size": space.size, "budget": budget,
        "exhaustive_best": exhaustive.best.spec.id,
        "exhaustive_speedup": round(exhaustive.best.speedup, 4),
        "evaluations_to_98pct": needed, "median_evaluations": med,
        "median_fraction_of_space": med / space.size,
        "final_ratio_to_exhaustive": [round(f, 4) for f in finals],
        "pass": med <= budget,
    }
    print(json.dumps(summary))
    return 0 if summary["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
