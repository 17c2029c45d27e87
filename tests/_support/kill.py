"""Kill a `dreams-nas profile` subprocess once its profile holds a few rows (resume tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def kill_after_rows(argv: list[str], run, rows: int = 5, timeout: float = 120) -> Path:
    """Start `argv`, SIGKILL it once the run's (only) profile.csv holds `rows` rows; the
    profile's path. Fails with the child's stderr if it ended on its own."""
    child = subprocess.Popen(argv, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    csv = None
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and child.poll() is None:
            ids = run.hardware_ids()
            if ids:
                csv = run.profile_csv(ids[0])
                if csv.is_file() and csv.read_text().count("\n") >= rows + 1:  # + the header
                    break
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
    assert child.returncode == -signal.SIGKILL, child.stderr.read().decode()[-2000:]
    assert csv is not None
    return csv
