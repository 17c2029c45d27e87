"""the built-in target's training step: one process at 2 threads vs two data-parallel ranks at 1.

    python benchmarks/bench_builtin_build.py [--steps 40] [--repeats 3] [--neighbour]

Times the first stage of `dreams-nas target build-builtin` (the default variant's 4-layer model at
its batch of 32, the default recipe with its auxiliary cell loss) for `--steps` optimizer steps
in two configurations, interleaved `--repeats` times: `demo.training.train` in this process at 2
torch threads, and `demo.parallel.train_on_ranks` over 2 ranks at 1 thread each (what the build
does). A step's time is the gap between consecutive steps reported to the parent, so the
ranks' start-up is left out (it is reported apart, as the wall time). `--neighbour` runs a busy
single-threaded Python loop beside the measurement, as another tenant of a shared VM would.
Prints one JSON line per run and a summary line of medians and ranges.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from dataclasses import replace
from typing import Any


def _spin() -> None:
    while True:
        pass


def _run(mode: str, steps: int) -> dict[str, Any]:
    import torch
    from dreams_nas.supernet.builtin.build import build_config, build_processor, init_model
    from dreams_nas.supernet.builtin.parallel import train_on_ranks
    from dreams_nas.supernet.builtin.training import Encoder, train_target
    from dreams_nas.supernet.builtin.variants import get_variant

    spec = get_variant("default")
    processor = build_processor()
    cfg = replace(spec.train, max_steps=steps, eval_every=10 * steps)
    model = init_model(build_config(replace(spec, text_layers=spec.grow_from_layers),
                                    processor.tokenizer), 0)
    stamps: list[float] = []

    def on_step(_step: int, _loss: float, _val: float | None) -> None:
        stamps.append(time.perf_counter())

    start = time.perf_counter()
    if mode == "1x2":
        torch.set_num_threads(2)
        train_target(model, Encoder(processor), cfg, data_seed=0, on_step=on_step)
    else:
        train_on_ranks(model, cfg, ranks=2, threads_per_rank=1, data_seed=0, on_step=on_step)
    wall = time.perf_counter() - start
    gaps = [b - a for a, b in zip(stamps[3:], stamps[4:], strict=False)]  # 3 warm-up steps
    return {"mode": mode, "steps": steps, "step_ms": round(statistics.median(gaps) * 1e3, 1),
            "wall_s": round(wall, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--neighbour", action="store_true",
                        help="run a busy single-threaded loop beside the measurement")
    args = parser.parse_args(argv)
    if args.steps < 8 or args.repeats < 1:
        parser.error(f"--steps {args.steps} / --repeats {args.repeats}: need >= 8 / >= 1")
    neighbour = None
    if args.neighbour:
        neighbour = multiprocessing.get_context("spawn").Process(target=_spin, daemon=True)
        neighbour.start()
    rows: list[dict[str, Any]] = []
    try:
        for repeat in range(args.repeats):
            for mode in ("1x2", "2x1"):
                row = {**_run(mode, args.steps), "repeat": repeat, "neighbour": args.neighbour}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        if neighbour is not None:
            neighbour.terminate()
    summary: dict[str, Any] = {"neighbour": args.neighbour, "repeats": args.repeats}
    for mode in ("1x2", "2x1"):
        times = [r["step_ms"] for r in rows if r["mode"] == mode]
        summary[mode] = {"step_ms_median": statistics.median(times),
                         "step_ms_range": [min(times), max(times)]}
    summary["speedup_2x1_over_1x2"] = round(
        summary["1x2"]["step_ms_median"] / summary["2x1"]["step_ms_median"], 2)
    print(json.dumps({"summary": summary}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
