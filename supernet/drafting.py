"""The drafter protocol and the training-free drafters.

A drafter guesses the next tokens; the loop in `decoding.py` verifies them with the target. The
protocol (in the spirit of transformers' ``CandidateGenerator``) has three calls per sequence:

``start(target, prefill)``
    once, after the target's prefill. ``prefill`` is the `PrefillOutput` (input ids, last hidden
    states, ``layer_hidden`` for every layer in ``required_layers``, visual positions and
    scores). The target's cache then holds the prompt; the first generated token is not in it.
``propose(last_token, gamma, sampling, generator) -> Proposal``
    up to ``gamma`` tokens that follow ``last_token`` (1, 1): the newest generated token, which
    the target has not yet consumed. ``Proposal.draft_probs`` (1, k, vocab) are the draft's
    probabilities *after* `sampling` was applied (``logits_to_probs``); ``None`` means a
    deterministic drafter (treated as one-hot, which keeps the rejection rule exact). Fewer than
    ``gamma`` tokens, even zero, is allowed. A drafter must not touch the target's cache.
``update(accepted_tokens, n_accepted, verify)``
    after each verification. ``accepted_tokens`` (1, n_accepted + 1) are the accepted draft tokens
    followed by the target's own next token (it becomes the next ``last_token``).
    ``verify`` is the `VerifyOutput` of exactly the positions now committed to the target's
    cache: ``last_token`` and the n accepted draft tokens (n + 1 positions), with
    ``last_hidden`` and ``layer_hidden`` for ``required_layers``.

``required_layers`` (a tuple of HF hidden-state indices) tells the loop which target layers the
adapter must capture at prefill and at every verify. An optional ``default_gamma`` attribute (a
spec's ``draft_len``) is the draft length `dreams-nas generate` uses when none is given. A deployable spec folder plugs in through
`load_drafter` (the DREAM-S draft registers there once the supernet lands).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from torch import Tensor

from .errors import InputError
from .sampling import SamplingConfig

if TYPE_CHECKING:
    from .target import PrefillOutput, TargetAdapter, VerifyOutput

DRAFTER_NAMES = ("lookup", "oracle", "replay")


@dataclass(frozen=True)
class Proposal:
    tokens: Tensor  # (1, k) long, k <= gamma (may be 0)
    draft_probs: Tensor | None = None  # (1, k, vocab) after sampling processing; None = deterministic


@runtime_checkable
class Drafter(Protocol):
    required_layers: tuple[int, ...]

    def start(self, target: TargetAdapter, prefill: PrefillOutput) -> None: ...

    def propose(self, last_token: Tensor, gamma: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal: ...

    def update(self, accepted_tokens: Tensor, n_accepted: int, verify: VerifyOutput) -> None: ...


def _empty(device: torch.device | str = "cpu") -> Tensor:
    return torch.empty(1, 0, dtype=torch.long, device=device)


class ReplayDrafter:
    """Replays a recorded continuation (e.g. the target's own greedy output) at near-zero cost:
    the loop's overhead ceiling in benchmarks. The first recorded token is the one the prefill
    produces; the drafter proposes what follows the tokens generated so far."""

    required_layers: tuple[int, ...] = ()

    def __init__(self, continuation: Tensor | list[int]) -> None:
        self.continuation = torch.as_tensor(continuation, dtype=torch.long).flatten()
        self.offset = 1

    def start(self, target: TargetAdapter, prefill: PrefillOutput) -> None:
        self.offset = 1
        self.continuation = self.continuation.to(target.device)

    def propose(self, last_token: Tensor, gamma: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:
        return Proposal(self.continuation[self.offset:self.offset + gamma].unsqueeze(0))

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

    def propose(self, last_token: Tensor, gamma: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:
        self.history.append(int(last_token))
        hist = torch.tensor(self.history)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(hist) <= n:
                continue
            windows = hist.unfold(0, n, 1)[:-1]  # every earlier n-gram, (len - n, n)
            matches = (windows == hist[-n:]).all(-1).nonzero()
            if len(matches):
                begin = int(matches[-1, 0]) + n
                return Proposal(hist[begin:begin + gamma].unsqueeze(0).to(self.device))
        return Proposal(_empty(self.device))

    def update(self, accepted_tokens: Tensor, n_accepted: int, verify: VerifyOutput) -> None:
        self.history.extend(accepted_tokens[0, :n_accepted].tolist())


def load_drafter(name_or_path: str | Path, target: TargetAdapter, *, max_new_tokens: int = 256) -> Drafter:
    """A drafter by name (lookup, oracle) or from a deployable spec folder (specs/<spec_id>/)."""
    name = str(name_or_path)
    if name == "lookup":
        return PromptLookupDrafter()
    if name == "oracle":
        return OracleDrafter(horizon=max_new_tokens)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "spec.json").is_file():
            raise InputError(f"drafter folder {name!r} holds no spec.json; pass a folder written by "
                             "`dreams-nas search` (specs/<spec_id>/) or one of: lookup, oracle")
        try:
            from .spec_drafter import (
                load_spec_drafter,  # the DREAM-S draft, from the supernet issue
            )
        except ImportError as exc:
            raise InputError(f"drafter folder {name!r}: this build cannot load DREAM-S spec folders yet "
                             "(dreams_nas.supernet.spec_drafter is missing); use lookup or oracle") from exc
        return load_spec_drafter(path, target)
    raise InputError(f"unknown drafter {name!r}; pick lookup, oracle or the path of a spec folder "
                     "(specs/<spec_id>/ in the run folder)")
