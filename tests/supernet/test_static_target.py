"""The target's steps over a static cache, eager and compiled: the same tokens as HF greedy
`generate` on every family, chains and trees; one compilation per shape the loop meets.
Compiling here is dynamo's capture (its `eager` backend); inductor's code for every shape of
every family is `benchmarks/bench_compiled_families.py`'s check (BENCHMARKS.md, 'Compiled
steps'), minutes on 2 cores."""

from __future__ import annotations

import pytest
import torch
from _support.models import FAMILIES, PROMPTS, tiny_image
from dreams_nas.supernet.core.tree import TokenTree
from dreams_nas.supernet.decoding.drafters import OracleDrafter, PromptLookupDrafter
from dreams_nas.supernet.decoding.loop import generate, plain_generate
from dreams_nas.supernet.decoding.sampling import SamplingConfig
from dreams_nas.supernet.target.adapter import TargetAdapter
from dreams_nas.supernet.target.static import (
    CAPACITY_STEP,
    StaticSteps,
    capacity_for,
    tree_mask,
)
from dreams_nas.supernet.target.tree_attention import build_layout

MAX_NEW = 10
pytestmark = pytest.mark.usefixtures("one_thread")


def _cases(model, adapter, n: int) -> list:
    cases = []
    for i, prompt in enumerate(PROMPTS[:n]):
        inputs = adapter.build_inputs(tiny_image(i, ((16, 16), (32, 16))[i % 2]), prompt)
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
        cases.append((inputs, out[0, inputs["input_ids"].shape[1]:].tolist()))
    return cases


def _outputs(adapter, inputs) -> dict[str, list[int]]:
    """Plain decoding, chains of 1 and 3 and (where the family verifies trees) a tree."""
    runs = {"plain": plain_generate(adapter, inputs, max_new_tokens=MAX_NEW)}
    for g in (1, 3):
        runs[f"oracle{g}"] = generate(adapter, inputs, OracleDrafter(horizon=MAX_NEW), shape=g,
                                      max_new_tokens=MAX_NEW)
    runs["lookup3"] = generate(adapter, inputs, PromptLookupDrafter(), shape=3,
                               max_new_tokens=MAX_NEW)
    if adapter.supports_trees:
        runs["tree"] = generate(adapter, inputs, OracleDrafter(horizon=MAX_NEW),
                                shape=TokenTree((2, 2)), max_new_tokens=MAX_NEW)
    return {name: r.tokens.tolist() for name, r in runs.items()}


@pytest.fixture
def fresh_target(tiny_vlm):
    """fresh_target(family, mode): an adapter of its own over the session's tiny model (the
    shared adapters stay dynamic), returned to dynamic steps afterwards (hooks removed)."""
    made: list[TargetAdapter] = []

    def get(family: str, mode: str, backend: str | None = None) -> TargetAdapter:
        adapter = TargetAdapter.from_model(*tiny_vlm(family))
        adapter.use_steps(mode, backend=backend)
        made.append(adapter)
        return adapter

    yield get
    for adapter in made:
        adapter.use_steps("dynamic")


@pytest.mark.parametrize("family", FAMILIES)
def test_static_cache_decodes_as_hf_greedy(family, tiny_vlm, fresh_target) -> None:
    model, _ = tiny_vlm(family)
    adapter = fresh_target(family, "static")
    for inputs, ref in _cases(model, adapter, 2):
        got = _outputs(adapter, inputs)
        assert all(tokens == ref for tokens in got.values()), (family, got, ref)
    assert adapter.static is not None and adapter.static.capacity == CAPACITY_STEP
    assert adapter.family != "llava" or adapter.supports_trees


def test_compiled_steps_compile_once_per_shape(tiny_vlm, fresh_target) -> None:
    """Dynamo's graphs (its `eager` backend: the capture without inductor's code generation)
    are made for the first request's shapes only; a second request compiles nothing."""
    from torch._dynamo.utils import counters

    model, _ = tiny_vlm("llava")
    adapter = fresh_target("llava", "compiled", backend="eager")
    cases = _cases(model, adapter, 3)
    before = counters["stats"]["unique_graphs"]
    first = _outputs(adapter, cases[0][0])
    assert all(tokens == cases[0][1] for tokens in first.values()), first
    graphs = counters["stats"]["unique_graphs"] - before
    shapes = set(adapter.static._steps)
    assert graphs == len(shapes) >= 4, (graphs, shapes)  # decode, chains of 2 and 4, tree
    for inputs, ref in cases[1:]:
        again = _outputs(adapter, inputs)
        assert all(tokens == ref for tokens in again.values()), again
    assert counters["stats"]["unique_graphs"] - before == graphs  # nothing recompiled
    # a verify that reads a layer's hidden state (as a DREAM drafter's does) is one more
    # graph; the graphs before it stay valid (no hook is added once steps have compiled)
    inputs = cases[0][0]
    adapter.prefill(inputs, layers=(1,), reserve=MAX_NEW)
    adapter.verify(torch.tensor([[5, 6]]), layers=(1,))
    assert counters["stats"]["unique_graphs"] - before == graphs + 1
    assert _outputs(adapter, inputs) == first
    assert counters["stats"]["unique_graphs"] - before == graphs + 1


def test_warm_steps_skip_the_guards_only_on_a_cache_they_met(tiny_vlm, fresh_target,
                                                            monkeypatch) -> None:
    """A compiled step's later calls on the same cache skip dynamo's guards (`warm_call`); a
    request that needs a larger cache checks every step's guards again (a new cache is a new
    mask width: a graph of the old one would be wrong), and both caches decode as HF."""
    from dreams_nas.supernet.target import static

    model, _ = tiny_vlm("llava")
    adapter = fresh_target("llava", "compiled", backend="eager")
    (inputs, ref), = _cases(model, adapter, 1)
    warm = []
    real = static.warm_call
    monkeypatch.setattr(static, "warm_call", lambda fn, *args: warm.append(1) or real(fn, *args))
    assert all(tokens == ref for tokens in _outputs(adapter, inputs).values())
    assert warm, "no step ran warm"
    met = len(adapter.static._warm)
    longer = plain_generate(adapter, inputs, max_new_tokens=CAPACITY_STEP)  # a 2-step cache
    assert adapter.static.capacity == 2 * CAPACITY_STEP and adapter.static._warm
    assert longer.tokens.tolist()[:MAX_NEW] == ref
    got = _outputs(adapter, inputs)  # on the larger cache, each step met once then warm
    assert all(tokens == ref for tokens in got.values()), got
    assert len(adapter.static._warm) == met


def test_a_warm_calls_signature_holds_what_the_guards_check() -> None:
    """Tensors alike in shape but not in strides, dtype, inference-ness or gradient are other
    calls (a profile's token made outside inference mode failed a warm call's guard), and so
    is another object or grad mode; equal tensors are the same call."""
    from dreams_nas.supernet.target.static import signature

    base = torch.zeros(4, 6)
    with torch.inference_mode():
        frozen = torch.zeros(4, 6)
        same = signature(torch.ones(4, 6), None)
        assert signature(frozen, None) == same
        assert signature(base, None) != same  # not an inference tensor
        assert signature(torch.zeros(6, 8)[:4, :6], None) != same  # a view's strides
        assert signature(frozen.double(), None) != same
        one, other = object(), object()
        assert signature(frozen, one) != signature(frozen, other)
    assert signature(frozen, None) != same  # outside inference mode
    assert signature(base.requires_grad_(), None) != signature(torch.zeros(4, 6), None)


def test_compiled_sampling_follows_the_same_draws(tiny_target, tiny_vlm, fresh_target) -> None:
    """At temperature > 0 with one seed, the compiled steps keep what the dynamic ones keep:
    the same logits, the same acceptance draws."""
    dynamic = tiny_target("qwen2_vl")
    compiled = fresh_target("qwen2_vl", "compiled", backend="eager")
    sampling = SamplingConfig(temperature=0.8, top_k=20)
    inputs = dynamic.build_inputs(tiny_image(1, (16, 16)), PROMPTS[1])
    out = []
    for adapter in (dynamic, compiled):
        gen = torch.Generator().manual_seed(7)
        out.append(generate(adapter, inputs, PromptLookupDrafter(), shape=3,
                            max_new_tokens=MAX_NEW, sampling=sampling,
                            generator=gen).tokens.tolist())
    assert out[0] == out[1]


def test_a_request_past_the_capacity_is_refused(tiny_vlm) -> None:
    model, _ = tiny_vlm("llava")
    steps = StaticSteps(model, model.model.language_model, model.lm_head, compiled=False,
                        mrope=False)
    steps.fresh(10)
    steps.started(CAPACITY_STEP - 1, None)
    with pytest.raises(RuntimeError, match="passes the static cache"):
        steps.chain(torch.tensor([[5, 6]]), ())
    assert capacity_for(1) == capacity_for(CAPACITY_STEP) == CAPACITY_STEP
    assert capacity_for(CAPACITY_STEP + 1) == 2 * CAPACITY_STEP


def test_tree_mask_is_the_layouts_mask_padded_to_the_capacity() -> None:
    parents = (-1, 0, 0, 1, 2)
    layout = build_layout(parents, torch.device("cpu"), torch.float32)
    for start in (0, 3, 7):
        mask = tree_mask(layout.bias, torch.tensor(start), 16)
        expected = torch.full((1, 1, 5, 16), torch.finfo(torch.float32).min)
        expected[..., :start + 5] = layout.mask(start)
        assert torch.equal(mask, expected)


def test_steps_compile_with_inductors_cpp_wrapper_on_the_cpu(monkeypatch) -> None:
    """Inductor on the CPU calls a step's kernels from its C++ wrapper (no mode there); CUDA
    takes CUDA graphs (a mode, which excludes options); a named backend gets neither."""
    from dreams_nas.supernet.target import static

    seen: list[dict] = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    static.compile_step(abs, None, torch.device("cpu"))
    static.compile_step(abs, None, torch.device("cuda"))
    static.compile_step(abs, "eager", torch.device("cpu"))
    picked = [(kw["backend"], kw["mode"], kw["options"]) for kw in seen]
    assert picked == [("inductor", None, {"cpp_wrapper": True}),
                      ("inductor", "reduce-overhead", None), ("eager", None, None)]
