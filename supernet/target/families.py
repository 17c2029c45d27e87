"""Per-family quirks of the Hugging Face VLMs the target adapter wraps.

The decoding loop never looks at a family: everything that differs between LLaVA, LLaVA-NeXT,
Pixtral (a Llava checkpoint with a Pixtral vision tower and a Mistral decoder), Mistral3
(Pixtral's successor class, with a patch merger: Mistral-Small-3.1 and later), Idefics3,
SmolVLM, Qwen2-VL and Qwen2.5-VL lives here and in `TargetAdapter`:

* where the text decoder sits (`model.model.language_model` or `model.model.text_model`);
* which token id marks a visual feature (`image_token_id`, or `image_token_index` in old configs);
* structural image tokens that are *not* visual features (Pixtral's ``[IMG_BREAK]``/``[IMG_END]``,
  Idefics3's ``<fake_token_around_image>``/``<global-img>``/``<row_i_col_j>``, Qwen's
  ``<|vision_start|>``/``<|vision_end|>``): they are excluded from the text queries when the
  visual tokens are scored;
* Qwen-VL's M-RoPE: the processor's ``mm_token_type_ids`` must reach the prefill, the model keeps
  ``rope_deltas`` from it, and incremental steps pass no ``attention_mask`` so positions come from
  the cache length plus those deltas. LLaVA-NeXT's image-token count varies with the image size:
  the adapter reads visual positions from ``input_ids`` rather than assuming a count.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from dreams_nas.supernet.core.errors import InputError
from torch import nn

# model_type of the top-level config -> family name used in run.json and reports.
_MODEL_TYPES = {
    "llava": "llava",
    "llava_next": "llava_next",
    "mistral3": "mistral3",
    "idefics3": "idefics3",
    "smolvlm": "smolvlm",
    "qwen2_vl": "qwen2_vl",
    "qwen2_5_vl": "qwen2_5_vl",
}
SUPPORTED_FAMILIES = (
    "llava", "llava_next", "pixtral", "mistral3", "idefics3", "smolvlm", "qwen2_vl", "qwen2_5_vl",
)

# Token strings that frame or separate image features without being features themselves.
_STRUCTURAL_TOKENS = (
    "[IMG_BREAK]", "[IMG_END]", "<fake_token_around_image>", "<global-img>",
    "<|vision_start|>", "<|vision_end|>",
) + tuple(f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6))


@dataclass(frozen=True)
class FamilyInfo:
    name: str
    image_token_id: int
    uses_mrope: bool  # Qwen-VL: mm_token_type_ids at prefill, no attention_mask afterwards


def detect_family(model: nn.Module) -> FamilyInfo:
    """The family of a loaded `*ForConditionalGeneration` model; InputError if unsupported."""
    config = model.config
    model_type = getattr(config, "model_type", None)
    name = _MODEL_TYPES.get(model_type)
    if name is None:
        raise InputError(
            f"model type {model_type!r} ({type(model).__name__}) is not a supported VLM; "
            f"supported families: {', '.join(SUPPORTED_FAMILIES)}"
        )
    if name == "llava" and getattr(config.vision_config, "model_type", "") == "pixtral":
        name = "pixtral"
    image_token_id = getattr(config, "image_token_id", None)
    if image_token_id is None:
        image_token_id = getattr(config, "image_token_index", None)
    if image_token_id is None:
        raise InputError(f"config of {type(model).__name__} has no image_token_id; "
                         "is it a VLM checkpoint?")
    return FamilyInfo(name=name, image_token_id=int(image_token_id),
                      uses_mrope=name in ("qwen2_vl", "qwen2_5_vl"))


def text_decoder(model: nn.Module) -> nn.Module:
    """The text decoder module (has ``layers``, ``norm``, ``embed_tokens``)."""
    inner = model.model
    for attr in ("language_model", "text_model"):
        decoder = getattr(inner, attr, None)
        if decoder is not None and hasattr(decoder, "layers"):
            return decoder
    raise InputError(f"cannot find the text decoder of {type(model).__name__}")


def structural_token_ids(tokenizer) -> set[int]:
    """Ids of image-framing tokens known to `tokenizer` (empty without a tokenizer)."""
    if tokenizer is None:
        return set()
    vocab = tokenizer.get_vocab()
    return {vocab[t] for t in _STRUCTURAL_TOKENS if t in vocab}


# Config keys that do not change what the model computes or how fast: provenance, the dtype
# (recorded on its own) and forward-call switches.
_NOT_ARCHITECTURE = frozenset({"transformers_version", "dtype", "torch_dtype", "use_cache",
                               "output_attentions", "output_hidden_states", "return_dict"})


def architecture_hash(config: Any) -> str:
    """16 hex digits identifying the model's architecture (its config without provenance,
    dtype and call switches): what a latency profile is valid for. Two checkpoints of one
    architecture share it (their step times are the same); a changed layer count, width,
    vocabulary or vision tower changes it."""
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in sorted(value.items())
                    if not str(k).startswith("_") and k not in _NOT_ARCHITECTURE}
        if isinstance(value, list | tuple):
            return [strip(v) for v in value]
        return value

    data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    text = json.dumps(strip(data), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
