"""A batched drafter for tests: each row's known continuation, wrong at every third position.

`BatchOracle(continuations)` drafts, for row b, the next tokens of `continuations[b]` (the
target's own greedy output), except that every draft at a continuation index i with
i % 3 == 2 is off by one id: rows accept 0, 1 or 2 drafts a cycle depending on where they
stand, so the rows of one batch advance by different amounts. It follows the batched
drafter's calls (`supernet.decoding.batch_dream.BatchDreamDrafter`)."""

from __future__ import annotations

import torch
from dreams_nas.supernet.decoding.protocol import Proposal, TreeProposal


class BatchOracle:
    required_layers: tuple[int, ...] = ()

    def __init__(self, continuations: list[list[int]], vocab: int) -> None:
        width = max(len(c) for c in continuations) + 64
        self.table = torch.zeros(len(continuations), width, dtype=torch.long)
        for b, c in enumerate(continuations):
            self.table[b, :len(c)] = torch.tensor(c)
        self.vocab = vocab

    def start(self, batch: int, positions: int) -> None:
        assert batch == self.table.shape[0]
        self.offset = torch.ones(batch, dtype=torch.long)  # index of the next token to draft

    def admit(self, row: int, target, prefill) -> None:
        pass

    def propose(self, last, draft_len, sampling, generator) -> Proposal:
        index = self.offset[:, None] + torch.arange(draft_len)
        tokens = self.table.gather(1, index.clamp(max=self.table.shape[1] - 1))
        tokens = torch.where(index % 3 == 2, (tokens + 1) % self.vocab, tokens)
        return Proposal(tokens.to(last.device))

    def propose_tree(self, last, tree, sampling, generator) -> TreeProposal:
        """The tree's nodes: at level d the row's true token (wrong where the chain's would
        be) sits under the true path at rank d % width, its siblings and every other node
        other tokens."""
        on_path = torch.zeros(self.table.shape[0], dtype=torch.long)
        levels = []
        for d, width in enumerate(tree.branching, start=1):
            m = len(tree.nodes_at(d))
            index = (self.offset + d - 1).clamp(max=self.table.shape[1] - 1)
            true = self.table.gather(1, index[:, None])[:, 0]
            true = torch.where(index % 3 == 2, (true + 1) % self.vocab, true)
            tokens = (true[:, None] + 1 + torch.arange(m)) % self.vocab
            on_path = on_path * width + d % width
            tokens = tokens.scatter(1, on_path[:, None], true[:, None])
            levels.append(tokens)
        return TreeProposal(tree, torch.cat(levels, dim=1).to(last.device))

    def update(self, kept, n, hidden) -> None:
        self.offset = self.offset + n.cpu().clamp(min=-1) + 1

    def select(self, index: list[int]) -> None:
        self.table = self.table[index]
        self.offset = self.offset[index]
