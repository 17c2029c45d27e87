"""Several requests at once: every row of a batched run is its request's own output.

On every family, plain batched decoding gives each request what HF greedy `generate` gives it
alone, and batched speculative decoding (rows accepting different numbers of drafts) gives
what plain batched decoding gives; the DREAM draft drafts in a batch what it drafts alone;
sampled rows keep the target's distribution."""

from __future__ import annotations

import pytest
import torch
from _support.batch_oracle import BatchOracle
from _support.drafts import second_token_law, train_tiny_draft
from _support.models import FAMILIES, PROMPTS, build_tiny_llava, tiny_image, tiny_prompts
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.core.tree import TokenTree
from dreams_nas.supernet.decoding.batch_dream import BatchDreamDrafter
from dreams_nas.supernet.decoding.batch_loop import generate_batch
from dreams_nas.supernet.decoding.dream import DreamDrafter
from dreams_nas.supernet.decoding.loop import generate
from dreams_nas.supernet.decoding.sampling import SamplingConfig
from dreams_nas.supernet.target.adapter import TargetAdapter

MAX_NEW = 10
SIZES = ((16, 16), (32, 16), (16, 32))
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("family", FAMILIES)
def test_each_row_is_its_requests_own_output(family, tiny_vlm) -> None:
    """Three requests of different lengths (image sizes, prompts): plain batched decoding
    equals HF greedy per request; speculative rows that advance by 1..3 tokens a cycle equal
    plain batched decoding; eager and static rows alike."""
    model, processor = tiny_vlm(family)
    adapter = TargetAdapter.from_model(model, processor)
    requests, refs = [], []
    for i in range(3):
        inputs = adapter.build_inputs(tiny_image(i, SIZES[i]), PROMPTS[i + 2])
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
        requests.append(inputs)
        refs.append(out[0, inputs["input_ids"].shape[1]:].tolist())
    assert len({int(r["input_ids"].shape[1]) for r in requests}) > 1 or family in (
        "llava", "idefics3", "smolvlm", "pixtral")  # fixed-size images: prompts differ
    plain = generate_batch(adapter, requests, None, max_new_tokens=MAX_NEW)
    assert [t.tolist() for t in plain.tokens] == refs
    adapter.use_steps("static")
    oracle = BatchOracle(refs, adapter.vocab_size)
    spec = generate_batch(adapter, requests, oracle, shape=3, max_new_tokens=MAX_NEW)
    assert [t.tolist() for t in spec.tokens] == refs
    assert len(set(spec.stats.cycle_lengths)) > 1  # rows kept different amounts
    assert spec.stats.steps[0] == 3 and len(spec.stats.steps) < len(plain.stats.steps)
    assert adapter.supports_trees  # every tiny config verifies trees
    tree = generate_batch(adapter, requests, BatchOracle(refs, adapter.vocab_size),
                          shape=TokenTree((2, 2, 1)), max_new_tokens=MAX_NEW)
    assert [t.tolist() for t in tree.tokens] == refs
    assert {1, 2, 3} <= set(tree.stats.cycle_lengths)  # paths through rank 0 and rank 1 nodes
    adapter.use_steps("dynamic")


def test_finished_rows_leave_the_batch(tiny_vlm) -> None:
    """Rows with smaller budgets (one token, an EOS early) stop costing: the batch shrinks to
    the rows left, or with compiled steps to the next power of two."""
    model, processor = tiny_vlm("llava")
    for mode in ("static", "compiled"):
        adapter = TargetAdapter.from_model(model, processor)
        adapter.use_steps(mode, backend="eager")
        requests = [adapter.build_inputs(tiny_image(i), p) for i, p in enumerate(PROMPTS[:5])]
        eos = generate_batch(adapter, requests, None, max_new_tokens=MAX_NEW).tokens[2][3]
        adapter.eos_token_ids = {int(eos)}  # row 2 ends at its fourth token
        out = generate_batch(adapter, requests, None, max_new_tokens=MAX_NEW)
        assert len(out.tokens[2]) == 4 and out.tokens[2][-1] == eos
        assert out.stats.steps[0] == 5
        assert out.stats.steps[-1] <= 4
        if mode == "compiled":
            assert set(out.stats.steps) <= {5, 4, 2, 1}
        adapter.use_steps("dynamic")


@pytest.fixture(scope="module")
def trained():
    model = build_tiny_llava(seed=1)
    adapter = TargetAdapter.from_model(model)
    prompts = tiny_prompts(16, seed=5)
    return adapter, train_tiny_draft(adapter, prompts), prompts


@pytest.mark.parametrize("mode", ["static", "compiled"])
def test_the_draft_drafts_in_a_batch_what_it_drafts_alone(trained, mode) -> None:
    """Per request the same tokens and the same accepted lengths, cycle for cycle, as the
    batch-1 loop with the same subnet, chains and a token tree; compiled (dynamo's capture), a
    second batch of the same shapes compiles nothing."""
    from torch._dynamo.utils import counters

    shared, draft, prompts = trained
    adapter = TargetAdapter.from_model(shared.model)  # steps of its own
    adapter.use_steps(mode, backend="eager")
    spec = SubnetSpec(4, 1.0, 2, 4)
    requests = prompts[:5]
    for shape in (4, TokenTree((2, 2, 1))):
        alone = [generate(adapter, r, DreamDrafter(draft, spec), shape=shape,
                          max_new_tokens=12) for r in requests]
        graphs = []
        for _ in range(2):
            before = counters["stats"]["unique_graphs"]
            out = generate_batch(adapter, requests, BatchDreamDrafter(draft, spec), shape=shape,
                                 max_new_tokens=12)
            graphs.append(counters["stats"]["unique_graphs"] - before)
            assert [t.tolist() for t in out.tokens] == [a.tokens.tolist() for a in alone]
            assert sorted(out.stats.cycle_lengths) == sorted(
                c for a in alone for c in a.stats.cycle_lengths), shape
        assert max(out.stats.cycle_lengths) > 2  # the draft's tokens were accepted
        assert graphs[1] == 0 and (graphs[0] > 0) == (mode == "compiled")
    adapter.use_steps("dynamic")


@pytest.mark.parametrize("shape", [2, TokenTree((3, 1))], ids=["chain", "tree-3x1"])
def test_sampled_rows_keep_the_targets_distribution(trained, shape) -> None:
    """Eight rows of one prompt, sampled: the second token (the first a draft proposes) over
    every row of many seeded batches vs its exact law; with a tree, siblings sampled without
    replacement and tried by recursive rejection."""
    from scipy.stats import chisquare

    adapter, draft, prompts = trained
    prompt = prompts[0]
    sampling = SamplingConfig(temperature=1.0, top_k=4)
    expected = second_token_law(adapter, prompt, sampling)
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros_like(expected)
    accepted = 0
    drafter = BatchDreamDrafter(draft, SubnetSpec(4, 1.0, 2, 2))
    for _ in range(30):
        out = generate_batch(adapter, [prompt] * 8, drafter, shape=shape, max_new_tokens=3,
                             sampling=sampling, generator=gen)
        for tokens in out.tokens:
            counts[tokens[1]] += 1
        accepted += sum(c > 1 for c in out.stats.cycle_lengths)
    support = expected > 0
    assert counts[~support].sum() == 0
    _, p = chisquare(counts[support].numpy(), expected[support].numpy() * counts.sum().item())
    assert p > 1e-3, (counts[support], expected[support])
    assert accepted > 24  # drafts, not only resamples, made tokens


def test_bad_arguments(tiny_target) -> None:
    adapter = tiny_target("llava")
    with pytest.raises(InputError, match="no requests"):
        generate_batch(adapter, [], None)
    inputs = adapter.build_inputs(tiny_image(0), PROMPTS[0])
    with pytest.raises(InputError, match="draft_len 0"):
        generate_batch(adapter, [inputs], BatchOracle([[1, 2]], 10), shape=0)


def test_the_demo_target_decodes_each_request_as_at_batch_1(builtin_cache) -> None:
    """The built-in target (its test-size build) on its own evaluation prompts: batches of 4,
    plain and speculative (a chain drafted by the supernet's largest subnet, untrained here),
    give every request the tokens batch-1 decoding gives it: the batched products' other
    summation order flips no token."""
    from dreams_nas.latency.measure.steps import build_supernet
    from dreams_nas.nas.stages.inputs import load_eval_examples
    from dreams_nas.supernet.builtin.cache import ensure_builtin_target
    from dreams_nas.supernet.core.space import SearchSpace
    from dreams_nas.supernet.decoding.loop import plain_generate

    adapter = TargetAdapter.load(ensure_builtin_target(builtin_cache, variant="tiny"))
    examples = load_eval_examples("builtin", 8, 0)
    requests = [adapter.build_inputs(e.image_path, e.prompt) for e in examples]
    alone = [plain_generate(adapter, r, max_new_tokens=16).tokens.tolist() for r in requests]
    space = SearchSpace.default_for(adapter.num_layers, 4)
    supernet = build_supernet(adapter.model, space)
    drafter = BatchDreamDrafter(supernet, space.largest())
    for drafted in (None, drafter):
        for start in (0, 4):
            out = generate_batch(adapter, requests[start:start + 4], drafted, shape=3,
                                 max_new_tokens=16)
            assert [t.tolist() for t in out.tokens] == alone[start:start + 4]
