"""The draft vocabulary (FR-Spec / EAGLE-3): the draft predicts over the most frequent tokens of
the target's own answers, mapped back to target ids. Its logits are the full head's on those
rows and -inf elsewhere, the extracted subnet keeps only those rows, and decoding stays
lossless (greedy equals the target's own; sampling keeps the target's law) while teacher-forced
tau still equals real decoding's."""

from __future__ import annotations

import pytest
import torch
from _support.drafts import HIDDEN, VOCAB, tiny_draft
from _support.models import build_tiny_llava, tiny_prompts
from dreams_nas.supernet.acceptance.teacher_forced import TeacherForcedScorer
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.space import SearchSpace, default_draft_vocab, vocab_rows
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.core.tree import TokenTree
from dreams_nas.supernet.decoding.dream import DreamDrafter
from dreams_nas.supernet.decoding.loop import generate, plain_generate
from dreams_nas.supernet.decoding.sampling import SamplingConfig, logits_to_probs
from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.extract import CompactDraft, extract
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.saving import load_supernet, save_supernet
from dreams_nas.supernet.draft.state import SharedTargetModules
from dreams_nas.supernet.target.adapter import TargetAdapter
from dreams_nas.supernet.training.config import TrainConfig
from dreams_nas.supernet.training.selfdistill import collect_samples, regenerate_answers
from dreams_nas.supernet.training.tppt import TrainingSet, train_supernet
from dreams_nas.supernet.training.vocab import coverage, frequency_order, token_counts

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_NEW = 16
LAYERS = (2, 4)


# --- the order and the spec -------------------------------------------------------------
def test_the_order_ranks_the_answers_tokens_by_frequency_ties_by_id():
    answers = [torch.tensor([5, 3, 5, 7]), torch.tensor([3, 5, 9])]
    order = frequency_order(answers, 10)
    assert order.tolist()[:4] == [5, 3, 7, 9]  # 5 x3, 3 x2, then 7 and 9 once (lower id first)
    assert sorted(order.tolist()) == list(range(10))
    assert token_counts(answers, 10)[5] == 3
    assert coverage(answers, order, 2) == pytest.approx(5 / 7)
    with pytest.raises(InputError, match="outside the target's vocabulary of 6"):
        frequency_order(answers, 6)


def test_the_id_names_the_vocabulary_and_the_default_space_offers_a_quarter():
    spec = SubnetSpec(4, 0.5, 12, 5, depth=2, draft_vocab=0.25)
    assert spec.id == "h4-v0.50-l12-d2-n0.25-g5"
    assert SubnetSpec.from_id(spec.id) == spec == SubnetSpec.from_dict(spec.to_dict())
    assert SubnetSpec(4, 0.5, 12, 5).id == "h4-v0.50-l12-g5"  # the whole vocabulary: as before
    assert "draft_vocab" not in SubnetSpec(4, 0.5, 12, 5).to_dict()
    assert default_draft_vocab(32_000) == (0.25, 1.0) and default_draft_vocab(1_000) == (1.0,)
    assert vocab_rows(32_000, 0.25) == 8_000 and vocab_rows(60, 0.01) == 1
    space = SearchSpace.default_for(16, 4, trees=(), draft_vocab=(0.25, 1.0))
    assert space.size == 2 * SearchSpace.default_for(16, 4, trees=()).size
    assert SearchSpace.from_dict(space.to_dict()) == space
    assert space.largest().draft_vocab == 1.0 and space.smallest().draft_vocab == 0.25
    with pytest.raises(InputError, match="draft_vocab=0 must be in"):
        SubnetSpec(4, 0.5, 12, 5, draft_vocab=0)


# --- the draft's logits -----------------------------------------------------------------
def _vocab_draft() -> DreamDraft:
    model = tiny_draft(vocab_shares=(0.3, 1.0))
    model.set_vocab_order(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1)))
    return model


def test_logits_are_the_heads_on_the_vocabulary_and_minus_inf_elsewhere():
    model = _vocab_draft()
    feature = torch.randn(2, 3, HIDDEN)
    full = model.logits(feature)  # the largest subnet: the whole vocabulary
    spec = SubnetSpec(4, 1.0, 2, 1, draft_vocab=0.3)
    with model.using(spec):
        part = model.logits(feature)
        rows = model.vocab_rows_of(spec)
    ids = model.vocab_order[:rows]
    assert rows == 15
    torch.testing.assert_close(part[..., ids], full[..., ids])
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[ids] = False
    assert torch.isneginf(part[..., outside]).all()
    assert set(part.argmax(-1).flatten().tolist()) <= set(ids.tolist())


@pytest.mark.parametrize("spec", [SubnetSpec(4, 1.0, 2, 3, draft_vocab=0.3),
                                  SubnetSpec(2, 0.5, 1, 2, draft_vocab=1.0)], ids=lambda s: s.id)
def test_the_extracted_subnet_keeps_only_its_rows_and_equals_the_supernet(spec, tmp_path):
    model = _vocab_draft()
    feature = torch.randn(1, 4, HIDDEN)
    with model.using(spec):
        expected = model.logits(feature)
    compact = extract(model, spec)
    if spec.draft_vocab < 1:
        assert compact.vocab_order.tolist() == model.vocab_order[:15].tolist()
    else:
        assert "vocab_order" not in compact.state_dict()
    torch.testing.assert_close(compact.logits(feature), expected)
    compact.save_pretrained(tmp_path / "spec")
    loaded = CompactDraft.from_pretrained(tmp_path / "spec", model.shared)
    torch.testing.assert_close(loaded.logits(feature), expected)


def test_the_order_is_saved_with_the_supernet_and_checked(tmp_path):
    model = _vocab_draft()
    save_supernet(model, tmp_path)
    loaded = load_supernet(tmp_path, model.shared)
    assert torch.equal(loaded.vocab_order, model.vocab_order)
    with pytest.raises(InputError, match="each of the 50 token ids once"):
        model.set_vocab_order(torch.zeros(VOCAB, dtype=torch.long))
    with pytest.raises(InputError, match="draft_vocab=0.5 is not a vocabulary share"):
        model.set_active(SubnetSpec(4, 1.0, 2, 1, draft_vocab=0.5))
    with pytest.raises(InputError, match="offers no draft vocabulary"):
        tiny_draft().set_vocab_order(torch.arange(VOCAB))


# --- decoding with it -------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained():
    """A tiny LLaVA target (vocabulary 60) and a draft trained briefly on its answers, ranked
    by their token frequency, offering 30 % and the whole of the vocabulary."""
    model = build_tiny_llava(0, layers=4)
    adapter = TargetAdapter(model)
    prompts = tiny_prompts(8)
    answers = regenerate_answers(model, prompts, max_new_tokens=MAX_NEW, show_progress=False)
    samples = collect_samples(adapter, prompts, answers, LAYERS, (2,), show_progress=False)
    cfg = DraftConfig.for_target(model.config.text_config, inject_layers=LAYERS,
                                 vocab_shares=(0.3, 1.0))
    shared = SharedTargetModules(adapter.embed_tokens, adapter.lm_head)
    draft = DreamDraft.initialised(cfg, shared, 0)
    train_supernet(draft, TrainingSet(samples, (2,)),
                   TrainConfig(warmup_steps=40, multires_steps=20, unroll=2, batch_size=4,
                               lr=5e-3, checkpoint_every=1000),
                   show_progress=False)
    draft.set_vocab_order(frequency_order(answers, cfg.vocab_size))
    return adapter, draft, prompts


VOCAB_SPECS = [SubnetSpec(4, 1.0, 4, 4, draft_vocab=0.3),
               SubnetSpec(2, 0.5, 2, 3, tree=(2, 2, 1), draft_vocab=0.3)]


@pytest.mark.parametrize("spec", VOCAB_SPECS, ids=lambda s: s.id)
def test_greedy_output_with_a_draft_vocabulary_is_the_targets(trained, spec):
    adapter, draft, prompts = trained
    compact = extract(draft, spec)
    taus = []
    for prompt in prompts:
        ref = plain_generate(adapter, prompt, max_new_tokens=MAX_NEW)
        supernet = generate(adapter, prompt, DreamDrafter(draft, spec), max_new_tokens=MAX_NEW,
                            shape=spec.shape)
        out = generate(adapter, prompt, DreamDrafter(compact, spec), max_new_tokens=MAX_NEW,
                       shape=spec.shape)
        assert out.tokens.tolist() == ref.tokens.tolist() == supernet.tokens.tolist()
        assert out.stats.cycle_lengths == supernet.stats.cycle_lengths
        taus.append(out.stats.tau)
    assert sum(taus) / len(taus) > 1.2  # the draft's vocabulary still proposes accepted tokens


@pytest.mark.slow  # 16 real speculative generations
def test_teacher_forced_tau_of_a_draft_vocabulary_equals_real_decoding(trained):
    adapter, draft, prompts = trained
    specs = [SubnetSpec(4, 1.0, 4, 4, draft_vocab=0.3), SubnetSpec(4, 1.0, 4, 4)]
    scorer = TeacherForcedScorer(adapter, draft, prompts, supernet_hash="abc", dataset_id="tiny",
                                 max_new_tokens=MAX_NEW, show_progress=False)
    rows = {r.spec: r for r in scorer.score(specs)}
    for spec in specs:
        lengths = []
        for prompt in prompts:
            out = generate(adapter, prompt, DreamDrafter(draft, spec), shape=spec.draft_len,
                           max_new_tokens=MAX_NEW)
            lengths += out.stats.cycle_lengths
        assert rows[spec].tau == pytest.approx(sum(lengths) / len(lengths), rel=0.02)
    # the vocabulary acts (here it even helps: it drops tokens the briefly trained draft
    # over-rates that the target's answers never use)
    assert rows[specs[0]].tau != rows[specs[1]].tau


def test_sampling_with_a_draft_vocabulary_keeps_the_targets_distribution(trained):
    """At temperature 1 without top-k the target gives every token mass while the draft gives
    none outside its vocabulary: the second token still follows the target's exact law (given
    a first token that is not the EOS)."""
    from scipy.stats import chisquare

    adapter, draft, prompts = trained
    prompt = prompts[0]
    sampling = SamplingConfig(temperature=1.0)
    pre = adapter.prefill(prompt)
    p1 = logits_to_probs(pre.logits[0], sampling)
    expected = torch.zeros_like(p1)
    eos = set(adapter.eos_token_ids)
    for t1 in torch.nonzero(p1 > 1e-4).flatten():
        if int(t1) in eos:  # the answer ends: no second token (those runs are skipped below)
            continue
        adapter.prefill(prompt)
        step = adapter.verify(t1.view(1, 1))
        expected += p1[t1] * logits_to_probs(step.logits[0, -1], sampling)
    expected /= expected.sum()
    gen = torch.Generator().manual_seed(0)
    runs, counts = 300, torch.zeros_like(expected)
    for tree in (None, TokenTree((2,))):
        drafter = DreamDrafter(draft, SubnetSpec(4, 1.0, 4, 1, draft_vocab=0.3))
        for _ in range(runs // 2):
            out = generate(adapter, prompt, drafter, shape=tree or 1, max_new_tokens=3,
                           sampling=sampling, generator=gen)
            if len(out.tokens) > 1:
                counts[out.tokens[1]] += 1
    common = expected * runs >= 5  # chi-square needs expected counts of 5 or more
    observed = torch.cat((counts[common], counts[~common].sum()[None]))
    law = torch.cat((expected[common], expected[~common].sum()[None])) * runs
    _, p = chisquare(observed.numpy(), law.numpy() * observed.sum().item() / law.sum().item())
    assert p > 1e-3, (observed, law)
