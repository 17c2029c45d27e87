"""`dist.leave`: a rank that ended its work normally waits for every rank before destroying the
process group (gloo aborts a process whose peer tears down connections mid-message), and a
rank leaving on an error does not wait."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import torch.multiprocessing as mp


def _rank(rank: int, init: str, folder: str, synchronize: bool) -> None:
    from dreams_nas.supernet.core import dist

    dist.join("gloo", init_method=f"file://{init}", rank=rank, size=2, timeout_s=60)
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
