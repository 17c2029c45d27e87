"""A byte-level BPE tokenizer trained offline with `tokenizers`, for the real-shaped proxy target.

Real VLMs have 32k-152k-token vocabularies, and the vocabulary sets the cost of the LM head, of
the draft's own head and of every softmax over it. No tokenizer can be downloaded here, so the
proxy's is trained locally on a deterministic corpus: the synthetic tasks' texts (so the
built-in prompts tokenize into whole words, as English does under a real tokenizer) and a
Zipf-distributed stream of pseudo-words built from syllables, diverse enough for BPE to learn
every merge up to the requested size. Byte-level (GPT-2/Qwen style), so any text encodes
without an unknown token and decodes back exactly.

The chat template is LLaVA-1.5's (the built-in target's, `word_tokenizer.CHAT_TEMPLATE`).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

from dreams_nas.supernet.builtin.word_tokenizer import BOS, CHAT_TEMPLATE, EOS, IMAGE, PAD, UNK
from dreams_nas.supernet.data.synth import vocabulary_texts

SPECIAL = (UNK, BOS, EOS, PAD, IMAGE)  # ids 0..4
_ONSETS = ("b c d f g h j k l m n p r s t v w z br cr dr fr gr pr tr st sp sk sl pl bl cl fl gl "
           "ch sh th").split()
_VOWELS = "a e i o u ai ea ee oo ou ie oa".split()
_CODAS = "n r s t l m".split()


def _pseudo_words(n: int, seed: int) -> list[str]:
    """`n` distinct pseudo-words of 1-4 syllables, in a seeded random order (the Zipf rank)."""
    syllables = [o + v for o in _ONSETS for v in _VOWELS]
    syllables += [o + v + c for o in _ONSETS[:10] for v in _VOWELS[:5] for c in _CODAS]
    rng = random.Random(seed)
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choice(syllables) for _ in range(rng.choice((1, 2, 2, 3, 3, 4)))))
    ranked = sorted(words)
    rng.shuffle(ranked)
    return ranked


def corpus(vocab_size: int, seed: int = 0, words_per_line: int = 60,
           task_repeats: int = 100) -> Iterator[str]:
    """The training corpus for a vocabulary of `vocab_size`: the synthetic tasks' texts
    `task_repeats` times, then ``5/8 * vocab_size`` lines of pseudo-words drawn with Zipf(1.05)
    frequencies over ``4 * vocab_size`` word types (20,000 lines over 128,000 types at 32k;
    at least 1,000 lines over 8,000 types)."""
    texts = vocabulary_texts()
    for _ in range(task_repeats):
        yield from texts
    lines = max(1_000, vocab_size * 5 // 8)
    words = _pseudo_words(max(8_000, 4 * vocab_size), seed)
    cum = list(itertools.accumulate(1.0 / (rank + 1) ** 1.05 for rank in range(len(words))))
    rng = random.Random(seed + 1)
    for _ in range(lines):
        yield " ".join(rng.choices(words, cum_weights=cum, k=words_per_line))


def build_bpe_tokenizer(vocab_size: int = 32_000, seed: int = 0, max_length: int = 4096) -> Any:
    """A `PreTrainedTokenizerFast` with a byte-level BPE of exactly `vocab_size` tokens.

    Ids 0..4 are ``<unk> <s> </s> <pad> <image>``; the rest are the 256 bytes and the learned
    merges. Deterministic for a given `vocab_size` and `seed` (a few seconds at 32,000).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    backend.train_from_iterator(corpus(vocab_size, seed), trainer=trainer)
    if backend.get_vocab_size() != vocab_size:
        raise ValueError(f"BPE training reached {backend.get_vocab_size()} tokens, not "
                         f"{vocab_size}; the corpus is too small for that vocabulary")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        extra_special_tokens={"image_token": IMAGE}, chat_template=CHAT_TEMPLATE,
        model_max_length=max_length, clean_up_tokenization_spaces=False)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE]})
    return tokenizer
