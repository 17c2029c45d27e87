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
    from dreams_nas.supernet.runfolder import RunFolder

    return RunFolder(tmp_path / "dreams-run")
