"""Train the demo target data parallel over several local processes (gloo, one host).

The demo target's training step is a few hundred small matrix products: on a 2-core machine one
process at two threads runs it no faster than at one thread, while two one-thread processes each
taking half the batch run twice the steps per second. `train_on_ranks` spawns `ranks` processes,
joins them in a gloo group through a rendezvous file, and runs `training.train` in each with
`World` set (each rank half of every global batch, gradients averaged, the same stop); the
parent keeps the progress bar and the log (the ranks send their steps over a queue) and loads
rank 0's final weights. A rank that fails ends the build with its error; none is left running.
"""

from __future__ import annotations

import logging
import queue
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.demo.training import DemoTrainConfig

log = logging.getLogger("dreams_nas")
OnStep = Callable[[int, float, "float | None"], None]
_POLL_S = 1.0


def train_on_ranks(
    model: Any,
    cfg: DemoTrainConfig,
    *,
    ranks: int,
    threads_per_rank: int,
    data_seed: int,
    sample_offset: int = 0,
    on_step: OnStep | None = None,
) -> dict[str, Any]:
    """Train `model` (a demo-target LLaVA, in place) like `training.train`, over `ranks` local
    processes of `threads_per_rank` torch threads each; returns `train`'s result."""
    import torch
    import torch.multiprocessing as mp

    if ranks < 1 or threads_per_rank < 1:
        raise InputError(f"{ranks} ranks x {threads_per_rank} threads: both must be >= 1")
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="dreams-nas-ranks-") as tmp:
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        weights = Path(tmp) / "rank0.pt"
        procs = [ctx.Process(target=_rank_main, daemon=True,
                             args=(rank, ranks, f"file://{tmp}/rendezvous", threads_per_rank,
                                   model.config, state, cfg, data_seed, sample_offset,
                                   str(weights), events))
                 for rank in range(ranks)]
        try:
            for proc in procs:
                proc.start()
            result = _follow(events, procs, on_step)
            for proc in procs:
                proc.join()
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
                    proc.join()
        model.load_state_dict(torch.load(weights, weights_only=True))
    model.eval()
    return result


def _follow(events: Any, procs: list[Any], on_step: OnStep | None) -> dict[str, Any]:
    """Relay the ranks' step events to `on_step` until rank 0 reports its result."""
    while True:
        try:
            kind, *payload = events.get(timeout=_POLL_S)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a training rank exited with code {dead[0].exitcode} "
                                   "before finishing") from None
            continue
        if kind == "step":
            if on_step is not None:
                on_step(*payload)
        elif kind == "done":
            return payload[0]
        else:  # "error": bad input keeps its one-line message, anything else its traceback
            rank, message, text = payload
            if message is not None:
                raise InputError(message)
            raise RuntimeError(f"training rank {rank} failed:\n{text}")


def _rank_main(rank: int, size: int, init_method: str, threads: int, config: Any,
               state: dict[str, Any], cfg: DemoTrainConfig, data_seed: int, sample_offset: int,
               weights: str, events: Any) -> None:
    """One rank: rebuild the model from `config` + `state`, train, rank 0 saves and reports."""
    import torch
    from dreams_nas.supernet.core import dist
    from dreams_nas.supernet.demo.build import build_processor
    from dreams_nas.supernet.demo.training import Encoder, train
    from transformers import LlavaForConditionalGeneration

    try:
        torch.set_num_threads(threads)
        world = dist.join("gloo", init_method=init_method, rank=rank, size=size)
        try:
            model = LlavaForConditionalGeneration(config)
            model.load_state_dict(state)

            def report(step: int, loss: float, val: float | None) -> None:
                if rank == 0:
                    events.put(("step", step, loss, val))

            result = train(model, Encoder(build_processor()), cfg, data_seed=data_seed,
                           on_step=report, sample_offset=sample_offset, world=world)
            if rank == 0:
                torch.save(model.state_dict(), weights)
                events.put(("done", result))
            world.barrier()
        finally:
            dist.leave()
    except BaseException as exc:  # report, then exit non-zero: the parent stops the others
        message = str(exc) if isinstance(exc, InputError) else None
        events.put(("error", rank, message, traceback.format_exc()))
        raise
