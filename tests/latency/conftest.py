"""Fixtures for latency tests: a tiny LLaVA checkpoint on disk and a small run folder."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_llava(tmp_path_factory) -> str:
    """The folder of a saved tiny LLaVA (2 layers, 4 visual tokens, no processor)."""
    from _support.models import save_tiny_llava

    return save_tiny_llava(tmp_path_factory.mktemp("tiny-llava"))


@pytest.fixture
def small_run(run_dir):
    from dreams_nas.supernet.core.space import SearchSpace

    run_dir.save_space(SearchSpace(heads=(1, 4), visual_keep=(0.5, 1.0), inject_layer=(1, 2),
                                   draft_len=(1, 2, 3)))
    return run_dir
