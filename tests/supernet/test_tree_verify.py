"""Tree verification on every family: one forward over a token tree gives each node the logits
of a chain over its root-to-node path, and compacting the cache to a path leaves it as a fresh
prefill of that path would (so decoding stays lossless after a tree cycle)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from _support.models import FAMILIES, PROMPTS, build_tiny_vlm, tiny_image
from _support.processing import WORDS
from dreams_nas.supernet.core.tree import TokenTree
from dreams_nas.supernet.target.adapter import TargetAdapter
from dreams_nas.supernet.target.tree_attention import tree_support

pytestmark = pytest.mark.usefixtures("one_thread")

TREES = (TokenTree((2, 1)), TokenTree((3, 2, 1)), TokenTree((2, 2, 2)))
SIZES = ((16, 16), (32, 16))  # varying image-token counts (LLaVA-NeXT, Qwen, Pixtral)
FP32 = dict(rtol=1e-5, atol=2e-5)  # wrong positions or masks move these logits by ~1e-3
BF16 = dict(rtol=1e-2, atol=8e-3)  # one or two bf16 steps at this logit scale


@pytest.fixture(scope="module", params=FAMILIES)
def case(request, tiny_target):
    """(adapter, [inputs of 2 prompts]) per family."""
    adapter = tiny_target(request.param)
    prompts = [adapter.build_inputs(tiny_image(i, SIZES[i]), PROMPTS[i]) for i in range(2)]
    return adapter, prompts


def _tokens(adapter: TargetAdapter, n: int, seed: int) -> torch.Tensor:
    """(1, n) random word tokens (never an image placeholder)."""
    words = torch.tensor(adapter.tokenizer.convert_tokens_to_ids(list(WORDS)))
    pick = torch.randint(len(words), (n,), generator=torch.Generator().manual_seed(seed))
    return words[pick][None]


def _check_nodes_match_paths(adapter: TargetAdapter, inputs, tree: TokenTree, seed: int,
                             **tol) -> None:
    """verify_tree's logits at every node == a chain verify of its path on the same prefix."""
    tokens = _tokens(adapter, tree.nodes + 1, seed)
    adapter.prefill(inputs)
    start = adapter.cache_len
    out = adapter.verify_tree(tokens, tree.parents)
    assert out.logits.shape == (1, tree.nodes + 1, adapter.vocab_size)
    assert adapter.cache_len == start + tree.nodes + 1
    adapter.rollback(tree.nodes + 1)
    for leaf in tree.nodes_at(tree.draft_len):  # every node lies on some leaf's path
        path = tree.path(leaf)
        chain = adapter.verify(tokens[:, path])
        torch.testing.assert_close(out.logits[0, path], chain.logits[0], **tol)
        adapter.rollback(len(path))


def test_every_family_supports_trees(case) -> None:
    adapter, _ = case
    assert adapter.supports_trees and adapter.tree_note is None


def test_chain_parents_equal_verify(case) -> None:
    adapter, prompts = case
    chain = TokenTree.chain(3)
    layers = (0, 1, adapter.num_layers)
    for seed, inputs in enumerate(prompts):
        tokens = _tokens(adapter, chain.nodes + 1, seed)
        adapter.prefill(inputs)
        tree_out = adapter.verify_tree(tokens, chain.parents, layers)
        adapter.rollback(chain.nodes + 1)
        out = adapter.verify(tokens, layers)
        torch.testing.assert_close(tree_out.logits, out.logits, **FP32)
        torch.testing.assert_close(tree_out.last_hidden, out.last_hidden, **FP32)
        for i in layers:
            torch.testing.assert_close(tree_out.layer_hidden[i], out.layer_hidden[i], **FP32)


@pytest.mark.parametrize("tree", TREES, ids=lambda t: t.label)
def test_every_node_equals_the_chain_of_its_path(case, tree) -> None:
    adapter, prompts = case
    for seed, inputs in enumerate(prompts):
        _check_nodes_match_paths(adapter, inputs, tree, seed, **FP32)


def test_keep_path_equals_a_fresh_prefill_of_the_path(case) -> None:
    adapter, prompts = case
    tree = TokenTree((3, 2, 1))
    deepest = tree.nodes_at(tree.draft_len)
    for seed, inputs in enumerate(prompts):
        tokens = _tokens(adapter, tree.nodes + 2, seed)
        nodes, after = tokens[:, :-1], tokens[:, -1:]
        for path in (tree.path(deepest[3 * seed + 1]), tree.path(tree.nodes_at(1)[2]), [0]):
            adapter.prefill(inputs)
            start = adapter.cache_len
            adapter.verify_tree(nodes, tree.parents)
            adapter.keep_path(path, tree.nodes + 1)
            assert adapter.cache_len == start + len(path)
            kept = [(layer.keys.clone(), layer.values.clone()) for layer in adapter.cache.layers]
            compacted = adapter.verify(after).logits
            adapter.prefill(adapter.extend_inputs(inputs, nodes[:, path]))
            for layer, (keys, values) in zip(adapter.cache.layers, kept, strict=True):
                torch.testing.assert_close(keys, layer.keys, **FP32)
                torch.testing.assert_close(values, layer.values, **FP32)
            # the next step attends to the compacted cache at the right position (M-RoPE too)
            torch.testing.assert_close(compacted, adapter.verify(after).logits, **FP32)


def test_sdpa_and_eager_agree(case, tiny_vlm) -> None:
    adapter, prompts = case
    model, processor = tiny_vlm(adapter.family)
    eager_model = copy.deepcopy(model)
    eager_model.set_attn_implementation("eager")
    eager = TargetAdapter.from_model(eager_model, processor)
    assert eager.supports_trees
    tree = TokenTree((2, 2, 2))
    tokens = _tokens(adapter, tree.nodes + 1, 7)
    outs = []
    for target in (adapter, eager):
        target.prefill(prompts[0])
        outs.append(target.verify_tree(tokens, tree.parents).logits)
    torch.testing.assert_close(outs[0], outs[1], **FP32)
    _check_nodes_match_paths(eager, prompts[1], tree, 8, **FP32)


@pytest.mark.parametrize("attn", ("sdpa", "eager"))
def test_bf16_nodes_match_paths(attn) -> None:
    model, processor = build_tiny_vlm("llava", dtype=torch.bfloat16)
    model.set_attn_implementation(attn)
    adapter = TargetAdapter.from_model(model, processor)
    assert adapter.dtype == torch.bfloat16
    inputs = adapter.build_inputs(tiny_image(3), PROMPTS[3])
    _check_nodes_match_paths(adapter, inputs, TokenTree((3, 2, 1)), 3, **BF16)


def test_arguments_are_checked(tiny_target) -> None:
    adapter = tiny_target("llava")
    tree = TokenTree((2, 1))
    tokens = _tokens(adapter, tree.nodes + 1, 0)
    adapter.prefill(adapter.build_inputs(tiny_image(0), PROMPTS[0]))
    with pytest.raises(ValueError, match="must follow verify_tree"):
        adapter.keep_path([0], tree.nodes + 1)
    with pytest.raises(ValueError, match="must start with -1"):
        adapter.verify_tree(tokens, (0, 0, 1, 2, 3))
    with pytest.raises(ValueError, match=r"parents\[2\] = 2 must name an earlier node"):
        adapter.verify_tree(tokens, (-1, 0, 2, 1, 2))
    with pytest.raises(ValueError, match="4 entries for 5 tree nodes"):
        adapter.verify_tree(tokens, (-1, 0, 0, 1))
    adapter.verify_tree(tokens, tree.parents)
    with pytest.raises(ValueError, match=r"keep_path\(n=4\) but the last verify_tree appended 5"):
        adapter.keep_path([0], 4)
    with pytest.raises(ValueError, match="must start at node 0"):
        adapter.keep_path([1, 3], 5)
    with pytest.raises(ValueError, match="node 4 is not a child of node 1"):
        adapter.keep_path([0, 1, 4], 5)
    adapter.rollback(1)  # anything between verify_tree and keep_path voids the tree
    with pytest.raises(ValueError, match="must follow verify_tree"):
        adapter.keep_path([0], 5)


def test_tree_support_names_what_cannot_take_a_tree_mask(tiny_vlm) -> None:
    def config(**kw):
        base = dict(_attn_implementation="sdpa", sliding_window=None, layer_types=None,
                    max_position_embeddings=1024)
        return SimpleNamespace(**{**base, **kw})

    assert tree_support(config()) is None
    assert tree_support(config(sliding_window=4096)) is None  # never reached
    assert tree_support(config(sliding_window=64, layer_types=["full_attention"])) is None
    assert "'flash_attention_2' takes no custom tree mask" in tree_support(
        config(_attn_implementation="flash_attention_2"))
    assert "sliding-window attention (window 64)" in tree_support(config(sliding_window=64))
    # a window the context can pass: no trees, and verify_tree refuses rather than drop context
    model, processor = tiny_vlm("pixtral")
    small = copy.deepcopy(model)
    small.config.get_text_config().sliding_window = 32
    adapter = TargetAdapter.from_model(small, processor)
    assert not adapter.supports_trees and "window 32" in adapter.tree_note
    adapter.prefill(adapter.build_inputs(tiny_image(0), PROMPTS[0]))
    tree = TokenTree((3, 2, 1))
    with pytest.raises(RuntimeError, match="passes the sliding window"):
        adapter.verify_tree(_tokens(adapter, tree.nodes + 1, 0), tree.parents)


def test_a_chain_runs_losslessly_past_a_sliding_window(tiny_vlm) -> None:
    """A window the context passes: chains verify, roll back and decode as plain decoding
    does (a sliding-window cache layer cannot crop once it has dropped entries)."""
    from dreams_nas.supernet.decoding.drafters import PromptLookupDrafter
    from dreams_nas.supernet.decoding.loop import generate, plain_generate

    model, processor = tiny_vlm("pixtral")
    small = copy.deepcopy(model)
    small.config.get_text_config().sliding_window = 24
    adapter = TargetAdapter.from_model(small, processor)
    inputs = adapter.build_inputs(tiny_image(0), PROMPTS[0])
    assert inputs["input_ids"].shape[1] > 24  # the prompt alone passes the window
    plain = plain_generate(adapter, dict(inputs), max_new_tokens=40)
    with torch.inference_mode():  # Hugging Face's greedy decoding, with its sliding cache
        hf = small.generate(**inputs, max_new_tokens=40, do_sample=False)
    assert hf[0, inputs["input_ids"].shape[1]:].tolist() == plain.tokens.tolist()
    for shape in (1, 3, 5):
        out = generate(adapter, dict(inputs), PromptLookupDrafter(), shape=shape,
                       max_new_tokens=40)
        assert out.tokens.tolist() == plain.tokens.tolist()
