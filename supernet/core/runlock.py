"""One writer per run-folder stage: an advisory lock a second writer is refused by, in one line.

Two searches of one run folder would both score every subnet, measure under each other's load
and overwrite each other's best.json; two trainings would write one supernet twice. Each stage
that writes shared files holds the lock of what it writes for as long as it runs
(``<run>/.locks/<what>.lock``: ``supernet``, ``latency-<hardware-id>``,
``acceptance-<dataset-id>``, ``search-<hardware-id>``), and a second command that needs the
same lock is **refused at once** (exit 2) with the holder's command, process and start time:
it does not wait, since a search or a profile waited for would measure a machine the first
one has just loaded, and a queue of commands is the shell's to keep.

The lock is `flock(2)` on the file (Linux and macOS; NFS emulates it with POSIX locks): the
kernel drops it when its process ends, however it ends, so a killed command never leaves a
stale lock behind. Under torchrun the launch's rank 0 holds it for every rank (its ranks share
the folder on purpose); a second launch's rank 0 is refused and its launcher ends the rest.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from dreams_nas.supernet.core.errors import InputError

LOCKS = ".locks"


class RunFolderBusy(InputError):
    """Another command holds a lock this command needs (exit 2)."""


def lock_path(root: str | Path, what: str) -> Path:
    return Path(root) / LOCKS / f"{what}.lock"


def _holder(handle: int) -> str:
    """Who holds the lock, from what it wrote into the file ('another command' if unreadable)."""
    try:
        os.lseek(handle, 0, os.SEEK_SET)
        info = json.loads(os.read(handle, 4096).decode("utf-8"))
        return (f"`{info['command']}` (pid {info['pid']} on {info['host']}, since "
                f"{info['since']})")
    except (OSError, ValueError, KeyError, TypeError):
        return "another command"


def _acquire(root: Path, what: str, command: str) -> int:
    import fcntl

    path = lock_path(root, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(handle)
        os.close(handle)
        raise RunFolderBusy(
            f"{holder} is writing {what} of the run folder {root}; wait for it to end (or stop "
            f"it), or pass another --run folder") from None
    except BaseException:
        os.close(handle)
        raise
    info = {"command": command, "pid": os.getpid(), "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(handle, 0)
    os.pwrite(handle, json.dumps(info).encode("utf-8"), 0)
    return handle


def _release(handle: int) -> None:
    import fcntl

    with contextlib.suppress(OSError):
        os.ftruncate(handle, 0)
    fcntl.flock(handle, fcntl.LOCK_UN)
    os.close(handle)


@contextlib.contextmanager
def stage_lock(root: str | Path, what: Sequence[str], command: str | None = None
               ) -> Iterator[None]:
    """Hold the locks `what` of the run folder `root` (in this order) while the block runs;
    a lock another process holds raises `RunFolderBusy` naming it. Re-entrant within a process
    (a search that trains takes ``supernet`` inside its own locks; the demo runs every stage).
    Ranks other than 0 of a torchrun launch take nothing (rank 0 holds them for the launch)."""
    root = Path(root)
    if "torch.distributed" in sys.modules and _rank() != 0:  # no group without that module
        yield
        return
    command = command or "dreams-nas " + " ".join(sys.argv[1:2])
    taken: list[tuple[str, int]] = []
    try:
        for name in what:
            key = str(lock_path(root, name).resolve())
            if key in _HELD:
                _HELD[key][1] += 1
                taken.append((key, -1))
                continue
            handle = _acquire(root, name, command)
            _HELD[key] = [handle, 1]
            taken.append((key, handle))
        yield
    finally:
        for key, _ in reversed(taken):
            _HELD[key][1] -= 1
            if _HELD[key][1] == 0:
                _release(_HELD.pop(key)[0])


def _rank() -> int:
    from dreams_nas.supernet.core.dist import current

    return current().rank


_HELD: dict[str, list[int]] = {}  # this process's locks: resolved path -> [fd, depth]
