"""Held-out acceptance length during training: teacher-forced chain tau from the training-time
test's parallel passes (`ranks.path_ranks`: a chain started after y_t accepts its leading
depths where the target's token is the draft's argmax), the cycles replayed with the engine's
rules (`simulate_cycles`: room before the token budget, the bonus token, EOS) -- the tau that
`acceptance.teacher_forced` scores, with no rollout per start.

The training prompts' answers are the target's own greedy answers (self-distillation), so a
held-out slice of them is a teacher-forced evaluation set with no further target call.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import torch
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.decoding.cycles import simulate_cycles
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.training.batching import collate
from dreams_nas.supernet.training.features import TargetSample
from dreams_nas.supernet.training.ranks import path_ranks


def chain_matches(model: DreamDraft, samples: Sequence[TargetSample], spec: SubnetSpec,
                  draft_len: int) -> list[np.ndarray]:
    """Per sample, the accepted levels (0..draft_len) of a chain started after each answer token
    y_t, t = 0 .. len(answer) - 2 -> one (n_answer - 1,) int array per sample."""
    samples = list(samples)  # one batch: each sample read once (a feature store reads on access)
    with_visual = model.config.visual_in_self
    batch = collate(samples, with_visual).to(next(model.parameters()).device)
    ranks = path_ranks(model, batch, spec, (1,) * draft_len)
    accepted = torch.cumprod((ranks == 0).long(), dim=-1).sum(-1).cpu()  # (batch, text)
    result = []
    for i, s in enumerate(samples):
        first = s.answer_index(with_visual)  # y_0's index in the row
        n_answer = int(s.input_ids.shape[0]) - s.prompt_len
        result.append(accepted[i, first: first + max(0, n_answer - 1)].numpy())
    return result


def heldout_tau(model: DreamDraft, samples: Sequence[TargetSample], spec: SubnetSpec,
                draft_len: int, max_new_tokens: int, eos_ids: Collection[int] = (),
                batch_size: int = 8) -> float:
    """Pooled tau (tokens / target verify forwards) of a draft_len-chain of `spec` over `samples`
    whose answers are the target's greedy ones; an answer ending in one of `eos_ids` stopped
    there (else it ran to `max_new_tokens`)."""
    was_training = model.training
    model.eval()
    tokens = cycles = 0
    try:
        for start in range(0, len(samples), batch_size):
            part = list(samples[start: start + batch_size])  # read once per batch
            for s, matches in zip(part, chain_matches(model, part, spec, draft_len), strict=True):
                answer = s.input_ids[s.prompt_len:].tolist()
                eos = len(answer) - 1 if answer and answer[-1] in eos_ids else None
                lengths, _ = simulate_cycles(matches, draft_len, max_new_tokens, eos)
                tokens += sum(lengths)
                cycles += len(lengths)
    finally:
        model.train(was_training)
    return tokens / cycles if cycles else 1.0
