"""Tiny DREAM drafts for the supernet tests (hidden 32, 4 heads, vocab 50), the target-side
tensors of a prompt they draft for, and random training samples for them."""

from __future__ import annotations

from typing import Any

import torch
from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.state import SharedTargetModules
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


def tiny_samples(n: int, seed: int = 0) -> list[Any]:
    """`n` random training samples for `tiny_draft`, a function of `seed` (the same in every
    process): 12 prompt positions (6 visual), 6 answer tokens, target features at layers 1 and 2."""
    from dreams_nas.supernet.training.features import TargetSample

    gen = torch.Generator().manual_seed(seed)
    prompt, seq = 12, 18
    samples = []
    for _ in range(n):
        visual = torch.zeros(prompt, dtype=torch.bool)
        visual[2:8] = True
        samples.append(TargetSample(
            input_ids=torch.randint(VOCAB, (seq,), generator=gen), prompt_len=prompt,
            visual_mask=visual, visual_scores=torch.rand(prompt, generator=gen) * visual,
            memory_hidden={k: torch.randn(prompt, HIDDEN, generator=gen) for k in (1, 2)},
            distill_hidden={2: torch.randn(seq, HIDDEN, generator=gen)},
            last_hidden=torch.randn(seq, HIDDEN, generator=gen)))
    return samples



def train_tiny_draft(adapter, prompts, layers: tuple[int, ...] = (1, 2, 4)) -> DreamDraft:
    """A supernet over a bare tiny LLaVA (`models.build_tiny_llava`) trained for a few steps
    on its own answers to `prompts` (a couple of seconds): drafts that are accepted."""
    from dreams_nas.supernet.draft.config import DraftConfig
    from dreams_nas.supernet.draft.state import SharedTargetModules
    from dreams_nas.supernet.training.config import TrainConfig
    from dreams_nas.supernet.training.selfdistill import collect_samples, regenerate_answers
    from dreams_nas.supernet.training.tppt import TrainingSet, train_supernet

    answers = regenerate_answers(adapter.model, prompts, max_new_tokens=12, show_progress=False)
    samples = collect_samples(adapter, prompts, answers, layers, (2,), show_progress=False)
    shared = SharedTargetModules(adapter.embed_tokens, adapter.lm_head)
    draft = DreamDraft.initialised(DraftConfig.for_target(adapter.text_config, layers), shared, 0)
    config = TrainConfig(warmup_steps=60, multires_steps=20, batch_size=8, lr=3e-3, unroll=2,
                         lr_warmup_steps=5, feature_noise=0.0, checkpoint_every=1000)
    train_supernet(draft, TrainingSet(samples, (2,)), config, show_progress=False)
    return draft


def second_token_law(adapter, prompt, sampling):
    """The exact law of the second generated token after `prompt` under `sampling` (the first
    token a draft proposes): sum over first tokens t1 of p(t1) p(. | t1), (vocab,)."""
    import torch
    from dreams_nas.supernet.decoding.sampling import logits_to_probs

    p1 = logits_to_probs(adapter.prefill(prompt).logits[0], sampling)
    law = torch.zeros_like(p1)
    for t1 in torch.nonzero(p1).flatten():
        adapter.prefill(prompt)
        law += p1[t1] * logits_to_probs(adapter.verify(t1.view(1, 1)).logits[0, -1], sampling)
    return law


def random_spec_folder(adapter, where, draft_len: int = 3):
    """A random draft of `adapter`'s target, extracted and saved as search exports one."""
    from dreams_nas.latency.measure.steps import build_supernet
    from dreams_nas.supernet.core.io import atomic_write_json
    from dreams_nas.supernet.core.space import SearchSpace
    from dreams_nas.supernet.decoding.hf_entry import write_shim
    from dreams_nas.supernet.draft.extract import extract

    space = SearchSpace.default_for(adapter.num_layers, 4)
    spec = space.largest().replace(draft_len=draft_len, tree=())
    extract(build_supernet(adapter.model, space), spec).save_pretrained(where)
    atomic_write_json(where / "spec.json", {"schema_version": 1, "spec": spec.to_dict(),
                                            "target": adapter.describe()})
    write_shim(where)
    return where
