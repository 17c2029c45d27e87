"""Tiny drafts for the supernet tests (hidden 32, 4 heads, vocab 50)."""

from __future__ import annotations

import contextlib

import torch
from dreams_nas.supernet.draft.model import DraftConfig, DreamDraft, SharedTargetModules
from torch import nn

VOCAB, HIDDEN, HEADS, HEAD_DIM = 50, 32, 4, 8


def tiny_config(**changes) -> DraftConfig:
    base = dict(hidden_size=HIDDEN, num_heads=HEADS, head_dim=HEAD_DIM, intermediate_size=64,
                vocab_size=VOCAB, inject_layers=(1, 2), num_target_layers=2)
    return DraftConfig(**{**base, **changes})


def tiny_shared(seed: int = 0) -> SharedTargetModules:
    gen = torch.Generator().manual_seed(seed)
    embed = nn.Embedding(VOCAB, HIDDEN)
    head = nn.Linear(HIDDEN, VOCAB, bias=False)
    with torch.no_grad():
        embed.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=gen))
        head.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=gen) * 0.3)
    for p in (*embed.parameters(), *head.parameters()):
        p.requires_grad_(False)
    return SharedTargetModules(embed_tokens=embed, lm_head=head)


def tiny_draft(seed: int = 0, open_gates: bool = True, **changes) -> DreamDraft:
    """A draft with random weights; gates opened so the cross-attention really matters."""
    torch.manual_seed(seed)
    model = DreamDraft(tiny_config(**changes), tiny_shared(seed))
    if open_gates and model.cross is not None:
        with torch.no_grad():
            model.cross.attn_gate.fill_(0.7)
            model.cross.mlp_gate.fill_(-0.4)
    return model.eval()


def tiny_prompt(batch: int = 1, prompt_len: int = 12, num_visual: int = 6, seed: int = 0):
    """A prompt whose positions 2..2+num_visual are visual; returns target-side tensors."""
    gen = torch.Generator().manual_seed(seed)
    visual_mask = torch.zeros(batch, prompt_len, dtype=torch.bool)
    visual_mask[:, 2:2 + num_visual] = True
    scores = torch.rand(batch, prompt_len, generator=gen)
    layer_hidden = torch.randn(batch, prompt_len, HIDDEN, generator=gen)
    return layer_hidden, visual_mask, scores


def tiny_llava(seed: int = 0, layers: int = 4):
    """A random tiny LlavaForConditionalGeneration (CLIP 16x16 / patch 4 -> 16 visual tokens)."""
    import transformers as tf

    clip = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                image_size=16, patch_size=4, projection_dim=32)
    text = dict(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2,
                pad_token_id=0, tie_word_embeddings=False)
    cfg = tf.LlavaConfig(vision_config=tf.CLIPVisionConfig(**clip),
                         text_config=tf.LlamaConfig(**text), image_token_id=4,
                         vision_feature_layer=-1, vision_feature_select_strategy="default")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.LlavaForConditionalGeneration(cfg).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def tiny_prompts(n: int, seed: int = 0):
    """Batch-1 LLaVA inputs: [bos, w, <image> x 16, w, w] with random pixels."""
    gen = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(n):
        words = torch.randint(5, 60, (3,), generator=gen)
        ids = torch.cat((torch.tensor([1]), words[:1], torch.full((16,), 4), words[1:]))[None]
        prompts.append({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                        "pixel_values": torch.randn(1, 3, 16, 16, generator=gen)})
    return prompts


@contextlib.contextmanager
def one_torch_thread():
    """Tiny models on a shared 2-core machine: one intra-op thread avoids OpenMP
    oversubscription (40x slower steps under load); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
