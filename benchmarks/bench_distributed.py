"""One rank vs two: wall time of the target's side (self-distilled answers, AIFD, feature store)
and of data-parallel draft training on the built-in target, as `torchrun` runs them.

    python benchmarks/bench_distributed.py [--prompts 64] [--steps 40] [--repeats 3]

Each configuration runs in fresh processes joined as a gloo group (`supernet.core.dist`, the
group torchrun would build; one process: no group), in a fresh run folder, with the default
`dreams-nas train` recipe at a small budget: `--prompts` built-in training prompts, 64-token
answers, `--steps` optimizer steps (half warm-up, half sandwich rule), batch 8, no held-out
prompts. Configurations: 1 rank x 1 thread, 1 rank x 2 threads (what one process gets of this
machine) and 2 ranks x 1 thread; repeats interleave them. One JSON line per run with the two
phases' seconds; a summary line with medians and ranges. The built-in target must be in the cache
(`dreams-nas target build-builtin`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

CONFIGS = ((1, 1), (1, 2), (2, 1))  # (ranks, threads per rank)


def _rank(rank: int, size: int, threads: int, init: str, run_root: str, prompts: int,
          steps: int, out: str) -> None:
    import torch
    from dreams_nas.supernet.core import dist

    torch.set_num_threads(threads)
    if size > 1:
        dist.join("gloo", init_method=f"file://{init}", rank=rank, size=size)
    try:
        _work(rank, run_root, prompts, steps, out)
    except BaseException:
        dist.leave()
        raise
    dist.leave(synchronize=True)


def _work(rank: int, run_root: str, prompts: int, steps: int, out: str) -> None:
    from dreams_nas.supernet.builtin.resolve import resolve_target
    from dreams_nas.supernet.core.dist import current
    from dreams_nas.supernet.core.runfolder import RunFolder
    from dreams_nas.supernet.data.prompts import load_examples
    from dreams_nas.supernet.target.adapter import TargetAdapter
    from dreams_nas.supernet.training.config import TrainConfig
    from dreams_nas.supernet.training.recipe import SupernetRecipe, prepare_data, train_run

    world = current()
    run = RunFolder(run_root)
    run.supernet_dir.mkdir(parents=True, exist_ok=True)
    target = TargetAdapter.load(resolve_target("builtin"), target_id="builtin")
    examples = load_examples("builtin", "train", prompts, prompts, 0, "--prompts")
    world.barrier()
    start = time.perf_counter()
    data = prepare_data(target, examples, SupernetRecipe(),
                        answers_cache=run.supernet_dir / "selfdistill.json",
                        feature_store=run.supernet_dir / "features", show_progress=False)
    world.barrier()
    features = time.perf_counter() - start
    config = TrainConfig(warmup_steps=steps // 2, multires_steps=steps - steps // 2,
                         batch_size=8, checkpoint_every=10_000)
    start = time.perf_counter()
    train_run(run, target, examples, config, SupernetRecipe(holdout=0), data=data,
              show_progress=False)
    world.barrier()
    training = time.perf_counter() - start
    if rank == 0:
        Path(out).write_text(json.dumps({"features_s": round(features, 2),
                                         "train_s": round(training, 2)}))


def run_config(ranks: int, threads: int, prompts: int, steps: int) -> dict[str, float]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="bench-dist-") as tmp:
        out = str(Path(tmp) / "timings.json")
        init = str(Path(tmp) / f"init-{uuid.uuid4().hex}")
        mp.start_processes(_rank, args=(ranks, threads, init, str(Path(tmp) / "run"), prompts,
                                        steps, out), nprocs=ranks, start_method="spawn")
        return json.loads(Path(out).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    results: dict[tuple[int, int], list[dict[str, float]]] = {c: [] for c in CONFIGS}
    for repeat in range(args.repeats):
        for ranks, threads in CONFIGS:
            got = run_config(ranks, threads, args.prompts, args.steps)
            results[(ranks, threads)].append(got)
            print(json.dumps({"repeat": repeat, "ranks": ranks, "threads": threads, **got}),
                  flush=True)
    summary = {}
    for (ranks, threads), runs in results.items():
        for phase in ("features_s", "train_s"):
            values = [r[phase] for r in runs]
            summary[f"{ranks}x{threads}_{phase}"] = {
                "median": statistics.median(values), "min": min(values), "max": max(values)}
    print(json.dumps({"summary": summary, "prompts": args.prompts, "steps": args.steps,
                      "repeats": args.repeats}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
