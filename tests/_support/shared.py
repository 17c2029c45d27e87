"""Artefacts built once per test run and shared by every pytest-xdist worker: the folder
`shared_folder` returns lives beside the workers' own temporary folders (in the run's base
temporary folder), and the first worker to ask builds it under a file lock while the others
wait, then read it. Without xdist it is built once per session as before.

A shared folder is read-only to the tests: a test that writes copies it first (as
`TinyDemo.copy` does)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

DONE = ".shared-done"  # written last: a folder without it is half-built (its builder failed)


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base temporary folder of this test run, shared by its xdist workers (each worker's
    own base is a `popen-gwN` folder inside it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_folder(tmp_path_factory: pytest.TempPathFactory, name: str,
                  build: Callable[[Path], None]) -> Path:
    """`run_root()/name`, built by `build(folder)` once per test run (any worker), else read."""
    folder = run_root(tmp_path_factory) / f"shared-{name}"
    done = folder / DONE
    if done.is_file():
        return folder
    with FileLock(str(folder) + ".lock"):
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)  # a builder that failed halfway
            folder.mkdir(parents=True)
            build(folder)
            done.touch()
    return folder
