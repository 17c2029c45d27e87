"""The contract every drafter meets (shipped ones, the DREAM-S draft, extracted subnets).

    from _support.drafter_contract import assert_drafter_contract
    assert_drafter_contract(adapter, lambda: MyDrafter(...), cases)

`cases` is a list of (inputs, plain greedy tokens). The suite wraps the drafter in a proxy that
checks every call against the protocol in `dreams_nas.supernet.decoding.protocol`, then checks
that greedy speculative decoding reproduces plain decoding for several γ and that sampling runs
and is reproducible with a seeded generator.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from dreams_nas.supernet.decoding.loop import generate
from dreams_nas.supernet.decoding.protocol import Drafter, Proposal
from dreams_nas.supernet.decoding.sampling import SamplingConfig


class CheckingDrafter:
    """Forwards to `inner` and asserts the protocol at every call."""

    def __init__(self, inner: Drafter, target) -> None:
        assert isinstance(inner, Drafter), f"{type(inner).__name__} does not implement Drafter"
        self.inner, self.target = inner, target
        self.required_layers = tuple(inner.required_layers)
        self.calls = {"start": 0, "propose": 0, "update": 0}

    def start(self, target, prefill) -> None:
        assert self.calls["start"] == 0
        for layer in self.required_layers:
            assert prefill.layer_hidden[layer].shape[:2] == prefill.input_ids.shape
        cache = target.cache_len
        self.inner.start(target, prefill)
        assert target.cache_len == cache, "start() must leave the target's cache as it found it"
        self.calls["start"] += 1

    def propose(self, last_token, draft_len, sampling, generator) -> Proposal:
        assert last_token.shape == (1, 1) and draft_len >= 1
        cache = self.target.cache_len
        proposal = self.inner.propose(last_token, draft_len, sampling, generator)
        assert self.target.cache_len == cache, "propose() must not touch the target's cache"
        k = proposal.tokens.shape[1]
        assert proposal.tokens.shape == (1, k) and k <= draft_len
        assert proposal.tokens.dtype == torch.long
        if proposal.draft_probs is not None:
            probs = proposal.draft_probs
            assert probs.shape == (1, k, self.target.vocab_size)
            assert bool((probs >= 0).all())
            ones = torch.ones(1, k, device=probs.device, dtype=probs.dtype)
            torch.testing.assert_close(probs.sum(-1), ones)
            if k and not sampling.greedy:
                picked = probs[0, torch.arange(k), proposal.tokens[0]]
                assert bool((picked > 0).all()), "a proposed token has zero draft probability"
        self.calls["propose"] += 1
        return proposal

    def update(self, accepted_tokens, n_accepted, verify) -> None:
        assert accepted_tokens.shape == (1, n_accepted + 1)
        assert verify.logits.shape[:2] == (1, n_accepted + 1)
        for layer in self.required_layers:
            assert verify.layer_hidden[layer].shape[:2] == (1, n_accepted + 1)
        self.inner.update(accepted_tokens, n_accepted, verify)
        self.calls["update"] += 1


def assert_drafter_contract(adapter, make_drafter: Callable[[], Drafter],
                            cases: list[tuple[dict, torch.Tensor]], draft_lens=(1, 3, 5)) -> None:
    max_new = max(len(ref) for _, ref in cases)
    for inputs, ref in cases:
        for draft_len in draft_lens:
            checking = CheckingDrafter(make_drafter(), adapter)
            out = generate(adapter, inputs, checking, shape=draft_len, max_new_tokens=max_new)
            assert out.tokens.tolist() == ref.tolist(), f"draft_len={draft_len}: not lossless"
            assert checking.calls["start"] == 1
            assert checking.calls["update"] == len(out.stats.cycle_lengths)
    sampling = SamplingConfig(temperature=1.0, top_p=0.95)
    inputs = cases[0][0]
    runs = [generate(adapter, inputs, CheckingDrafter(make_drafter(), adapter), shape=3,
                     max_new_tokens=max_new, sampling=sampling,
                     generator=torch.Generator().manual_seed(11)).tokens for _ in range(2)]
    assert torch.equal(runs[0], runs[1]), "sampling with a seeded generator is not reproducible"
