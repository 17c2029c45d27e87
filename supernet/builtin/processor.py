"""The built-in target's processor: CLIP preprocessing at the synthetic tasks' size and the
word-level tokenizer with its chat template (saved with the target by `build`)."""

from __future__ import annotations

from typing import Any

from dreams_nas.supernet.builtin.word_tokenizer import CHAT_TEMPLATE, build_word_tokenizer
from dreams_nas.supernet.data.synth import CELL, IMAGE_SIZE, vocabulary_texts


def build_processor() -> Any:
    """The LlavaProcessor saved with the target: CLIP preprocessing + the word tokenizer."""
    from transformers import LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tokenizer = build_word_tokenizer(vocabulary_texts())
    # Resize/crop to the training size (a no-op on synthetic images); mean/std 0.5 maps
    # pixels to [-1, 1]. The PIL processor needs no torchvision; it saves as CLIPImageProcessor.
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=CELL,
                          vision_feature_select_strategy="default", num_additional_image_tokens=1,
                          chat_template=CHAT_TEMPLATE)
