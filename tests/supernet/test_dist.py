"""`dist.leave`: a rank that ended its work normally waits for every rank before destroying the
process group (gloo aborts a process whose peer tears down connections mid-message), and a
rank leaving on an error does not wait; the group's threads end there, not at the interpreter's
exit; `World.sum_tensors` sums tensors over the ranks."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
import torch.multiprocessing as mp


def _rank(rank: int, init: str, folder: str, synchronize: bool) -> None:
    import torch.distributed
    from dreams_nas.supernet.core import dist

    dist.join("gloo", init_method=f"file://{init}", rank=rank, size=2, timeout_s=60)
    # both ranks connected before either works: a rank that left while its peer's gloo was
    # still connecting failed that peer's join ("Connection closed by peer", ~1 in 8 runs)
    torch.distributed.barrier()
    if rank == 0:
        time.sleep(1.0)  # rank 0 ends its work late
        Path(folder, "zero-done").touch()
    dist.leave(synchronize=synchronize)
    if rank == 1:
        seen = Path(folder, "zero-done").exists()
        Path(folder, "one-saw").write_text("yes" if seen else "no")


def _launch(folder: Path, synchronize: bool) -> str:
    init = folder / f"gloo-{uuid.uuid4().hex}"
    init.touch()
    mp.start_processes(_rank, args=(str(init), str(folder), synchronize), nprocs=2,
                       start_method="spawn", join=True)
    return (folder / "one-saw").read_text()


def test_a_synchronized_leave_waits_for_every_rank(tmp_path: Path) -> None:
    assert _launch(tmp_path, synchronize=True) == "yes"


def test_an_unsynchronized_leave_does_not_wait(tmp_path: Path) -> None:
    # The same launch without the barrier: rank 1 leaves while rank 0 still works, which is
    # what a rank leaving on an error does (its peers may be gone) and what the test above
    # shows the barrier prevents.
    assert _launch(tmp_path, synchronize=False) == "no"


def test_leave_outside_a_group_is_a_no_op() -> None:
    from dreams_nas.supernet.core import dist

    dist.leave(synchronize=True)
    assert dist.current() == dist.SINGLE


def _gloo_threads() -> list[str]:
    """The names of this process's gloo threads (its tcp loop, the group's workers)."""
    names = (Path(f"/proc/self/task/{t}/comm").read_text().strip()
             for t in os.listdir("/proc/self/task"))
    return sorted(n for n in names if "gloo" in n)


def _leaving_rank(rank: int, init: str, folder: str) -> None:
    import torch
    from dreams_nas.supernet.core import dist

    world = dist.join("gloo", init_method=f"file://{init}", rank=rank, size=2, timeout_s=60)
    # what transformers does on loading a model: this module binds the default group into its
    # functions' defaults when it is imported, which kept the group (and gloo's threads and
    # sockets) alive past `destroy_process_group` until the interpreter's exit
    import torch.distributed.nn.functional  # noqa: F401

    summed = world.sum_tensors([torch.tensor([1.0, rank]), torch.tensor([[2.0 * rank]])])
    during = _gloo_threads()
    dist.leave(synchronize=True)
    Path(folder, f"rank-{rank}").write_text(repr(
        ([t.tolist() for t in summed], bool(during), _gloo_threads())))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_leaving_ends_the_groups_threads(tmp_path: Path) -> None:
    init = tmp_path / f"gloo-{uuid.uuid4().hex}"
    init.touch()
    mp.start_processes(_leaving_rank, args=(str(init), str(tmp_path)), nprocs=2,
                       start_method="spawn", join=True)
    for rank in (0, 1):
        summed, had_threads, left = eval((tmp_path / f"rank-{rank}").read_text())
        assert summed == [[2.0, 1.0], [[2.0]]]  # the sums over both ranks, in their shapes
        assert had_threads and left == [], f"rank {rank}: {left} still running after leave"
