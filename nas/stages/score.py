"""`dreams-nas score` as one library call: the acceptance rows of subnets, cached per supernet."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dreams_nas.supernet.core.dist import World, current, local_device
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.core.spec import SubnetSpec


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
    from dreams_nas.supernet.core.runlock import stage_lock

    start = time.perf_counter()
    check_run_folder(run)
    if options.temperature < 0:
        raise InputError(f"--temperature {options.temperature} must be >= 0 (0 means greedy)")
    device = local_device(resolve_device(options.device))  # several ranks: one GPU each
    dtype = run.dtype(options.dtype, device)
    digest = supernet_hash(run)  # a supernet run.json does not record is refused: write nothing
    space = run.space()
    specs = read_specs(options.specs, space)
    run.record_dtype(dtype)
    data_id = dataset_id(options.data, options.limit, options.seed)
    with stage_lock(run.root, [f"acceptance-{data_id}"], "dreams-nas score"):
        table = AcceptanceTable(run.acceptance_csv(data_id), digest, data_id, options.temperature,
                                dtype=dtype, max_new_tokens=options.max_new_tokens)
        scorer = LazyScorer(RunModels(run, device, dtype), data=options.data, limit=options.limit,
                            seed=options.seed, supernet_hash=digest, dataset_id=data_id,
                            temperature=options.temperature, max_new_tokens=options.max_new_tokens,
                            draft_lens=space.draft_len, trees=space.trees,
                            show_progress=options.show_progress)
        cached = CachedAcceptance(scorer, table)
        world = current()
        with torch_threads(options.threads):
            if world.distributed:  # each rank scores its share of the architectures, then all read
                cached.rows(ranks_share(specs, cached, world),
                            show_progress=options.show_progress if world.is_main else False)
                world.barrier()
                cached.refresh()
            rows = cached.rows(specs, show_progress=options.show_progress)
    best = max(rows, key=lambda r: r.tau)
    n_scored = int(world.sum([cached.n_scored])[0])  # by every rank
    return {"acceptance": str(table.path), "dataset_id": data_id, "supernet_hash": digest,
            "temperature": options.temperature, "dtype": dtype, "method": best.method,
            "n_specs": len(rows),
            "n_scored": n_scored, "n_cached": len(rows) - min(len(rows), n_scored),
            "best_tau": round(best.tau, 4), "best_tau_spec": best.spec.id,
            "seconds": round(time.perf_counter() - start, 1),
            **({"ranks": world.size} if world.distributed else {})}


def ranks_share(specs: Sequence[SubnetSpec], cached: Any, world: World) -> list[SubnetSpec]:
    """The specs this rank scores: those of every `size`-th architecture (`SubnetSpec.arch`, in the
    order the specs first name them) among those the acceptance CSV lacks as rank 0 read it. A
    rerun after a kill splits only what is still missing, so no row is scored twice."""
    # rank 0's view of what is missing, for all: each rank read the CSV when it started, and a
    # rank that starts late may already see rows a faster rank appended; two views would split
    # differently and score some architectures twice
    missing_ids = world.broadcast([s.id for s in specs if cached.cached(s) is None])
    by_id = {s.id: s for s in specs}
    missing = [by_id[i] for i in missing_ids]
    archs = list(dict.fromkeys(s.arch for s in missing))
    mine = set(world.mine(archs))
    return [s for s in missing if s.arch in mine]
