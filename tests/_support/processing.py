"""The text side of the tiny VLMs: a word-level tokenizer built in memory, the chat template and
a processor for the families whose Hugging Face processor class needs an optional library."""

from __future__ import annotations

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


def chat_template(image_string: str) -> str:
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
        return self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template,
                                                  **kwargs)

    def _expand(self, image_inputs) -> str:
        if self.family in ("pixtral", "mistral3"):
            step = 4 if self.family == "pixtral" else 8  # patch x spatial merge
            height, width = (int(v) for v in image_inputs["image_sizes"][0])
            rows = [["[IMG]"] * (width // step) + ["[IMG_BREAK]"]] * (height // step)
            flat = [t for row in rows for t in row]
            flat[-1] = "[IMG_END]"
            return "".join(flat)
        if self.family == "smolvlm":
            return ("<fake_token_around_image><global-img>" + "<image>" * 4
                    + "<fake_token_around_image>")
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
