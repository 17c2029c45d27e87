"""A DREAM draft behind the engine's Drafter protocol, written the plain incremental way.

It keeps its own `DraftCache` across cycles: drafted positions are cropped after each cycle and
the committed positions are re-run with the target's verified features (EAGLE's refresh). The
acceptance tests run it through the engine's real `generate` loop and compare with the
teacher-forced scorer.
"""

from __future__ import annotations

import torch
from dreams_nas.supernet.draft import DraftCache, DreamDraft
from dreams_nas.supernet.drafting import Proposal
from dreams_nas.supernet.space import SubnetSpec


class ReferenceDreamDrafter:
    def __init__(self, draft: DreamDraft, spec: SubnetSpec) -> None:
        self.draft, self.spec = draft, spec
        self.required_layers = (spec.inject_layer,)

    @torch.inference_mode()
    def start(self, target, prefill) -> None:
        ids = prefill.input_ids[0]
        prompt_len = ids.shape[0]
        visual = torch.zeros(prompt_len, dtype=torch.bool)
        visual[prefill.visual_positions] = True
        scores = torch.zeros(prompt_len)
        scores[prefill.visual_positions] = prefill.visual_scores.float()
        hidden = prefill.last_hidden[0].float()
        prev = torch.cat((torch.zeros(1, hidden.shape[-1]), hidden[:-1]))
        text = (~visual).nonzero().flatten()
        self.cache = DraftCache()
        with self.draft.using(self.spec):
            self.memory = self.draft.memory(prefill.layer_hidden[self.spec.inject_layer].float(),
                                            visual[None], scores[None])
            self.draft(ids[text][None], prev[text][None], text[None], self.memory,
                       cache=self.cache)
        self.prev_hidden = hidden[-1]  # H of the last committed position
        self.next_pos = prompt_len  # position of the token the target has not consumed yet

    @torch.inference_mode()
    def propose(self, last_token, gamma, sampling, generator) -> Proposal:
        committed = self.cache.length
        token, prev, tokens = last_token.view(1, 1), self.prev_hidden.view(1, 1, -1), []
        with self.draft.using(self.spec):
            for j in range(gamma):
                pos = torch.tensor([[self.next_pos + j]])
                feature = self.draft(token, prev, pos, self.memory, cache=self.cache).feature
                token = self.draft.logits(feature[:, -1]).argmax(-1, keepdim=True)
                tokens.append(token)
                prev = feature
        self.cache.crop(committed)
        self.last_token = last_token.view(1, 1)
        out = torch.cat(tokens, dim=1) if tokens else torch.empty(1, 0, dtype=torch.long)
        return Proposal(out)

    @torch.inference_mode()
    def update(self, accepted_tokens, n_accepted, verify) -> None:
        ids = torch.cat((self.last_token, accepted_tokens[:, :n_accepted]), dim=1)  # (1, n+1)
        hidden = verify.last_hidden[0].float()  # (n+1, hidden)
        prev = torch.cat((self.prev_hidden[None], hidden[:-1]))[None]
        pos = (self.next_pos + torch.arange(n_accepted + 1))[None]
        with self.draft.using(self.spec):
            self.draft(ids, prev, pos, self.memory, cache=self.cache)
        self.prev_hidden = hidden[-1]
        self.next_pos += n_accepted + 1
