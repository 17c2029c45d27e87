"""`dreams-nas score` as one library call: the acceptance rows of subnets, cached per supernet."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.runfolder import RunFolder


@dataclass(frozen=True)
class ScoreOptions:
    data: str = "builtin"  # builtin | FILE.jsonl
    specs: str = "all"  # all | a file of ids
    temperature: float = 0.0
    limit: int | None = None
    max_new_tokens: int = 64
    device: str = "auto"
    dtype: str | None = None  # None/auto: the run's dtype (RunFolder.dtype)
    threads: int | None = None
    seed: int = 0
    show_progress: bool | None = None


def score_run(run: RunFolder, options: ScoreOptions) -> dict[str, Any]:
    """Score every asked-for subnet whose row the acceptance CSV lacks; returns the summary."""
    from dreams_nas.nas.search.scoring import CachedAcceptance
    from dreams_nas.nas.stages.inputs import (
        LazyScorer,
        RunModels,
        check_run_folder,
        dataset_id,
        read_specs,
        supernet_hash,
    )
    from dreams_nas.supernet.acceptance.table import AcceptanceTable
    from dreams_nas.supernet.core.device import resolve_device, torch_threads

    start = time.perf_counter()
    check_run_folder(run)
    if options.temperature < 0:
        raise InputError(f"--temperature {options.temperature} must be >= 0 (0 means greedy)")
    device = resolve_device(options.device)
    dtype = run.dtype(options.dtype, device)
    digest = supernet_hash(run)  # a supernet run.json does not record is refused: write nothing
    space = run.space()
    specs = read_specs(options.specs, space)
    run.record_dtype(dtype)
    data_id = dataset_id(options.data, options.limit, options.seed)
    table = AcceptanceTable(run.acceptance_csv(data_id), digest, data_id, options.temperature,
                            dtype=dtype, max_new_tokens=options.max_new_tokens)
    scorer = LazyScorer(RunModels(run, device, dtype), data=options.data, limit=options.limit,
                        seed=options.seed, supernet_hash=digest, dataset_id=data_id,
                        temperature=options.temperature, max_new_tokens=options.max_new_tokens,
                        draft_lens=space.draft_len, trees=space.trees,
                        show_progress=options.show_progress)
    cached = CachedAcceptance(scorer, table)
    with torch_threads(options.threads):
        rows = cached.rows(specs, show_progress=options.show_progress)
    best = max(rows, key=lambda r: r.tau)
    return {"acceptance": str(table.path), "dataset_id": data_id, "supernet_hash": digest,
            "temperature": options.temperature, "dtype": dtype, "method": best.method,
            "n_specs": len(rows),
            "n_scored": cached.n_scored, "n_cached": len(rows) - min(len(rows), cached.n_scored),
            "best_tau": round(best.tau, 4), "best_tau_spec": best.spec.id,
            "seconds": round(time.perf_counter() - start, 1)}
