"""The loop: end-to-end sampling distribution, stats, EOS, argument checks."""

from __future__ import annotations

import math

import pytest
import torch
from _support.models import PROMPTS, tiny_image
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.decoding.drafters import (
    OracleDrafter,
    PromptLookupDrafter,
    ReplayDrafter,
)
from dreams_nas.supernet.decoding.loop import generate, plain_generate
from dreams_nas.supernet.decoding.protocol import Drafter, Proposal
from dreams_nas.supernet.decoding.registry import load_drafter
from dreams_nas.supernet.decoding.sampling import SamplingConfig, logits_to_probs
from scipy.stats import chisquare

pytestmark = pytest.mark.usefixtures("one_thread")


class FixedDistributionDrafter:
    """Draws every draft token from one fixed distribution and reports it as draft_probs."""

    required_layers: tuple[int, ...] = ()

    def __init__(self, probs: torch.Tensor) -> None:
        self.probs = probs

    def start(self, target, prefill) -> None:
        pass

    def propose(self, last_token, draft_len, sampling, generator) -> Proposal:
        tokens = torch.multinomial(self.probs, draft_len, replacement=True, generator=generator)
        return Proposal(tokens[None], self.probs.expand(1, draft_len, -1))

    def update(self, accepted_tokens, n_accepted, verify) -> None:
        pass


def test_first_sampled_tokens_follow_the_target(tiny_target) -> None:
    """Joint law of (prefill token, first token decided by the rejection rule) == the target's."""
    adapter = tiny_target("llava")
    sampling = SamplingConfig(temperature=1.0, top_k=3)
    inputs = adapter.build_inputs(tiny_image(4), PROMPTS[4])
    p1 = logits_to_probs(adapter.prefill(inputs).logits[0], sampling)
    joint, union = {}, set()
    for t1 in p1.nonzero().flatten().tolist():
        adapter.prefill(inputs)
        p2 = logits_to_probs(adapter.verify(torch.tensor([[t1]])).logits[0, -1], sampling)
        for t2 in p2.nonzero().flatten().tolist():
            joint[(t1, t2)] = float(p1[t1] * p2[t2])
            union.add(t2)
    # the draft puts mass on the target's candidates and on two tokens the target never emits
    outside = [t for t in range(adapter.vocab_size) if t not in union][:2]
    draft = torch.zeros(adapter.vocab_size)
    gen = torch.Generator().manual_seed(0)
    weights = torch.rand(len(union) + 2, generator=gen) + 0.1
    weights[0] += 2.0  # far from the target: most drafts are rejected, so the residual matters
    draft[sorted(union) + outside] = weights / weights.sum()
    draws = 600
    counts: dict = {}
    accepted = 0
    for _ in range(draws):
        result = generate(adapter, inputs, FixedDistributionDrafter(draft), shape=1,
                          max_new_tokens=3, sampling=sampling, generator=gen)
        pair = tuple(result.tokens[:2].tolist())
        counts[pair] = counts.get(pair, 0) + 1
        accepted += result.stats.cycle_lengths[0] == 2
    assert set(counts) <= set(joint), "a pair outside the target's support was produced"
    assert 0 < accepted < draws  # both the accept and the residual paths ran
    cells = sorted(joint)
    expected = torch.tensor([joint[c] for c in cells], dtype=torch.float64)
    observed = torch.tensor([counts.get(c, 0) for c in cells], dtype=torch.float64)
    stat = chisquare(observed.numpy(), (expected / expected.sum() * draws).numpy())
    assert stat.pvalue > 1e-3, (stat, observed, expected * draws)


def test_sampling_is_reproducible_with_a_generator(tiny_target) -> None:
    adapter = tiny_target("llava")
    inputs = adapter.build_inputs(tiny_image(5), PROMPTS[5])
    sampling = SamplingConfig(temperature=0.8, top_p=0.9)
    runs = [generate(adapter, inputs, PromptLookupDrafter(), shape=3, max_new_tokens=10,
                     sampling=sampling, generator=torch.Generator().manual_seed(4)).tokens
            for _ in range(2)]
    assert torch.equal(runs[0], runs[1])


def test_stats_and_accept_rates(tiny_target) -> None:
    adapter = tiny_target("llava")
    inputs = adapter.build_inputs(tiny_image(6), PROMPTS[6])
    plain = plain_generate(adapter, inputs, max_new_tokens=10, timed=True)
    half = plain.tokens.clone()
    half[3] = (half[3] + 1) % adapter.vocab_size  # the replay goes wrong at token 4
    result = generate(adapter, inputs, ReplayDrafter(half), shape=4, max_new_tokens=10,
                      timed=True)
    assert torch.equal(result.tokens, plain.tokens)
    stats = result.stats
    assert stats.cycle_lengths[0] == 3  # tokens 2, 3 accepted, token 4 from the target
    assert stats.target_forwards == 1 + len(stats.cycle_lengths)
    assert stats.tau == pytest.approx(sum(stats.cycle_lengths) / len(stats.cycle_lengths))
    rates = stats.accept_rates(4)
    assert len(rates) == 4 and all(r is None or 0 <= r <= 1 for r in rates)
    summary = stats.to_dict(draft_len=4)
    assert summary["new_tokens"] == 10 and summary["tokens_per_s"] > 0
    # the time splits into the prefill phase (both models read the prompt) and the decode phase
    parts = stats.prefill_s + stats.draft_prefill_s + stats.draft_s + stats.verify_s + stats.other_s
    assert stats.total_s == pytest.approx(parts)
    assert stats.decode_s == pytest.approx(stats.draft_s + stats.verify_s + stats.other_s)
    assert stats.draft_prefill_s > 0 and summary["draft_prefill_s"] == stats.draft_prefill_s
    assert plain.stats.draft_prefill_s == 0.0


@pytest.mark.parametrize("timed", [False, True])
def test_only_a_timed_call_synchronises_per_phase(tiny_target, monkeypatch, timed) -> None:
    """Untimed (the default) the device is synchronised once per call, for `total_s`, and the
    phase times are NaN; timed, at every phase boundary. (`_Clock._sync` is what waits for a
    CUDA device; on the CPU it is counted instead.)"""
    from dreams_nas.supernet.decoding import loop

    syncs = []
    monkeypatch.setattr(loop._Clock, "_sync", lambda self: syncs.append(1))
    adapter = tiny_target("llava")
    inputs = adapter.build_inputs(tiny_image(6), PROMPTS[6])
    ref = plain_generate(adapter, inputs, max_new_tokens=10).tokens
    syncs.clear()
    result = generate(adapter, inputs, ReplayDrafter(ref), shape=2, max_new_tokens=10,
                      timed=timed)
    stats = result.stats
    assert result.tokens.tolist() == ref.tolist() and stats.total_s > 0
    phases = (stats.prefill_s, stats.draft_prefill_s, stats.draft_s, stats.verify_s,
              stats.other_s)
    cycles = len(stats.cycle_lengths)
    if timed:
        assert len(syncs) == 1 + 2 + 4 * cycles  # start, prefill, draft prefill, 4 per cycle
        assert all(t >= 0 for t in phases)
    else:
        assert len(syncs) == 1
        assert all(math.isnan(t) for t in phases) and math.isnan(stats.decode_s)
        plain = plain_generate(adapter, inputs, max_new_tokens=10).stats
        assert plain.draft_prefill_s == 0.0 and math.isnan(plain.prefill_s)
        assert plain.tokens_per_s > 0


def test_generation_stops_at_eos(tiny_target) -> None:
    adapter = tiny_target("llava")
    inputs = adapter.build_inputs(tiny_image(7), PROMPTS[7])
    ref = plain_generate(adapter, inputs, max_new_tokens=8).tokens
    saved = adapter.eos_token_ids
    adapter.eos_token_ids = {int(ref[4])}  # pretend the fifth token is EOS
    try:
        first_eos = ref.tolist().index(int(ref[4]))
        for drafter in (OracleDrafter(8), None):
            out = generate(adapter, inputs, drafter, shape=5, max_new_tokens=8)
            assert out.tokens.tolist() == ref[: first_eos + 1].tolist()
    finally:
        adapter.eos_token_ids = saved


def test_drafters_satisfy_the_protocol(tiny_target) -> None:
    adapter = tiny_target("llava")
    for drafter in (OracleDrafter(), ReplayDrafter([1, 2]), PromptLookupDrafter(),
                    load_drafter("lookup", adapter), load_drafter("oracle", adapter)):
        assert isinstance(drafter, Drafter)


def test_bad_arguments(tiny_target, tmp_path) -> None:
    adapter = tiny_target("llava")
    inputs = adapter.build_inputs(tiny_image(0), PROMPTS[0])
    with pytest.raises(InputError, match="draft_len 0 must be >= 1"):
        generate(adapter, inputs, PromptLookupDrafter(), shape=0)
    with pytest.raises(InputError, match="unknown drafter 'eagle'"):
        load_drafter("eagle", adapter)
    with pytest.raises(InputError, match="holds no spec.json"):
        load_drafter(tmp_path, adapter)


@pytest.mark.parametrize("name", ["oracle", "lookup", "fixed-distribution"])
def test_shipped_drafters_meet_the_contract(name, tiny_target) -> None:
    from _support.drafter_contract import assert_drafter_contract

    adapter = tiny_target("qwen2_vl")
    cases = []
    for i in range(2):
        inputs = adapter.build_inputs(tiny_image(i), PROMPTS[i])
        cases.append((inputs, plain_generate(adapter, inputs, max_new_tokens=10).tokens))
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(adapter.vocab_size, generator=gen), -1)
    make = {"oracle": lambda: OracleDrafter(10), "lookup": PromptLookupDrafter,
            "fixed-distribution": lambda: FixedDistributionDrafter(probs)}[name]
    assert_drafter_contract(adapter, make, cases)


@pytest.mark.cuda
def test_lossless_and_sampling_on_cuda(tiny_models) -> None:
    """Same loop on a GPU: greedy equals HF generate; sampling runs with a CUDA generator."""
    from dreams_nas.supernet.target.adapter import TargetAdapter

    model, processor = tiny_models.build_tiny_vlm("qwen2_vl")
    adapter = TargetAdapter.from_model(model.to("cuda"), processor)
    for i in range(3):
        inputs = adapter.build_inputs(tiny_image(i), PROMPTS[i])
        with torch.inference_mode():
            hf_out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
            ref = hf_out[0, inputs["input_ids"].shape[1]:]
        for drafter in (OracleDrafter(12), PromptLookupDrafter()):
            out = generate(adapter, inputs, drafter, shape=3, max_new_tokens=12)
            assert out.tokens.tolist() == ref.cpu().tolist()
    gen = torch.Generator(device="cuda").manual_seed(0)
    out = generate(adapter, inputs, PromptLookupDrafter(), shape=3, max_new_tokens=12,
                   sampling=SamplingConfig(temperature=1.0, top_p=0.9), generator=gen)
    assert 1 <= out.stats.new_tokens <= 12
