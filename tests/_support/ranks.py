"""Several ranks on the CPU: `spawn` starts processes that join a gloo group (through a file,
no network) and run a task of this module, as `torchrun --nproc-per-node N` would.

Tasks are module functions (the spawn start method pickles them by name). A task may be told to
kill its rank mid-run (`kill`: rank, where, after how many calls), as a crash would: the
process exits at once, the launcher's other ranks are torn down, and a relaunch resumes."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

KILLED = 37  # the exit code of a rank this module kills


def spawn(task: Callable[..., Any], size: int, folder: Path, *args: Any) -> None:
    """Run `task(rank, *args)` in `size` processes joined as a gloo group; raises
    `torch.multiprocessing.ProcessExitedException` when a rank dies (the others are killed)."""
    import torch.multiprocessing as mp

    init = Path(folder) / f"gloo-{uuid.uuid4().hex}"  # a fresh rendezvous file per launch
    init.parent.mkdir(parents=True, exist_ok=True)
    init.touch()
    mp.start_processes(_entry, args=(task, size, str(init), args), nprocs=size,
                       start_method="spawn", join=True)


def _entry(rank: int, task: Callable[..., Any], size: int, init: str, args: tuple) -> None:
    import torch
    from dreams_nas.supernet.core import dist

    torch.set_num_threads(1)
    dist.join("gloo", init_method=f"file://{init}", rank=rank, size=size, timeout_s=120)
    try:
        task(rank, *args)
    except BaseException:
        dist.leave()
        raise
    dist.leave(synchronize=True)


def _kill_after(module: Any, name: str, calls: int) -> None:
    """Make `module.name` end this process after its `calls`-th call returns (`calls` 0: as
    its first call begins)."""
    original = getattr(module, name)
    seen = {"n": 0}

    def wrapped(*a: Any, **k: Any) -> Any:
        if calls == 0:
            os._exit(KILLED)
        out = original(*a, **k)
        seen["n"] += 1
        if seen["n"] >= calls:
            os._exit(KILLED)
        return out

    setattr(module, name, wrapped)


KILL_POINTS = {  # where a rank can be killed: (module, function)
    "shard": ("dreams_nas.supernet.training.feature_store", "_list_shard"),
    "step": ("dreams_nas.supernet.training.tppt", "_step_losses"),
    "score": ("dreams_nas.supernet.acceptance.table", "AcceptanceTable.append"),
}


def _arm(kill: Sequence[Any] | None, rank: int) -> None:
    if not kill or int(kill[0]) != rank:
        return
    import importlib

    module_name, attr = KILL_POINTS[kill[1]]
    owner: Any = importlib.import_module(module_name)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    _kill_after(owner, name, int(kill[2]))


def load_examples(path: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(**e) for e in json.loads(Path(path).read_text())]


def save_examples(examples: Sequence[Any], path: Path) -> str:
    path.write_text(json.dumps([{"id": e.id, "image_path": str(e.image_path),
                                 "prompt": e.prompt} for e in examples]))
    return str(path)


def train_task(rank: int, target_dir: str, examples_file: str, run_root: str,
               config: dict[str, Any], kill: Sequence[Any] | None = None,
               max_new_tokens: int = 16, holdout: int = 0, samples_per_shard: int = 3) -> None:
    """`train_run` of the tiny target (the run's feature store included) on this rank."""
    from dreams_nas.supernet.core.runfolder import RunFolder
    from dreams_nas.supernet.target.adapter import TargetAdapter
    from dreams_nas.supernet.training.config import TrainConfig
    from dreams_nas.supernet.training.recipe import SupernetRecipe, train_run

    _arm(kill, rank)
    train_run(RunFolder(run_root), TargetAdapter.load(target_dir),
              load_examples(examples_file), TrainConfig.from_dict(config),
              SupernetRecipe(max_new_tokens=max_new_tokens, aifd_prompts=2, holdout=holdout,
                             samples_per_shard=samples_per_shard), show_progress=False)


def score_task(rank: int, run_root: str, data: str, kill: Sequence[Any] | None = None,
               max_new_tokens: int = 16) -> None:
    """`score_run` of every subnet of the run's space on this rank's share."""
    from dreams_nas.nas.stages.score import ScoreOptions, score_run
    from dreams_nas.supernet.core.runfolder import RunFolder

    _arm(kill, rank)
    summary = score_run(RunFolder(run_root), ScoreOptions(
        data=data, max_new_tokens=max_new_tokens, device="cpu", show_progress=False))
    Path(run_root, f"score-summary-{rank}.json").write_text(json.dumps(summary))


def _perturb_importance(rank: int, noise: float) -> dict[int, Any]:
    """Make every head's and MLP channel's |grad x weight| on this rank differ from the other
    ranks' by `noise` times its mean (a rank-seeded draw), as a GPU's backward differs between
    ranks; returns the totals this rank alone accumulates (module id -> tensor)."""
    import torch
    from dreams_nas.supernet.draft.elastic import ElasticAttention
    from dreams_nas.supernet.draft.layers import SwiGLU

    gen = torch.Generator().manual_seed(1000 + rank)
    alone: dict[int, Any] = {}
    for cls, name in ((ElasticAttention, "head_importance"), (SwiGLU, "channel_importance")):
        original = getattr(cls, name)

        def perturbed(self: Any, _original: Any = original) -> Any:
            value = _original(self)
            value = value + noise * value.mean() * torch.randn(value.shape, generator=gen)
            alone[id(self)] = alone.get(id(self), 0) + value
            return value

        setattr(cls, name, perturbed)
    return alone


def importance_task(rank: int, out: str, noise: float, steps: int) -> None:
    """The tiny draft on random samples, its importances perturbed per rank (`noise`): with
    `steps` 0 the heads and channels sorted once (`sort_heads`), else `steps` training steps
    (the sort at the fifth). Saves the orders each rank alone would take, the orders taken and
    the weights before and after to `out`/rank-<rank>.pt."""
    import torch
    from dreams_nas.supernet.draft.elastic import importance_order
    from dreams_nas.supernet.training.batching import collate
    from dreams_nas.supernet.training.config import TrainConfig
    from dreams_nas.supernet.training.importance import sort_heads
    from dreams_nas.supernet.training.tppt import TrainingSet, train_supernet

    from _support.drafts import tiny_draft, tiny_samples

    alone = _perturb_importance(rank, noise)
    draft = tiny_draft(0, mlp_shares=(0.5, 1.0)).train()
    start = {k: v.clone() for k, v in draft.state_dict().items()}
    samples = tiny_samples(8)
    config = TrainConfig(warmup_steps=5, multires_steps=max(steps - 5, 0),
                         batch_size=4, unroll=0, calibration_batches=2, checkpoint_every=1000)
    if steps:
        orders = train_supernet(draft, TrainingSet(samples, (2,)), config,
                                show_progress=False).head_orders
    else:
        batches = [collate(samples[i:i + 4], draft.config.visual_in_self) for i in (0, 4)]
        orders = sort_heads(draft, batches, (2,), config)
    torch.save({"alone": [importance_order(t).tolist() for t in alone.values()],
                "orders": orders, "start": start, "weights": draft.state_dict()},
               Path(out, f"rank-{rank}.pt"))
