"""The tiny demo run several modules read: `dreams-nas demo` on the tiny built-in target with every
stage at test size, built once per test run and shared by its xdist workers (the `builtin_cache`
and `tiny_demo` fixtures of tests/conftest.py, `_support.shared`). Readers that write to a run
folder work on a copy (`TinyDemo.copy`)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# `dreams-nas demo` at test size; tests/nas/test_demo.py reruns exactly this command line. Two
# context lengths around the search's (the tiny eval prompts, ~45-51 tokens, plus half the
# answer): a search outside the profiled contexts is refused.
DEMO_ARGS = ("--device", "cpu", "--profile-budget", "4", "--train-prompts", "3",
             "--train-steps", "1", "--repeats", "2", "--context-lengths", "40", "64",
             "--threads", "1", "--limit", "2", "--max-new-tokens", "5", "--verify-prompts", "1")


@dataclass(frozen=True)
class TinyDemo:
    cache: Path  # the DREAMS_NAS_CACHE it was built with, holding the tiny built-in target
    root: Path  # its run folder: read it, never write to it
    summary: dict[str, Any]  # the demo's --json summary
    stderr: str  # what the quiet demo wrote on stderr

    def copy(self, dest: Path) -> Path:
        """A copy of the run folder at `dest` (modification times kept, so reuse checks see
        the same order of files)."""
        shutil.copytree(self.root, dest)
        return dest

    def env(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Point the `dreams-nas` commands at the cache and the tiny variant it was built with."""
        monkeypatch.setenv("DREAMS_NAS_CACHE", str(self.cache))
        monkeypatch.setenv("DREAMS_NAS_DEMO_VARIANT", "tiny")


def build_builtin_cache(folder: Path) -> Path:
    from dreams_nas.supernet.builtin.cache import ensure_builtin_target

    ensure_builtin_target(folder, variant="tiny", progress=False, threads=1)
    return folder


def build_tiny_demo(cache: Path, root: Path) -> TinyDemo:
    """Runs the demo (one torch thread, the quick latency fits of `_support.fits`, which the nas
    tests that refit its predictor use too) into `root`; its summary and stderr are kept beside
    `root` for `read_tiny_demo`."""
    from dreams_nas.supernet.core.device import torch_threads

    from _support.cli import call_cli
    from _support.fits import quick_latency_fits

    with pytest.MonkeyPatch.context() as mp, torch_threads(1), quick_latency_fits():
        mp.setenv("DREAMS_NAS_CACHE", str(cache))
        mp.setenv("DREAMS_NAS_DEMO_VARIANT", "tiny")
        code, summary, err = call_cli("demo", "--run", str(root), *DEMO_ARGS)
    assert code == 0, err
    (root.parent / _SUMMARY).write_text(json.dumps(summary))
    (root.parent / _STDERR).write_text(err)
    return TinyDemo(cache=cache, root=root, summary=summary, stderr=err)


_SUMMARY, _STDERR = "demo-summary.json", "demo-stderr.txt"


def read_tiny_demo(cache: Path, root: Path) -> TinyDemo:
    """The `TinyDemo` that `build_tiny_demo(cache, root)` built (in this process or another)."""
    return TinyDemo(cache=cache, root=root,
                    summary=json.loads((root.parent / _SUMMARY).read_text()),
                    stderr=(root.parent / _STDERR).read_text())
