"""The training-free drafters: replay a recorded continuation, the target as its own oracle,
prompt lookup."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.tree import TokenTree
from dreams_nas.supernet.decoding.protocol import Proposal, TreeProposal
from dreams_nas.supernet.decoding.sampling import SamplingConfig
from torch import Tensor

if TYPE_CHECKING:
    from dreams_nas.supernet.target.adapter import PrefillOutput, TargetAdapter, VerifyOutput


def _empty(device: torch.device | str = "cpu") -> Tensor:
    return torch.empty(1, 0, dtype=torch.long, device=device)


class ReplayDrafter:
    """Replays a recorded continuation (e.g. the target's own greedy output) at near-zero cost:
    the loop's overhead ceiling in benchmarks. The first recorded token is the one the prefill
    produces; the drafter proposes what follows the tokens generated so far."""

    required_layers: tuple[int, ...] = ()

    def __init__(self, continuation: Tensor | list[int]) -> None:
        # kept on the host until `start` moves it to the target's device
        self.continuation = torch.as_tensor(continuation, dtype=torch.long, device="cpu").flatten()
        self.offset = 1
        self.vocab_size = int(self.continuation.max()) + 2 if len(self.continuation) else 2

    def start(self, target: TargetAdapter, prefill: PrefillOutput) -> None:
        self.offset = 1
        self.continuation = self.continuation.to(target.device)
        self.vocab_size = target.vocab_size

    def propose(self, last_token: Tensor, draft_len: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:
        return Proposal(self.continuation[self.offset:self.offset + draft_len].unsqueeze(0))

    def true_rank(self, level: int, width: int) -> int:
        """Which child (rank) of a node on the recorded path carries the recorded token."""
        return 0

    def propose_tree(self, last_token: Tensor, tree: TokenTree, sampling: SamplingConfig,
                     generator: torch.Generator | None) -> TreeProposal:
        """The recorded continuation along one path of `tree` (child `true_rank` of each node
        on it), other tokens everywhere else; where the recording ends, other tokens too."""
        tokens = [0] * (tree.nodes + 1)
        on_path = [True] + [False] * tree.nodes
        rest = self.continuation[self.offset:self.offset + tree.draft_len].tolist()
        for i in range(1, tree.nodes + 1):
            d, p = tree.levels[i], tree.parents[i]
            recorded = rest[d - 1] if d - 1 < len(rest) else None
            true = on_path[p] and recorded is not None and (
                tree.ranks[i] == self.true_rank(d, tree.branching[d - 1]))
            on_path[i] = true
            base = recorded if recorded is not None else int(last_token)
            tokens[i] = base if true else (base + 1 + tree.ranks[i]) % self.vocab_size
        out = torch.tensor(tokens[1:], dtype=torch.long, device=self.continuation.device)
        return TreeProposal(tree, out[None])

    def update(self, accepted_tokens: Tensor, n_accepted: int, verify: VerifyOutput) -> None:
        self.offset += accepted_tokens.shape[1]


class OracleDrafter(ReplayDrafter):
    """Knows the target's greedy continuation: at `start` it decodes `horizon` tokens with the
    target one at a time (as `model.generate` does), then rolls the cache back. Under greedy
    decoding every proposal is accepted, so τ = γ + 1 (tests use it to check the loop)."""

    def __init__(self, horizon: int = 256) -> None:
        super().__init__([])
        self.horizon = horizon

    def start(self, target: TargetAdapter, prefill: PrefillOutput) -> None:
        token = prefill.logits.reshape(-1, prefill.logits.shape[-1])[-1].argmax().view(1, 1)
        tokens = [token]
        for _ in range(self.horizon - 1):
            if int(token) in target.eos_token_ids:
                break
            token = target.verify(token).logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(token)
        target.rollback(len(tokens) - 1)
        self.continuation = torch.cat(tokens, dim=1).flatten()
        self.offset = 1
        self.vocab_size = target.vocab_size


class PromptLookupDrafter:
    """Prompt-lookup decoding: find the latest earlier occurrence of the last n tokens
    (n = max_ngram .. min_ngram) in the prompt and output, propose what followed it."""

    required_layers: tuple[int, ...] = ()

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise InputError(f"n-gram sizes min={min_ngram}, max={max_ngram} need 1 <= min <= max")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.history: list[int] = []

    def start(self, target: TargetAdapter, prefill: PrefillOutput) -> None:
        self.history = prefill.input_ids[0].tolist()
        self.device = prefill.input_ids.device

    def propose(self, last_token: Tensor, draft_len: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:
        self.history.append(int(last_token))
        hist = torch.tensor(self.history, device="cpu")  # the n-gram search runs on the host
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(hist) <= n:
                continue
            windows = hist.unfold(0, n, 1)[:-1]  # every earlier n-gram, (len - n, n)
            matches = (windows == hist[-n:]).all(-1).nonzero()
            if len(matches):
                begin = int(matches[-1, 0]) + n
                return Proposal(hist[begin:begin + draft_len].unsqueeze(0).to(self.device))
        return Proposal(_empty(self.device))

    def update(self, accepted_tokens: Tensor, n_accepted: int, verify: VerifyOutput) -> None:
        self.history.extend(accepted_tokens[0, :n_accepted].tolist())
