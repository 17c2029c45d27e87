"""Lossless greedy speculative decoding on every family: the output equals
model.generate(do_sample=False)."""

from __future__ import annotations

import pytest
import torch
from _support.models import FAMILIES, PROMPTS, tiny_image
from dreams_nas.supernet.core.tree import TokenTree
from dreams_nas.supernet.decoding.drafters import OracleDrafter, PromptLookupDrafter, ReplayDrafter
from dreams_nas.supernet.decoding.loop import generate, plain_generate

MAX_NEW = 12
GAMMAS = (1, 3, 5)
# image sizes (width, height) cycle so LLaVA-NeXT/Qwen/Pixtral see varying image-token counts
SIZES = ((16, 16), (32, 16), (16, 32))


class WrongDrafter(OracleDrafter):
    """Proposes tokens that are all wrong: the target's greedy continuation shifted by one id."""

    def start(self, target, prefill) -> None:
        super().start(target, prefill)
        self.continuation = (self.continuation + 1) % target.vocab_size


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=FAMILIES)
def family_case(request, tiny_vlm, tiny_target):
    """(adapter, [(inputs, reference tokens)] for 10 prompts), built once per family."""
    model, _ = tiny_vlm(request.param)
    adapter = tiny_target(request.param)
    cases = []
    for i, prompt in enumerate(PROMPTS[:10]):
        inputs = adapter.build_inputs(tiny_image(i, SIZES[i % len(SIZES)]), prompt)
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
        cases.append((inputs, out[0, inputs["input_ids"].shape[1]:].cpu()))
    return adapter, cases


def _run_all(family_case, make_drafter):
    adapter, cases = family_case
    mismatches, results = [], []
    for i, (inputs, ref) in enumerate(cases):
        for draft_len in GAMMAS:
            result = generate(adapter, inputs, make_drafter(ref), shape=draft_len,
                              max_new_tokens=MAX_NEW)
            results.append((draft_len, result))
            if result.tokens.tolist() != ref.tolist():
                mismatches.append((i, draft_len, result.tokens.tolist(), ref.tolist()))
    assert not mismatches, f"{adapter.family}: speculative != generate for {mismatches[:3]}"
    return results


def test_plain_decoding_equals_generate(family_case) -> None:
    adapter, cases = family_case
    for inputs, ref in cases:
        result = plain_generate(adapter, inputs, max_new_tokens=MAX_NEW)
        assert result.tokens.tolist() == ref.tolist()
        assert result.stats.tau == 1.0 and result.stats.target_forwards == len(ref)


def test_oracle_is_lossless_and_accepts_everything(family_case) -> None:
    for draft_len, result in _run_all(family_case, lambda ref: OracleDrafter(horizon=MAX_NEW)):
        lengths = result.stats.cycle_lengths
        assert all(n == draft_len + 1 for n in lengths[:-1]), (draft_len, lengths)
        assert 1 <= lengths[-1] <= draft_len + 1
        assert sum(lengths) + 1 == result.stats.new_tokens  # + the prefill's token


def test_replay_is_lossless(family_case) -> None:
    _run_all(family_case, lambda ref: ReplayDrafter(ref))


def test_prompt_lookup_is_lossless(family_case) -> None:
    _run_all(family_case, lambda ref: PromptLookupDrafter())


def test_always_wrong_drafter_is_lossless(family_case) -> None:
    for _, result in _run_all(family_case, lambda ref: WrongDrafter(horizon=MAX_NEW)):
        assert set(result.stats.cycle_lengths) == {1}
        assert all(p >= 1 for p in result.stats.proposed[:-1])


# --- token trees: one verify forward over the tree, the accepted path kept in the cache -----
TREES = (TokenTree((2, 1)), TokenTree((3, 2, 1)), TokenTree((2, 2, 2, 1)))


class RotatingOracle(OracleDrafter):
    """The oracle's tokens on the path whose rank at depth d is (d - 1) mod width: every
    depth accepts a child that is not always the first."""

    def true_rank(self, depth: int, width: int) -> int:
        return (depth - 1) % width


def _run_trees(family_case, make_drafter):
    adapter, cases = family_case
    if not adapter.supports_trees:
        pytest.skip(f"{adapter.family}: {adapter.tree_note}")
    mismatches, results = [], []
    for i, (inputs, ref) in enumerate(cases):
        for tree in TREES:
            result = generate(adapter, inputs, make_drafter(), shape=tree, max_new_tokens=MAX_NEW)
            results.append((tree, result))
            if result.tokens.tolist() != ref.tolist():
                mismatches.append((i, tree.label, result.tokens.tolist(), ref.tolist()))
    assert not mismatches, f"{adapter.family}: tree speculative != generate for {mismatches[:3]}"
    return results


def test_tree_oracle_is_lossless_and_accepts_every_level(family_case) -> None:
    for tree, result in _run_trees(family_case, lambda: RotatingOracle(horizon=MAX_NEW)):
        lengths = result.stats.cycle_lengths
        assert all(n == tree.draft_len + 1 for n in lengths[:-1]), (tree.label, lengths)


def test_tree_always_wrong_drafter_is_lossless(family_case) -> None:
    for _, result in _run_trees(family_case, lambda: WrongDrafter(horizon=MAX_NEW)):
        assert set(result.stats.cycle_lengths) == {1}
