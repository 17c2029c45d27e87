"""Real-shaped proxy targets: a VLM with a real model's geometry and random weights.

The built-in target answers its synthetic questions but is tiny (36 visual tokens, a word-level
vocabulary, 3.6M parameters): it cannot show what breaks at the size users run. A proxy has the
geometry that sets costs, memory and context lengths -- LLaVA-1.5's 336-pixel images in 14-pixel
patches (576 visual tokens), a 32,000-token BPE vocabulary (`bpe.build_bpe_tokenizer`), an LM of
0.3B+ parameters at hidden size 1024 -- and random weights, so it builds offline in seconds. Its
answers are noise and its tau means nothing; everything the pipeline times or allocates is real.

`--target proxy-llava` selects it wherever `--target builtin` works (`cache.ensure_proxy_target`
builds it once into the cache, as the built-in target is). `proxy-llava-tiny` is the same code at
test size.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dreams_nas.supernet.builtin.bpe import build_bpe_tokenizer
from dreams_nas.supernet.builtin.word_tokenizer import CHAT_TEMPLATE, IMAGE
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.io import atomic_write_json
from dreams_nas.supernet.core.versions import library_versions

log = logging.getLogger("dreams_nas")
# Bump when the geometry, the tokenizer or the initialisation changes: old cache folders are
# then ignored.
PROXY_VERSION = "proxy-v1"


@dataclass(frozen=True)
class ProxySpec:
    """The geometry of one proxy target."""

    name: str
    image_size: int
    patch_size: int
    vision_hidden: int
    vision_layers: int
    vision_heads: int
    text_hidden: int
    text_layers: int
    text_heads: int
    text_intermediate: int
    vocab_size: int
    max_positions: int = 4096
    dtype: str = "bfloat16"  # the dtype the weights are saved in

    @property
    def visual_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2


PROXIES: dict[str, ProxySpec] = {
    # LLaVA-1.5's image geometry and vocabulary; the LM is a 20-layer Llama at hidden 1024
    # (0.32B parameters, head dim 64, untied 32k embedding and head: 66M of them); the vision
    # tower is 4 narrow CLIP layers (it runs once per prompt, at prefill).
    "proxy-llava": ProxySpec(
        name="proxy-llava", image_size=336, patch_size=14, vision_hidden=512, vision_layers=4,
        vision_heads=8, text_hidden=1024, text_layers=20, text_heads=16, text_intermediate=2816,
        vocab_size=32_000),
    # The same code at test size: 64 visual tokens, a 1,000-token BPE, a two-layer LM.
    "proxy-llava-tiny": ProxySpec(
        name="proxy-llava-tiny", image_size=112, patch_size=14, vision_hidden=32, vision_layers=1,
        vision_heads=2, text_hidden=64, text_layers=2, text_heads=4, text_intermediate=128,
        vocab_size=1_000, max_positions=1024, dtype="float32"),
}


def get_proxy(name: str) -> ProxySpec:
    if name not in PROXIES:
        raise InputError(f"proxy target {name!r} is unknown; pick one of {list(PROXIES)}")
    return PROXIES[name]


def build_processor(spec: ProxySpec, seed: int = 0) -> Any:
    """LLaVA-1.5's processor shape: CLIP preprocessing at `image_size`, the BPE tokenizer, the
    class token dropped (``vision_feature_select_strategy="default"``)."""
    from transformers import LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tokenizer = build_bpe_tokenizer(spec.vocab_size, seed, max_length=spec.max_positions)
    size = spec.image_size
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size},
        image_mean=[0.48145466, 0.4578275, 0.40821073],
        image_std=[0.26862954, 0.26130258, 0.27577711])
    return LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer,
                          patch_size=spec.patch_size, vision_feature_select_strategy="default",
                          num_additional_image_tokens=1, chat_template=CHAT_TEMPLATE)


def build_config(spec: ProxySpec, tokenizer: Any) -> Any:
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    vision = CLIPVisionConfig(
        hidden_size=spec.vision_hidden, intermediate_size=4 * spec.vision_hidden,
        num_hidden_layers=spec.vision_layers, num_attention_heads=spec.vision_heads,
        image_size=spec.image_size, patch_size=spec.patch_size,
        projection_dim=spec.vision_hidden)
    text = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=spec.text_hidden,
        intermediate_size=spec.text_intermediate, num_hidden_layers=spec.text_layers,
        num_attention_heads=spec.text_heads, num_key_value_heads=spec.text_heads,
        max_position_embeddings=spec.max_positions, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    # LLaVA-1.5 reads the vision tower's second-to-last layer (-2); with one layer, the last
    return LlavaConfig(
        vision_config=vision, text_config=text,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE),
        vision_feature_layer=-2 if spec.vision_layers > 1 else -1,
        vision_feature_select_strategy="default", image_seq_length=spec.visual_tokens)


def build_proxy_target(out_dir: str | Path, name: str = "proxy-llava",
                       seed: int = 0) -> dict[str, Any]:
    """Build the proxy `name` with random weights (seeded) and `save_pretrained` it, with its
    processor, into `out_dir`; returns its metrics (parameters, visual tokens, vocabulary,
    build seconds)."""
    import torch
    from transformers import LlavaForConditionalGeneration

    spec = get_proxy(name)
    start = time.perf_counter()
    processor = build_processor(spec, seed)
    tokenizer_s = time.perf_counter() - start
    config = build_config(spec, processor.tokenizer)
    dtype = getattr(torch, spec.dtype)
    with torch.random.fork_rng(devices=[]):  # weight init reads the global RNG; keep it local
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config).to(dtype).eval()
    model.generation_config.pad_token_id = processor.tokenizer.pad_token_id
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    text_params = sum(p.numel() for p in model.model.language_model.parameters())
    metrics = {
        "name": name, "version": PROXY_VERSION, "seed": seed, "dtype": spec.dtype,
        "num_params": sum(p.numel() for p in model.parameters()),
        "num_params_text": text_params + model.lm_head.weight.numel(),
        "num_params_lm_head": model.lm_head.weight.numel(),
        "visual_tokens": spec.visual_tokens, "image_size": spec.image_size,
        "vocab_size": len(processor.tokenizer), "num_layers": spec.text_layers,
        "hidden_size": spec.text_hidden,
        "tokenizer_s": round(tokenizer_s, 1),
        "build_s": round(time.perf_counter() - start, 1),
        "versions": library_versions(),
    }
    atomic_write_json(out / "proxy_metrics.json", metrics)
    log.info("proxy target %s: %.0fM parameters, %d visual tokens, %d-token vocabulary, "
             "built in %.1f s", name, metrics["num_params"] / 1e6, spec.visual_tokens,
             metrics["vocab_size"], metrics["build_s"])
    return metrics
