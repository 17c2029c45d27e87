"""Fixtures for latency tests: a tiny LLaVA checkpoint on disk and a small run folder."""

from __future__ import annotations

import pytest


def save_tiny_llava(folder) -> str:
    """A real LlavaForConditionalGeneration (hidden 32, 2 layers, 16x16 images, 4 visual tokens)."""
    import torch
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    torch.manual_seed(0)
    text = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=4, vocab_size=96, max_position_embeddings=512)
    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=2, image_size=16, patch_size=8)
    model = LlavaForConditionalGeneration(LlavaConfig(text_config=text, vision_config=vision,
                                                      image_token_index=95))
    model.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def tiny_llava(tmp_path_factory) -> str:
    return save_tiny_llava(tmp_path_factory.mktemp("tiny-llava"))


@pytest.fixture
def small_run(run_dir):
    from dreams_nas.supernet.core.space import SearchSpace

    run_dir.save_space(SearchSpace(heads=(1, 4), visual_keep=(0.5, 1.0), inject_layer=(1, 2),
                                   draft_len=(1, 2, 3)))
    return run_dir
