"""A word-level tokenizer built offline with `tokenizers`, wrapped as a Hugging Face fast tokenizer.

Words are split on white space and punctuation (``"is 4."`` -> ``is``, ``4``, ``.``); decoding
joins words with spaces and removes the space before punctuation, so every synthetic answer
round-trips exactly. The chat template is LLaVA-1.5's (``USER: <image>\\n... ASSISTANT:``) with
the image first; it works on plain-string and on list-of-parts message contents, so both
``tokenizer.apply_chat_template`` and ``LlavaProcessor.apply_chat_template`` render it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

BOS, EOS, PAD, UNK, IMAGE = "<s>", "</s>", "<pad>", "<unk>", "<image>"
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS, IMAGE)
# Words of the chat template itself.
TEMPLATE_WORDS = ("USER", "ASSISTANT", ":")

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: {% elif message['role'] == 'assistant' %}ASSISTANT: "
    "{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}"
    "{% for part in message['content'] if part['type'] == 'image' %}<image>\n{% endfor %}"
    "{% for part in message['content'] if part['type'] == 'text' %}{{ part['text'] }}{% endfor %}"
    "{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %} "
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def build_word_tokenizer(texts: Iterable[str], extra_words: Iterable[str] = ()) -> Any:
    """A `PreTrainedTokenizerFast` whose vocabulary is every word of `texts` (sorted, so stable).

    Ids: 0 ``<pad>``, 1 ``<unk>``, 2 ``<s>``, 3 ``</s>``, 4 ``<image>``, then the words.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    words: set[str] = set(TEMPLATE_WORDS) | set(extra_words)
    for text in texts:
        words.update(piece for piece, _ in pre.pre_tokenize_str(text))
    words -= set(SPECIAL_TOKENS)
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for word in sorted(words):
        vocab[word] = len(vocab)

    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre
    # WordPiece's decoder with cleanup joins words by spaces and drops the space before
    # punctuation; no word starts with its "##" prefix, so nothing else changes.
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        extra_special_tokens={"image_token": IMAGE},
        chat_template=CHAT_TEMPLATE,
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE]})
    return tokenizer
