"""Tiny random VLMs of every supported family, built from configs (no network).

`build_tiny_vlm(family)` returns ``(model, processor)``: a real Hugging Face model class with a
random tiny config (hidden 32, 2 text layers, 16x16 images) and a real processor around a
word-level tokenizer built in memory, with a chat template that puts the image first.
`save_tiny_vlm(family, folder)` writes both with ``save_pretrained`` so loading paths are
exercised too. Shared by the engine, draft, latency and search tests via `tests/conftest.py`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

FAMILIES = ("llava", "llava_next", "pixtral", "mistral3", "idefics3", "smolvlm", "qwen2_vl", "qwen2_5_vl")

WORDS = (
    "a an the is are was of in on at to and or with what where how many which color colour "
    "picture image photo show shows describe tell me about there left right top bottom red green "
    "blue yellow black white cat dog car tree house sky man woman boy girl one two three four five "
    "big small near far above below this that it do does you see can please answer briefly "
    "word short long yes no"
).split()
PUNCT = list(".,?!:;'\"()-")
SPECIALS = [
    "<pad>", "<s>", "</s>", "<unk>", "<image>", "[IMG]", "[IMG_BREAK]", "[IMG_END]",
    "<fake_token_around_image>", "<global-img>", "<end_of_utterance>",
    "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
    "<|im_start|>", "<|im_end|>", "<video>",
]
ROW_COL = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
ROLE_WORDS = ["USER", "ASSISTANT", "User", "Assistant", "user", "assistant", "system"]
VOCAB_SIZE = 160  # >= len(tokenizer); the extra ids are reachable by the random lm_head

IMAGE_STRINGS = {
    "llava": "<image>",
    "llava_next": "<image>",
    "pixtral": "[IMG]",
    "mistral3": "[IMG]",
    "idefics3": "<image>",
    "smolvlm": "<image>",
    "qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>",
}


def _chat_template(image_string: str) -> str:
    return (
        "{% for m in messages %}{{ m['role'] | upper }}: "
        "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
        "{% for c in m['content'] %}{% if c['type'] == 'image' %}" + image_string + "\n"
        "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}\n{% endfor %}"
        "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
    )


def build_tokenizer():
    """A word-level fast tokenizer holding every family's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = SPECIALS + ROW_COL + ROLE_WORDS + WORDS + PUNCT
    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    assert len(vocab) <= VOCAB_SIZE
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>", extra_special_tokens=None,
    )
    tok.add_special_tokens({"additional_special_tokens": SPECIALS[4:] + ROW_COL})
    return tok


class TinyProcessor:
    """What the family's HF processor does, for the families whose processor class needs
    torchvision or num2words (not installed here): the PIL image processor, then the
    placeholder expansion of `transformers` for that family, then the tokenizer."""

    def __init__(self, family: str, image_processor, tokenizer, chat_template: str) -> None:
        self.family, self.image_processor, self.tokenizer = family, image_processor, tokenizer
        self.chat_template = chat_template
        tokenizer.chat_template = chat_template

    def apply_chat_template(self, messages, **kwargs):
        return self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template, **kwargs)

    def _expand(self, image_inputs) -> str:
        if self.family in ("pixtral", "mistral3"):
            step = 4 if self.family == "pixtral" else 8  # patch x spatial merge
            height, width = (int(v) for v in image_inputs["image_sizes"][0])
            rows = [["[IMG]"] * (width // step) + ["[IMG_BREAK]"]] * (height // step)
            flat = [t for row in rows for t in row]
            flat[-1] = "[IMG_END]"
            return "".join(flat)
        if self.family == "smolvlm":
            return "<fake_token_around_image><global-img>" + "<image>" * 4 + "<fake_token_around_image>"
        n = int(image_inputs["image_grid_thw"][0].prod()) // 4
        return "<|image_pad|>" * n

    def __call__(self, images=None, text=None, return_tensors="pt", **kwargs):
        from transformers import BatchFeature

        text = text if isinstance(text, str) else text[0]
        data = {}
        if images is not None:
            images = images if isinstance(images, list) else [images]
            image_inputs = self.image_processor(images, return_tensors="pt")
            placeholder = IMAGE_STRINGS[self.family]
            if self.family.startswith("qwen"):
                placeholder = "<|image_pad|>"
            text = text.replace(placeholder, self._expand(image_inputs), 1)
            data.update(image_inputs)
        enc = self.tokenizer(text, return_tensors="pt")
        data.update(enc)
        if self.family.startswith("qwen"):
            image_id = self.tokenizer.convert_tokens_to_ids("<|image_pad|>")
            data["mm_token_type_ids"] = (enc["input_ids"] == image_id).long()
        return BatchFeature(data=data, tensor_type=return_tensors)

    def batch_decode(self, *args, **kwargs):
        return self.tokenizer.batch_decode(*args, **kwargs)

    def decode(self, *args, **kwargs):
        return self.tokenizer.decode(*args, **kwargs)


def _text_kwargs(vocab: int, **extra) -> dict:
    base = dict(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
    )
    base.update(extra)
    return base


def build_tiny_vlm(family: str, *, seed: int = 0, dtype: torch.dtype = torch.float32):
    """(model, processor) of `family` with random tiny weights, in eval mode."""
    import transformers as tf

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; pick one of {FAMILIES}")
    tok = build_tokenizer()
    ids = tok.convert_tokens_to_ids
    template = _chat_template(IMAGE_STRINGS[family])
    clip = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                image_size=16, patch_size=4, projection_dim=32)
    if family == "llava":
        config = tf.LlavaConfig(
            vision_config=tf.CLIPVisionConfig(**clip), text_config=tf.LlamaConfig(**_text_kwargs(VOCAB_SIZE)),
            image_token_id=ids("<image>"), vision_feature_layer=-1,
            vision_feature_select_strategy="default",
        )
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
            vision_config=tf.CLIPVisionConfig(**clip), text_config=tf.LlamaConfig(**_text_kwargs(VOCAB_SIZE)),
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
                                        num_attention_heads=4, head_dim=8, image_size=16, patch_size=4)
        config = tf.LlavaConfig(
            vision_config=vision, text_config=tf.MistralConfig(**_text_kwargs(VOCAB_SIZE, head_dim=8)),
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
                                        num_attention_heads=4, head_dim=8, image_size=32, patch_size=4)
        config = tf.Mistral3Config(
            vision_config=vision, text_config=tf.MistralConfig(**_text_kwargs(VOCAB_SIZE, head_dim=8)),
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
                vision_config=tf.Idefics3VisionConfig(**vis), text_config=tf.LlamaConfig(**_text_kwargs(VOCAB_SIZE)),
                scale_factor=2, image_token_id=ids("<image>"),
            )
            model_cls = tf.Idefics3ForConditionalGeneration
            processor = tf.Idefics3Processor(image_processor=tf.Idefics3ImageProcessorPil(**image_kw),
                                             tokenizer=tok, image_seq_len=4, chat_template=template)
        else:
            config = tf.SmolVLMConfig(
                vision_config=tf.SmolVLMVisionConfig(**vis), text_config=tf.LlamaConfig(**_text_kwargs(VOCAB_SIZE)),
                scale_factor=2, image_token_id=ids("<image>"),
            )
            model_cls = tf.SmolVLMForConditionalGeneration
            processor = TinyProcessor(family, tf.SmolVLMImageProcessorPil(**image_kw), tok, template)
    elif family in ("qwen2_vl", "qwen2_5_vl"):
        text = _text_kwargs(VOCAB_SIZE, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                         "mrope_section": [2, 1, 1]})
        image_kw = dict(patch_size=4, merge_size=2, temporal_patch_size=2,
                        size={"shortest_edge": 16 * 16, "longest_edge": 32 * 32})
        special = dict(image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
                       vision_start_token_id=ids("<|vision_start|>"),
                       vision_end_token_id=ids("<|vision_end|>"))
        if family == "qwen2_vl":
            vision = dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2, patch_size=4,
                          spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
            config = tf.Qwen2VLConfig(text_config=text, vision_config=vision, **special)
            model_cls = tf.Qwen2VLForConditionalGeneration
        else:
            vision = dict(depth=2, hidden_size=32, out_hidden_size=32, intermediate_size=64, num_heads=4,
                          patch_size=4, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
                          window_size=16, fullatt_block_indexes=[1])
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
