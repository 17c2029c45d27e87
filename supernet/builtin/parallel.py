"""Train the built-in target data parallel over several local processes (gloo, one host).

The built-in target's training step is a few hundred small operations, each of which one process's
threads meet at the end of: on a shared 2-core machine another tenant's work stalls them, while
two one-thread processes, each taking half the batch, meet once per step: as fast on a quiet
machine, faster beside a busy neighbour (BENCHMARKS.md, 'Built-in target build').

`train_on_ranks` starts `ranks` worker processes
(``python -m dreams_nas.supernet.builtin.parallel``,
so the caller's own script is never re-imported, as multiprocessing's spawn would), hands them
the model and the recipe through a private folder, and lets them meet in a gloo group through a
rendezvous file there. Each runs `training.train_target` with its `World` (each rank a contiguous
slice of every global batch, the gradients averaged, the same stop); rank 0 reports each step as a
JSON line on its stdout, which the parent turns into `on_step` calls (the progress bar and the log
stay in the parent), and saves the final weights, which the parent loads. A rank that fails ends the
training with its error (bad input keeps its one-line message); none is left running.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from dreams_nas.supernet.builtin.training import TargetTrainConfig
from dreams_nas.supernet.core.errors import InputError

OnStep = Callable[[int, float, "float | None"], None]
_POLL_S = 0.5
_INPUTS = "inputs.pt"
_WEIGHTS = "rank0.pt"
_RESULT = "result.json"


def train_on_ranks(
    model: Any,
    cfg: TargetTrainConfig,
    *,
    ranks: int,
    threads_per_rank: int,
    data_seed: int,
    sample_offset: int = 0,
    on_step: OnStep | None = None,
) -> dict[str, Any]:
    """Train `model` (a built-in target LLaVA, in place) like `training.train_target`, over
    `ranks` local processes of `threads_per_rank` torch threads each; returns its result."""
    import torch

    if ranks < 1 or threads_per_rank < 1:
        raise InputError(f"{ranks} ranks x {threads_per_rank} threads: both must be >= 1")
    with tempfile.TemporaryDirectory(prefix="dreams-nas-ranks-") as tmp:
        folder = Path(tmp)
        torch.save({"config": model.config, "cfg": cfg, "data_seed": data_seed,
                    "sample_offset": sample_offset,
                    "state": {k: v.detach().cpu() for k, v in model.state_dict().items()}},
                   folder / _INPUTS)
        procs = [subprocess.Popen(  # noqa: S603 - our own module, no shell
            [sys.executable, "-m", __name__, "--folder", tmp, "--rank", str(rank),
             "--size", str(ranks), "--threads", str(threads_per_rank)],
            stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL, text=True)
            for rank in range(ranks)]
        try:
            _follow(procs, folder, on_step)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
                proc.wait()
                if proc.stdout is not None:
                    proc.stdout.close()
        model.load_state_dict(torch.load(folder / _WEIGHTS, weights_only=True))
        result = json.loads((folder / _RESULT).read_text(encoding="utf-8"))
    model.eval()
    return result


def _follow(procs: list[subprocess.Popen], folder: Path, on_step: OnStep | None) -> None:
    """Relay rank 0's step lines to `on_step` until every rank has exited; raise a rank's
    error as soon as one fails."""
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(procs[0].stdout, lines), daemon=True)
    reader.start()
    open_stream = True
    while open_stream or any(p.poll() is None for p in procs):
        for rank, proc in enumerate(procs):
            if proc.poll() not in (None, 0):
                _raise_rank_error(folder, rank, proc.returncode)
        try:
            line = lines.get(timeout=_POLL_S)
        except queue.Empty:
            continue
        if line is None:
            open_stream = False
            continue
        try:
            event = json.loads(line)
            step, loss, val = event["step"], event["loss"], event["val"]
        except (ValueError, KeyError, TypeError):  # something else printed: pass it on
            sys.stderr.write(line)
            continue
        if on_step is not None:
            on_step(step, loss, val)
    for rank, proc in enumerate(procs):
        if proc.returncode != 0:
            _raise_rank_error(folder, rank, proc.returncode)


def _read_lines(stream: IO[str] | None, lines: queue.Queue[str | None]) -> None:
    if stream is not None:
        for line in stream:
            if line.strip():
                lines.put(line)
    lines.put(None)


def _raise_rank_error(folder: Path, rank: int, code: int | None) -> None:
    try:
        error = json.loads((folder / f"error-{rank}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise RuntimeError(f"training rank {rank} exited with code {code}") from None
    if error.get("input_error"):
        raise InputError(error["message"])
    raise RuntimeError(f"training rank {rank} failed:\n{error['traceback']}")


def _rank_main(folder: Path, rank: int, size: int, threads: int) -> None:
    """One rank: rebuild the model, train, rank 0 saves the weights and the result."""
    import torch
    from dreams_nas.supernet.builtin.processor import build_processor
    from dreams_nas.supernet.builtin.training import Encoder, train_target
    from dreams_nas.supernet.core import dist
    from transformers import LlavaForConditionalGeneration

    torch.set_num_threads(threads)
    inputs = torch.load(folder / _INPUTS, weights_only=False)  # written by our parent
    world = dist.join("gloo", init_method=f"file://{folder / 'rendezvous'}", rank=rank,
                      size=size)
    try:
        model = LlavaForConditionalGeneration(inputs["config"])
        model.load_state_dict(inputs["state"])

        def report(step: int, loss: float, val: float | None) -> None:
            if rank == 0:
                print(json.dumps({"step": step, "loss": loss, "val": val}), flush=True)

        result = train_target(model, Encoder(build_processor()), inputs["cfg"],
                       data_seed=inputs["data_seed"], on_step=report,
                       sample_offset=inputs["sample_offset"], world=world)
        if rank == 0:
            torch.save(model.state_dict(), folder / _WEIGHTS)
            (folder / _RESULT).write_text(json.dumps(result), encoding="utf-8")
        world.barrier()
    finally:
        dist.leave()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one rank of `train_on_ranks` (internal)")
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        _rank_main(args.folder, args.rank, args.size, args.threads)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        error = {"input_error": isinstance(exc, InputError), "message": str(exc),
                 "traceback": traceback.format_exc()}
        tmp = args.folder / f".error-{args.rank}.json"
        tmp.write_text(json.dumps(error), encoding="utf-8")
        os.replace(tmp, args.folder / f"error-{args.rank}.json")
        return 2 if error["input_error"] else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
