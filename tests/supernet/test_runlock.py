from __future__ import annotations

import os
import signal

import pytest
from _support.holder import hold, stop
from dreams_nas.supernet.core.runlock import RunFolderBusy, lock_path, stage_lock


def test_a_second_writer_is_refused_naming_the_first(tmp_path) -> None:
    proc = hold(tmp_path, ["search-cpu-x-1t"])
    try:
        with pytest.raises(RunFolderBusy) as caught, stage_lock(tmp_path, ["search-cpu-x-1t"]):
            pass
        text = str(caught.value)
        assert "\n" not in text
        assert f"`dreams-nas search --trials 30` (pid {proc.pid} on " in text
        assert f"is writing search-cpu-x-1t of the run folder {tmp_path}" in text
        assert "pass another --run folder" in text
        with stage_lock(tmp_path, ["search-cpu-y-1t"]):  # another lock is free
            pass
    finally:
        stop(proc)
    with stage_lock(tmp_path, ["search-cpu-x-1t"]):  # released when its holder ends
        assert lock_path(tmp_path, "search-cpu-x-1t").read_text().startswith("{")


def test_a_killed_holder_leaves_no_stale_lock(tmp_path) -> None:
    proc = hold(tmp_path, ["supernet"])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    with stage_lock(tmp_path, ["supernet"]):
        pass


def test_locks_nest_within_one_process_and_all_or_none_are_held(tmp_path) -> None:
    proc = hold(tmp_path, ["acceptance-d"])
    try:
        with stage_lock(tmp_path, ["search-h"]):
            with stage_lock(tmp_path, ["search-h", "supernet"]):  # a search that trains
                pass
            with pytest.raises(RunFolderBusy), stage_lock(tmp_path, ["supernet", "acceptance-d"]):
                pass
            # the refused call released what it had taken; the outer lock is still held
            assert hold_fails(tmp_path, "search-h") and not hold_fails(tmp_path, "supernet")
    finally:
        stop(proc)


def hold_fails(root, name: str) -> bool:
    import subprocess
    import sys

    code = ("import sys; from dreams_nas.supernet.core.runlock import stage_lock\n"
            "with stage_lock(sys.argv[1], [sys.argv[2]]): pass")
    return subprocess.run([sys.executable, "-c", code, str(root), name],
                          capture_output=True).returncode != 0
