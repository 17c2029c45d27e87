"""Hold run-folder locks in another process: `hold(root, names)` starts one that takes them,
says so, and keeps them until it is stopped (`stop`) or killed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

_CODE = """
import sys
from dreams_nas.supernet.core.runlock import stage_lock
with stage_lock(sys.argv[1], sys.argv[2:], "dreams-nas search --trials 30"):
    print("held", flush=True)
    sys.stdin.read()
"""


def hold(root: Path, names: Sequence[str]) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _CODE, str(root), *names],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(timeout=30)
