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


# A vocabulary large enough for the default space's draft vocabularies (`LARGE_VOCAB`), odd so
# that a quarter of it rounds up: ceil(0.25 * 16_001) = 4_001 rows.
LARGE_VOCAB = 16_001


@pytest.fixture(scope="session")
def large_vocab_llava(tmp_path_factory) -> str:
    """The folder of a saved tiny LLaVA as `tiny_llava` (2 layers, 4 visual tokens) with a
    vocabulary of LARGE_VOCAB tokens."""
    import torch
    import transformers as tf
    from _support.models import LLAVA_IMAGE_TOKEN, _llava_config

    config = _llava_config(LARGE_VOCAB, LLAVA_IMAGE_TOKEN, layers=2, patch_size=8)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = tf.LlavaForConditionalGeneration(config).eval()
    folder = tmp_path_factory.mktemp("large-vocab-llava")
    model.save_pretrained(folder)
    return str(folder)
