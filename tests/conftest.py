"""Shared fixtures. Tests build tiny models from configs and never touch the network."""

from __future__ import annotations

import os

import pytest

# No test may reach a hub: model code must load from configs or folders the tests write.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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


@pytest.fixture
def run_dir(tmp_path):
    """An empty run folder in the test's temporary directory."""
    from dreams_nas.supernet.core.runfolder import RunFolder

    return RunFolder(tmp_path / "dreams-run")


def _tiny_models():
    """tests/supernet/tiny_models.py as the module `tiny_models` (tiny VLMs of every family)."""
    import importlib.util
    import sys
    from pathlib import Path

    if "tiny_models" not in sys.modules:
        path = Path(__file__).parent / "supernet" / "tiny_models.py"
        spec = importlib.util.spec_from_file_location("tiny_models", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["tiny_models"] = module
        spec.loader.exec_module(module)
    return sys.modules["tiny_models"]


@pytest.fixture(scope="session")
def tiny_vlm():
    """tiny_vlm(family) -> (model, processor): a random tiny VLM, built once per session.

    Families: llava, llava_next, pixtral, idefics3, smolvlm, qwen2_vl, qwen2_5_vl."""
    built: dict = {}

    def get(family: str = "llava"):
        if family not in built:
            built[family] = _tiny_models().build_tiny_vlm(family)
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
    """The tests/supernet/tiny_models.py module (build_tiny_vlm, save_tiny_vlm, tiny_image, PROMPTS)."""
    return _tiny_models()
