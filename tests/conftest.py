"""Shared fixtures. Tests build tiny models from configs and never touch the network; the
builders live in the package `_support` (tests/_support), imported where they are used so that
collecting torch-free tests stays quick."""

from __future__ import annotations

import os

import pytest

# No test may reach a hub: model code must load from configs or folders the tests write.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist (pyproject's addopts: one worker per core, at most 2) each worker, and each
# process it starts, runs torch on one intra-op thread: two workers of two threads each on two
# cores spin OpenMP threads against each other. Set before any test module imports torch.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("cuda") for item in items) and not _has_cuda():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
        for item in items:
            if item.get_closest_marker("cuda"):
                item.add_marker(skip)
    _slow_modules_first(items)


def _slow_modules_first(items: list[pytest.Item]) -> None:
    """Modules holding a `slow` test run first, each module's tests kept together and in order:
    xdist hands out whole modules (`--dist loadscope --no-loadscope-reorder`) in this order, so
    the long ones start early and the run ends on short ones, not on one worker's last long
    module while the other idles. Every worker computes the same order."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: collection order otherwise


@pytest.fixture
def run_dir(tmp_path):
    """An empty run folder in the test's temporary directory."""
    from dreams_nas.supernet.core.runfolder import RunFolder

    return RunFolder(tmp_path / "dreams-run")


@pytest.fixture(scope="session")
def tiny_vlm():
    """tiny_vlm(family) -> (model, processor): a random tiny VLM (`_support.models`), built once
    per session.

    Families: llava, llava_next, pixtral, mistral3, idefics3, smolvlm, qwen2_vl, qwen2_5_vl."""
    from _support.models import build_tiny_vlm

    built: dict = {}

    def get(family: str = "llava"):
        if family not in built:
            built[family] = build_tiny_vlm(family)
        return built[family]

    return get


@pytest.fixture(scope="session")
def tiny_target(tiny_vlm):
    """tiny_target(family) -> TargetAdapter over the session's tiny VLM of that family."""
    from dreams_nas.supernet.target.adapter import TargetAdapter

    adapters: dict = {}

    def get(family: str = "llava"):
        if family not in adapters:
            adapters[family] = TargetAdapter.from_model(*tiny_vlm(family))
        return adapters[family]

    return get


@pytest.fixture(scope="session")
def tiny_models():
    """The `_support.models` module (build_tiny_vlm, save_tiny_vlm, tiny_image, PROMPTS)."""
    from _support import models

    return models


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for the whole module, module-scoped fixtures included (use it with
    `pytestmark = pytest.mark.usefixtures("one_thread")`); the thread count is restored after.
    Tiny models on a shared 2-core machine: one intra-op thread avoids OpenMP oversubscription."""
    from dreams_nas.supernet.core.device import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def builtin_cache(tmp_path_factory):
    """A DREAMS_NAS_CACHE folder holding the tiny built-in target, built once per test run (and
    shared by the xdist workers, `_support.shared`)."""
    from _support.demo import build_builtin_cache
    from _support.shared import shared_folder

    return shared_folder(tmp_path_factory, "demo-cache", build_builtin_cache)


@pytest.fixture(scope="session")
def tiny_demo(builtin_cache, tmp_path_factory):
    """`dreams-nas demo` at test size (`_support.demo.DEMO_ARGS`) on the tiny built-in target, run
    once per test run (shared by the xdist workers): a `_support.demo.TinyDemo`. Read its folder;
    copy it to write."""
    from _support.demo import build_tiny_demo, read_tiny_demo
    from _support.shared import shared_folder

    folder = shared_folder(tmp_path_factory, "tiny-demo",
                           lambda into: build_tiny_demo(builtin_cache, into / "run"))
    return read_tiny_demo(builtin_cache, folder / "run")
