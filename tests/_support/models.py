"""Tiny random VLMs of every supported family, built from configs (no network).

`build_tiny_vlm(family)` returns ``(model, processor)``: a real Hugging Face model class with a
random tiny config (hidden 32, 2 text layers, 16x16 images) and a real processor around a
word-level tokenizer built in memory, with a chat template that puts the image first.
`save_tiny_vlm(family, folder)` writes both with ``save_pretrained`` so loading paths are
exercised too.

`build_tiny_llava(seed, layers)` is the bare LLaVA of the draft and training tests (vocab 60, no
processor; `tiny_prompts` are its inputs) and `save_tiny_llava(folder)` the checkpoint of the
latency tests (2 layers, 8x8 patches: 4 visual tokens, no processor). All the LLaVAs here share
one config builder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from _support.processing import (
    IMAGE_STRINGS,
    VOCAB_SIZE,
    TinyProcessor,
    build_tokenizer,
    chat_template,
)

FAMILIES = ("llava", "llava_next", "pixtral", "mistral3", "idefics3", "smolvlm", "qwen2_vl",
            "qwen2_5_vl")
CLIP = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
            image_size=16, patch_size=4, projection_dim=32)
LLAVA_VOCAB, LLAVA_IMAGE_TOKEN = 60, 4  # the bare LLaVA: "<image>" is id 4 as in the tokenizer


def _text_kwargs(vocab: int, **extra) -> dict:
    base = dict(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
    )
    base.update(extra)
    return base


def _llava_config(vocab: int, image_token_id: int, *, layers: int = 2, patch_size: int = 4):
    """LLaVA over CLIP 16x16 images: (16 / patch_size)^2 visual tokens."""
    import transformers as tf

    return tf.LlavaConfig(
        vision_config=tf.CLIPVisionConfig(**{**CLIP, "patch_size": patch_size}),
        text_config=tf.LlamaConfig(**_text_kwargs(vocab, num_hidden_layers=layers)),
        image_token_id=image_token_id, vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )


def build_tiny_vlm(family: str, *, seed: int = 0, dtype: torch.dtype = torch.float32):
    """(model, processor) of `family` with random tiny weights, in eval mode."""
    import transformers as tf

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; pick one of {FAMILIES}")
    tok = build_tokenizer()
    ids = tok.convert_tokens_to_ids
    template = chat_template(IMAGE_STRINGS[family])
    llama = tf.LlamaConfig(**_text_kwargs(VOCAB_SIZE))
    if family == "llava":
        config = _llava_config(VOCAB_SIZE, ids("<image>"))
        model_cls = tf.LlavaForConditionalGeneration
        processor = tf.LlavaProcessor(
            image_processor=tf.CLIPImageProcessorPil(size={"shortest_edge": 16},
                                                     crop_size={"height": 16, "width": 16}),
            tokenizer=tok, patch_size=4, vision_feature_select_strategy="default",
            num_additional_image_tokens=1, chat_template=template,
        )
    elif family == "llava_next":
        pinpoints = [[16, 16], [16, 32], [32, 16], [32, 32]]
        config = tf.LlavaNextConfig(
            vision_config=tf.CLIPVisionConfig(**CLIP), text_config=llama,
            image_token_id=ids("<image>"), vision_feature_layer=-1,
            vision_feature_select_strategy="default", image_grid_pinpoints=pinpoints,
        )
        model_cls = tf.LlavaNextForConditionalGeneration
        processor = tf.LlavaNextProcessor(
            image_processor=tf.LlavaNextImageProcessorPil(
                size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16},
                image_grid_pinpoints=pinpoints),
            tokenizer=tok, patch_size=4, vision_feature_select_strategy="default",
            num_additional_image_tokens=1, chat_template=template,
        )
    elif family == "pixtral":
        vision = tf.PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, head_dim=8, image_size=16,
                                        patch_size=4)
        config = tf.LlavaConfig(
            vision_config=vision,
            text_config=tf.MistralConfig(**_text_kwargs(VOCAB_SIZE, head_dim=8)),
            image_token_id=ids("[IMG]"), vision_feature_layer=-1,
            vision_feature_select_strategy="full", multimodal_projector_bias=True,
        )
        model_cls = tf.LlavaForConditionalGeneration
        processor = TinyProcessor(
            family, tf.PixtralImageProcessorPil(size={"longest_edge": 16},
                                                patch_size={"height": 4, "width": 4}),
            tok, template,
        )
    elif family == "mistral3":
        vision = tf.PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, head_dim=8, image_size=32,
                                        patch_size=4)
        config = tf.Mistral3Config(
            vision_config=vision,
            text_config=tf.MistralConfig(**_text_kwargs(VOCAB_SIZE, head_dim=8)),
            image_token_index=ids("[IMG]"), spatial_merge_size=2, vision_feature_layer=-1,
        )
        model_cls = tf.Mistral3ForConditionalGeneration
        processor = TinyProcessor(
            family, tf.PixtralImageProcessorPil(size={"longest_edge": 32},
                                                patch_size={"height": 8, "width": 8}),
            tok, template,
        )
    elif family in ("idefics3", "smolvlm"):
        vis = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                   image_size=16, patch_size=4)
        image_kw = dict(do_image_splitting=False, size={"longest_edge": 16},
                        max_image_size={"longest_edge": 16})
        if family == "idefics3":
            config = tf.Idefics3Config(
                vision_config=tf.Idefics3VisionConfig(**vis), text_config=llama,
                scale_factor=2, image_token_id=ids("<image>"),
            )
            model_cls = tf.Idefics3ForConditionalGeneration
            processor = tf.Idefics3Processor(
                image_processor=tf.Idefics3ImageProcessorPil(**image_kw), tokenizer=tok,
                image_seq_len=4, chat_template=template)
        else:
            config = tf.SmolVLMConfig(
                vision_config=tf.SmolVLMVisionConfig(**vis), text_config=llama,
                scale_factor=2, image_token_id=ids("<image>"),
            )
            model_cls = tf.SmolVLMForConditionalGeneration
            processor = TinyProcessor(family, tf.SmolVLMImageProcessorPil(**image_kw), tok,
                                      template)
    elif family in ("qwen2_vl", "qwen2_5_vl"):
        rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}
        text = _text_kwargs(VOCAB_SIZE, rope_parameters=rope)
        image_kw = dict(patch_size=4, merge_size=2, temporal_patch_size=2,
                        size={"shortest_edge": 16 * 16, "longest_edge": 32 * 32})
        special = dict(image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
                       vision_start_token_id=ids("<|vision_start|>"),
                       vision_end_token_id=ids("<|vision_end|>"))
        if family == "qwen2_vl":
            vision = dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2,
                          patch_size=4, spatial_merge_size=2, temporal_patch_size=2,
                          in_channels=3)
            config = tf.Qwen2VLConfig(text_config=text, vision_config=vision, **special)
            model_cls = tf.Qwen2VLForConditionalGeneration
        else:
            vision = dict(depth=2, hidden_size=32, out_hidden_size=32, intermediate_size=64,
                          num_heads=4, patch_size=4, spatial_merge_size=2, temporal_patch_size=2,
                          in_channels=3, window_size=16, fullatt_block_indexes=[1])
            config = tf.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **special)
            model_cls = tf.Qwen2_5_VLForConditionalGeneration
        processor = TinyProcessor(family, tf.Qwen2VLImageProcessorPil(**image_kw), tok, template)
    torch.manual_seed(seed + FAMILIES.index(family))  # distinct weights per family
    model = model_cls(config).to(dtype).eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    return model, processor


def save_tiny_vlm(family: str, folder: str | Path, *, seed: int = 0) -> Path:
    """Write the tiny model and its processor to `folder` (a loadable checkpoint)."""
    model, processor = build_tiny_vlm(family, seed=seed)
    folder = Path(folder)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def build_tiny_llava(seed: int = 0, layers: int = 4, *, patch_size: int = 4):
    """A random tiny LlavaForConditionalGeneration without a processor (vocab 60; CLIP 16x16 /
    patch 4 -> 16 visual tokens), frozen, in eval mode. The global RNG is left as it was."""
    import transformers as tf

    config = _llava_config(LLAVA_VOCAB, LLAVA_IMAGE_TOKEN, layers=layers, patch_size=patch_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.LlavaForConditionalGeneration(config).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def save_tiny_llava(folder: str | Path) -> str:
    """A loadable LLaVA checkpoint of 2 layers and 4 visual tokens (8x8 patches), no processor."""
    build_tiny_llava(0, layers=2, patch_size=8).save_pretrained(folder)
    return str(folder)


def tiny_prompts(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Batch-1 inputs of `build_tiny_llava`: [bos, w, <image> x 16, w, w] with random pixels."""
    gen = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(n):
        words = torch.randint(5, LLAVA_VOCAB, (3,), generator=gen)
        image = torch.full((16,), LLAVA_IMAGE_TOKEN)
        ids = torch.cat((torch.tensor([1]), words[:1], image, words[1:]))[None]
        prompts.append({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                        "pixel_values": torch.randn(1, 3, 16, 16, generator=gen)})
    return prompts


def tiny_image(seed: int, size: tuple[int, int] = (16, 16)) -> Image.Image:
    """A random RGB image (width, height)."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


PROMPTS = (
    "what is in the image ?",
    "describe the picture",
    "how many cats are there ?",
    "what color is the car ?",
    "tell me about the sky",
    "is there a dog on the left ?",
    "which tree is big ?",
    "where is the man ?",
    "what does the woman show ?",
    "answer briefly : the house color ?",
    "red green blue yellow red green blue",
    "one two three four five one two three",
)
