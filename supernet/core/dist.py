"""Several processes, one run: `torch.distributed` as `torchrun` launches it.

`dreams-nas train` and `dreams-nas score` run under the ordinary PyTorch launcher
(`torchrun --nproc-per-node N -m dreams_nas.nas.cli train ...`, on one host or several sharing
the run folder): the launcher sets RANK, WORLD_SIZE and LOCAL_RANK, `process_group` joins the
group (NCCL on GPUs, gloo on CPUs; a gloo side group carries the small control messages either
way), and the library reads the rank from `current()` where it splits work:

- the self-distilled answers and the feature store's shards are split by rank
  (`training.recipe`, `training.store`), rank 0 merges the indexes;
- training is data parallel (`training.tppt`: each rank a slice of the same global batch,
  the gradients averaged over the ranks, `World.average`);
- scoring splits the architectures (`nas.stages.score`).

Without a launcher (or with one process) `current()` is `SINGLE`, whose collectives are
no-ops, so one code path serves both.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from dreams_nas.supernet.core.errors import InputError

log = logging.getLogger("dreams_nas")
T = TypeVar("T")
# How long a rank waits in a collective for the others (a dead peer ends the run after this).
DEFAULT_TIMEOUT_S = 1800.0
_CONTROL: Any = None  # the gloo group of control messages (objects, flags, counts)


@dataclass(frozen=True)
class World:
    """This process's place in the group: `rank` of `size` processes, `local_rank` on its host."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def mine(self, items: Sequence[T]) -> list[T]:
        """The items this rank takes: every `size`-th from `rank` (a fixed, balanced split)."""
        return list(items[self.rank::self.size])

    def owns(self, index: int) -> bool:
        return index % self.size == self.rank

    # --- collectives (no-ops in one process) --------------------------------------------
    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier(group=_CONTROL)

    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj` on every rank."""
        if not self.distributed:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=_CONTROL)
        return box[0]

    def gather(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=_CONTROL)
        return out

    def sum(self, values: Sequence[float]) -> list[float]:
        """The element-wise sum of `values` over the ranks (float64)."""
        if not self.distributed:
            return [float(v) for v in values]
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64)
        dist.all_reduce(tensor, group=_CONTROL)
        return tensor.tolist()

    def sum_tensors(self, tensors: Sequence[Any]) -> list[Any]:
        """Each tensor's element-wise sum over the ranks, on its own device and dtype: one
        all-reduce, in float64 on the control group, whose single result every rank receives
        (the same bits on every rank, whatever each rank's device computes)."""
        if not self.distributed or not tensors:
            return list(tensors)
        import torch
        import torch.distributed as dist

        flat = torch.cat([t.detach().reshape(-1).to("cpu", torch.float64) for t in tensors])
        dist.all_reduce(flat, group=_CONTROL)
        out, offset = [], 0
        for t in tensors:
            out.append(flat[offset: offset + t.numel()].view_as(t).to(t.device, t.dtype))
            offset += t.numel()
        return out

    def average(self, params: Sequence[Any], bucket_bytes: int = 64 << 20) -> None:
        """Replace each parameter's gradient by its mean over the ranks, in all-reduces of
        flattened buckets of about `bucket_bytes` on the default group (NCCL between GPUs).
        A parameter without a gradient on every rank keeps none (the optimizer skips it, as
        in one process); one with a gradient on some ranks counts zeros on the others."""
        if not self.distributed:
            return
        import torch
        import torch.distributed as dist

        has = self.sum([0.0 if p.grad is None else 1.0 for p in params])
        params = [p for p, n in zip(params, has, strict=True) if n > 0]
        for param in params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        bucket: list[Any] = []
        size = 0
        for param in [*params, None]:
            if param is not None:
                bucket.append(param)
                size += param.numel() * param.grad.element_size()
            if bucket and (param is None or size >= bucket_bytes):
                flat = torch.cat([p.grad.reshape(-1) for p in bucket])
                dist.all_reduce(flat)
                flat /= self.size
                offset = 0
                for p in bucket:
                    n = p.numel()
                    p.grad.copy_(flat[offset: offset + n].view_as(p.grad))
                    offset += n
                bucket, size = [], 0

    def any(self, flag: bool) -> bool:
        """True on every rank when it is True on any."""
        return self.sum([1.0 if flag else 0.0])[0] > 0


SINGLE = World()


def launched() -> bool:
    """Whether a launcher (torchrun) started this process as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1


def current() -> World:
    """This process's `World`: from the initialised process group, else `SINGLE`."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed support
        return SINGLE
    if not (dist.is_available() and dist.is_initialized()):
        return SINGLE
    return World(dist.get_rank(), dist.get_world_size(),
                 int(os.environ.get("LOCAL_RANK", dist.get_rank())))


def local_device(device: str) -> str:
    """`device` for this rank: a CUDA device without an explicit choice becomes the rank's
    own (`cuda:LOCAL_RANK`), one GPU per process as torchrun intends."""
    world = current()
    if world.distributed and device.startswith("cuda"):
        return f"cuda:{world.local_rank}"
    return device


def backend_for(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def join(backend: str, *, init_method: str | None = None, rank: int | None = None,
         size: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> World:
    """Initialise the process group (and the control group); returns this process's World.
    Without `init_method`/`rank`/`size` the launcher's environment says where to meet."""
    global _CONTROL
    import torch
    import torch.distributed as dist

    if not dist.is_available():  # pragma: no cover - torch without distributed support
        raise InputError("this torch build has no torch.distributed; launch without torchrun")
    # `torch.distributed.nn.functional` binds the default group into its functions' defaults
    # when it is imported (transformers imports it on loading a model): imported after the
    # group exists, it keeps the group alive past `destroy_process_group`, gloo's threads and
    # sockets with it, until the interpreter's exit tears them down under a peer's feet
    # ("terminate called without an active exception"). Imported now, it binds None.
    import torch.distributed.nn.functional  # noqa: F401

    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank or 0)))
    kwargs: dict[str, Any] = {"backend": backend, "timeout": timeout}
    if init_method is not None:
        kwargs.update(init_method=init_method, rank=rank, world_size=size)
    dist.init_process_group(**kwargs)
    _CONTROL = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
    world = current()
    log.debug("rank %d of %d joined the %s group", world.rank, world.size, backend)
    return world


def leave(synchronize: bool = False) -> None:
    """Destroy the process group: its gloo threads and connections end here, while the
    interpreter still runs (`join` says what kept them to the exit before). `synchronize` (a
    rank that ended its work normally) waits for every rank first, so that no rank tears down
    its connections while a peer's last messages to it are in flight (gloo aborts the process
    then); a rank leaving on an error does not wait, since a peer may be gone."""
    global _CONTROL
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if synchronize and dist.get_world_size() > 1:
            dist.barrier(group=_CONTROL)
        dist.destroy_process_group()
    _CONTROL = None


@contextmanager
def process_group(device: str) -> Iterator[World]:
    """Inside a launcher with several processes: join the group for `device`'s backend for the
    block (and leave it after); otherwise `SINGLE`."""
    if not launched():
        yield current()
        return
    world = join(backend_for(device))
    try:
        yield world
    except BaseException:
        leave()
        raise
    leave(synchronize=True)
