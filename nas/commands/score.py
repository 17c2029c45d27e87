"""`dreams-nas score`: acceptance length tau of subnets on an evaluation set (cached, resumable)."""

from __future__ import annotations

import argparse
from typing import Any

HELP = "measure the acceptance length tau of subnets on evaluation prompts (cached per supernet)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default="builtin", metavar="builtin|FILE.jsonl",
                        help="evaluation prompts: the built-in eval split or a LLaVA-style JSONL")
    parser.add_argument("--specs", default="all", metavar="all|FILE",
                        help="which subnets: all of the space, or a file of ids (one per line)")
    parser.add_argument("--temperature", type=float, default=0.0, metavar="T",
                        help="0 (default): teacher-forced, every draft length at once; "
                             "> 0: seeded real sampled runs")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="use the first N prompts (builtin default: 32)")
    parser.add_argument("--max-new-tokens", type=int, default=64, metavar="N",
                        help="tokens generated per prompt (default 64)")
    parser.add_argument("--device", default="auto", metavar="D", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch CPU threads while scoring (default: torch's own)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    import time

    from dreams_nas.nas.inputs import (
        LazyScorer,
        RunModels,
        dataset_id,
        read_specs,
        supernet_hash,
        torch_threads,
    )
    from dreams_nas.nas.scoring import CachedAcceptance
    from dreams_nas.supernet.acceptance_table import AcceptanceTable
    from dreams_nas.supernet.errors import InputError
    from dreams_nas.supernet.runfolder import RunFolder
    from dreams_nas.supernet.training_run import resolve_device

    start = time.perf_counter()
    if args.temperature < 0:
        raise InputError(f"--temperature {args.temperature} must be >= 0 (0 means greedy)")
    run_folder = RunFolder(args.run)
    digest = supernet_hash(run_folder)
    space = run_folder.space()
    specs = read_specs(args.specs, space)
    data_id = dataset_id(args.data, args.limit, args.seed)
    table = AcceptanceTable(run_folder.acceptance_csv(data_id), digest, data_id, args.temperature)
    show = False if args.json or args.quiet else None
    scorer = LazyScorer(RunModels(run_folder, str(resolve_device(args.device))), data=args.data,
                        limit=args.limit, seed=args.seed, supernet_hash=digest,
                        dataset_id=data_id, temperature=args.temperature,
                        max_new_tokens=args.max_new_tokens, draft_lens=space.draft_len,
                        show_progress=show)
    cached = CachedAcceptance(scorer, table)
    with torch_threads(args.threads):
        rows = cached.rows(specs, show_progress=show)
    best = max(rows, key=lambda r: r.tau)
    return {"acceptance": str(table.path), "dataset_id": data_id, "supernet_hash": digest,
            "temperature": args.temperature, "method": best.method, "n_specs": len(rows),
            "n_scored": cached.n_scored, "n_cached": len(rows) - min(len(rows), cached.n_scored),
            "best_tau": round(best.tau, 4), "best_tau_spec": best.spec.id,
            "seconds": round(time.perf_counter() - start, 1)}
