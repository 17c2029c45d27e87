"""The DREAM-S drafter in the engine's loop: lossless at temperature 0, exact when sampling."""

from __future__ import annotations

import pytest
import torch
from _support.drafts import second_token_law, train_tiny_draft
from _support.models import build_tiny_llava, tiny_prompts
from dreams_nas.supernet.core.io import atomic_write_json
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.core.tree import TokenTree
from dreams_nas.supernet.decoding.dream import DreamDrafter
from dreams_nas.supernet.decoding.loop import generate, plain_generate
from dreams_nas.supernet.decoding.protocol import Drafter
from dreams_nas.supernet.decoding.registry import load_drafter
from dreams_nas.supernet.decoding.sampling import SamplingConfig
from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.extract import extract
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.state import SharedTargetModules
from dreams_nas.supernet.target.adapter import TargetAdapter
from dreams_nas.supernet.training.config import TrainConfig
from dreams_nas.supernet.training.selfdistill import collect_samples, regenerate_answers
from dreams_nas.supernet.training.tppt import TrainingSet, train_supernet

LAYERS = (1, 2, 4)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained():
    model = build_tiny_llava(seed=1)
    adapter = TargetAdapter.from_model(model)
    prompts = tiny_prompts(16, seed=5)
    return adapter, train_tiny_draft(adapter, prompts, LAYERS), prompts


SPECS = [SubnetSpec(4, 1.0, 2, 5), SubnetSpec(1, 0.25, 1, 3), SubnetSpec(2, 0.5, 4, 1)]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
def test_greedy_output_is_the_targets_token_for_token(trained, spec):
    adapter, draft, prompts = trained
    drafter = DreamDrafter(draft, spec)
    assert isinstance(drafter, Drafter)
    taus = []
    for prompt in prompts[:8]:
        ref = plain_generate(adapter, prompt, max_new_tokens=12)
        for draft_len in (1, 3, 5):
            out = generate(adapter, prompt, drafter, shape=draft_len, max_new_tokens=12)
            assert out.tokens.tolist() == ref.tokens.tolist()
            taus.append(out.stats.tau)
    assert sum(taus) / len(taus) > 1.15  # the trained draft is accepted, not merely harmless


@pytest.mark.parametrize("tree", [(3, 2, 1), (2, 2, 2, 1)], ids=lambda t: "x".join(map(str, t)))
def test_tree_greedy_output_is_the_targets_token_for_token(trained, tree):
    adapter, draft, prompts = trained
    chain_taus, tree_taus = [], []
    for spec in SPECS:
        tree_spec = spec.replace(tree=tree)
        drafter = DreamDrafter(draft, tree_spec)
        assert drafter.default_tree == TokenTree(tree)
        for prompt in prompts[:8]:
            ref = plain_generate(adapter, prompt, max_new_tokens=12)
            out = generate(adapter, prompt, drafter, shape=tree_spec.shape, max_new_tokens=12)
            assert out.tokens.tolist() == ref.tokens.tolist()
            chain = generate(adapter, prompt, DreamDrafter(draft, spec), shape=len(tree),
                             max_new_tokens=12)
            tree_taus.append(out.stats.tau)
            chain_taus.append(chain.stats.tau)
    assert sum(tree_taus) > sum(chain_taus)  # the tree's extra children are accepted too


@pytest.fixture(scope="module")
def trained_elastic(trained):
    """A supernet of elastic depth (1-2 layers a side) and MLP width (half, whole)."""
    adapter, _, prompts = trained
    answers = regenerate_answers(adapter.model, prompts, max_new_tokens=12, show_progress=False)
    samples = collect_samples(adapter, prompts, answers, LAYERS, (2,), show_progress=False)
    shared = SharedTargetModules(adapter.embed_tokens, adapter.lm_head)
    cfg = DraftConfig.for_target(adapter.text_config, LAYERS, num_layers=2, mlp_shares=(0.5, 1))
    draft = DreamDraft.initialised(cfg, shared, 0)
    config = TrainConfig(warmup_steps=60, multires_steps=20, batch_size=8, lr=3e-3, unroll=2,
                         lr_warmup_steps=5, feature_noise=0.0, checkpoint_every=1000)
    train_supernet(draft, TrainingSet(samples, (2,)), config, show_progress=False)
    return adapter, draft, prompts


ELASTIC = [SubnetSpec(4, 1.0, 2, 4, depth=2), SubnetSpec(1, 0.25, 1, 3, mlp=0.5),
           SubnetSpec(2, 0.5, 4, 2, depth=2, mlp=0.5)]


@pytest.mark.parametrize("spec", ELASTIC, ids=lambda s: s.id)
def test_an_extracted_subnet_of_any_depth_and_width_is_lossless(trained_elastic, spec):
    adapter, draft, prompts = trained_elastic
    compact = extract(draft, spec)
    assert compact.config.num_layers == spec.depth
    taus = []
    for prompt in prompts[:6]:
        ref = plain_generate(adapter, prompt, max_new_tokens=12)
        supernet = generate(adapter, prompt, DreamDrafter(draft, spec), shape=spec.draft_len,
                            max_new_tokens=12)
        out = generate(adapter, prompt, DreamDrafter(compact, spec), shape=spec.draft_len,
                       max_new_tokens=12)
        tree = generate(adapter, prompt, DreamDrafter(compact, spec), shape=TokenTree((2, 2)),
                        max_new_tokens=12)
        assert out.tokens.tolist() == ref.tokens.tolist() == tree.tokens.tolist()
        assert out.stats.cycle_lengths == supernet.stats.cycle_lengths
        taus.append(out.stats.tau)
    assert sum(taus) / len(taus) > 1.03  # some drafts accepted, not merely harmless


def test_spec_folder_drafter_matches_the_supernet(trained, tmp_path):
    adapter, draft, prompts = trained
    spec = SPECS[0]
    folder = tmp_path / "specs" / spec.id
    extract(draft, spec).save_pretrained(folder)
    atomic_write_json(folder / "spec.json", {"schema_version": 1, "spec": spec.to_dict()})
    from_folder = load_drafter(folder, adapter)
    assert isinstance(from_folder, DreamDrafter) and from_folder.default_draft_len == 5
    supernet_drafter = DreamDrafter(draft, spec)
    for prompt in prompts[:4]:
        a = generate(adapter, prompt, from_folder, shape=5, max_new_tokens=12)
        b = generate(adapter, prompt, supernet_drafter, shape=5, max_new_tokens=12)
        assert a.tokens.tolist() == b.tokens.tolist()
        assert a.stats.cycle_lengths == b.stats.cycle_lengths


@pytest.mark.parametrize(("tree", "steps"), [(None, "dynamic"), (TokenTree((3,)), "dynamic"),
                                             (TokenTree((2, 2)), "dynamic"), (None, "compiled")],
                         ids=["chain", "tree-3", "tree-2x2", "chain-compiled"])
def test_sampling_keeps_the_targets_distribution(trained, tree, steps):
    """Second token (the first one a draft proposes) over many seeded runs vs its exact law;
    with a tree, siblings sampled without replacement and tried by recursive rejection;
    compiled: the target's and the draft's steps compiled (dynamo's `eager` backend)."""
    from scipy.stats import chisquare

    adapter, draft, prompts = trained
    prompt = prompts[0]
    sampling = SamplingConfig(temperature=1.0, top_k=4)
    expected = second_token_law(adapter, prompt, sampling)
    drafter = DreamDrafter(draft, SPECS[0])
    gen = torch.Generator().manual_seed(0)
    if steps != "dynamic":
        adapter = TargetAdapter.from_model(adapter.model)
        adapter.use_steps(steps, backend="eager")
    runs = 200
    counts = torch.zeros_like(expected)
    accepted = 0
    for _ in range(runs):
        out = generate(adapter, prompt, drafter, shape=tree or 1, max_new_tokens=3,
                       sampling=sampling, generator=gen)
        counts[out.tokens[1]] += 1
        accepted += out.stats.cycle_lengths[0] > 1
    support = expected > 0
    assert counts[~support].sum() == 0
    _, p = chisquare(counts[support].numpy(), expected[support].numpy() * runs)
    assert p > 1e-3, (counts[support], expected[support] * runs)
    assert accepted > runs * 0.1  # the draft's proposals, not only resamples, produce tokens
    if steps != "dynamic":
        adapter.use_steps("dynamic")


def test_static_and_compiled_draft_steps_draft_what_eager_ones_draft(trained):
    """Over a static cache, eager and compiled (dynamo's capture, its `eager` backend), the
    draft proposes what it proposes over a growing cache: the same tokens, the same tau, for a
    tree (a chain's steps compiled: the sampling test's `chain-compiled`); a second pass over
    the prompts compiles nothing. One subnet drafts two trees whose levels have the same
    shapes but other strides (a view of each tree's mask): the second's steps are not run warm
    on the first's graphs (`warm_call`)."""
    from torch._dynamo.utils import counters

    adapter, draft, prompts = trained
    spec = SPECS[1].replace(tree=(2, 2, 1))
    shapes = [spec.shape, TokenTree((2, 2))]
    runs: dict[str, list] = {}
    graphs = []
    for mode in ("dynamic", "static", "compiled", "compiled"):
        target = TargetAdapter.from_model(adapter.model)
        target.use_steps(mode, backend="eager")
        before = counters["stats"]["unique_graphs"]
        out = [generate(target, prompt, DreamDrafter(draft, spec), shape=shape,
                        max_new_tokens=12) for shape in shapes for prompt in prompts[:3]]
        runs.setdefault(mode, []).append([(o.tokens.tolist(), o.stats.tau) for o in out])
        graphs.append(counters["stats"]["unique_graphs"] - before)
        target.use_steps("dynamic")
    assert runs["static"][0] == runs["dynamic"][0]
    assert runs["compiled"][0] == runs["compiled"][1] == runs["dynamic"][0]
    assert graphs[0] == graphs[1] == 0 and graphs[2] > 0
    assert graphs[3] == 0  # the same shapes again: no compilation


def test_a_drafts_steps_are_its_own_and_a_copy_has_none(trained):
    import copy

    from dreams_nas.supernet.decoding.draft_steps import DraftSteps

    _, draft, _ = trained
    steps = DraftSteps.of(draft)
    assert DraftSteps.of(draft) is steps and DreamDrafter(draft, SPECS[1]).steps is steps
    twin = copy.deepcopy(draft)
    assert DraftSteps.of(twin) is not steps and DraftSteps.of(twin).draft is twin
    assert "_steps" not in dict(draft.named_children())  # not a submodule: nothing saved
