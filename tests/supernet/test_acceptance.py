from __future__ import annotations

import math

import numpy as np
import pytest
from _support.models import build_tiny_llava, tiny_prompts
from dreams_nas.supernet.acceptance.teacher_forced import (
    TeacherForcedScorer,
    accept_rates,
    pooled_tau,
    simulate_cycles,
)
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.decoding.dream import DreamDrafter
from dreams_nas.supernet.decoding.loop import generate
from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.state import SharedTargetModules
from dreams_nas.supernet.target.adapter import TargetAdapter
from dreams_nas.supernet.training.config import TrainConfig
from dreams_nas.supernet.training.selfdistill import collect_samples, regenerate_answers
from dreams_nas.supernet.training.tppt import TrainingSet, train_supernet

MAX_NEW = 24
LAYERS = (2, 4)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained():
    """A tiny LLaVA target and a DREAM draft trained briefly on its own answers, so that
    acceptance is far from trivial (tau between 2 and 3 rather than 1)."""
    model = build_tiny_llava(0, layers=4)
    adapter = TargetAdapter(model)
    prompts = tiny_prompts(8)
    answers = regenerate_answers(model, prompts, max_new_tokens=MAX_NEW, show_progress=False)
    samples = collect_samples(adapter, prompts, answers, LAYERS, (2,), show_progress=False)
    cfg = DraftConfig.for_target(model.config.text_config, inject_layers=LAYERS)
    shared = SharedTargetModules(adapter.embed_tokens, adapter.lm_head)
    draft = DreamDraft.initialised(cfg, shared, 0)
    train_supernet(draft, TrainingSet(samples, (2,)),
                   TrainConfig(warmup_steps=40, multires_steps=40, unroll=2, batch_size=4,
                               lr=5e-3, checkpoint_every=1000),
                   show_progress=False)
    return adapter, draft, prompts


def _scorer(trained, **kwargs):
    adapter, draft, prompts = trained
    return TeacherForcedScorer(adapter, draft, prompts, supernet_hash="abc", dataset_id="tiny",
                               max_new_tokens=MAX_NEW, show_progress=False, **kwargs)


SPECS = [SubnetSpec(4, 1.0, 4, 5), SubnetSpec(2, 0.5, 2, 3), SubnetSpec(1, 0.25, 2, 7)]


@pytest.mark.slow  # trains a tiny draft and runs 24 real speculative generations
def test_teacher_forced_tau_agrees_with_real_speculative_runs(trained) -> None:
    adapter, draft, prompts = trained
    rows = {r.spec: r for r in _scorer(trained).score(SPECS)}
    for spec in SPECS:
        lengths = []
        for prompt in prompts:
            out = generate(adapter, prompt, DreamDrafter(draft, spec),
                           shape=spec.draft_len, max_new_tokens=MAX_NEW)
            lengths += out.stats.cycle_lengths
        measured = sum(lengths) / len(lengths)
        assert measured > 1.5  # the check is not the trivial tau = 1
        assert rows[spec].tau == pytest.approx(measured, rel=0.02)
        assert rows[spec].tau_lo <= rows[spec].tau <= rows[spec].tau_hi


TREE_SPECS = [SubnetSpec(4, 1.0, 4, 3, tree=(3, 2, 1)), SubnetSpec(2, 0.5, 2, 4, tree=(2, 2, 1, 1)),
              SubnetSpec(1, 0.25, 2, 5, tree=(4, 1, 1, 1, 1))]


@pytest.mark.slow  # 24 real tree generations
def test_teacher_forced_tree_tau_equals_real_tree_decoding(trained) -> None:
    """At temperature 0 a tree accepts the target's greedy path as deep as each level's
    target token is within the draft's top-k there: the rank pass gives tau exactly."""
    adapter, draft, prompts = trained
    rows = {r.spec: r for r in _scorer(trained, draft_lens=(1,)).score(TREE_SPECS)}
    for spec in TREE_SPECS:
        lengths = []
        for prompt in prompts:
            out = generate(adapter, prompt, DreamDrafter(draft, spec), shape=spec.shape,
                           max_new_tokens=MAX_NEW)
            lengths += out.stats.cycle_lengths
        measured = sum(lengths) / len(lengths)
        assert measured > 1.5
        assert rows[spec].tau == pytest.approx(measured, rel=0.02), spec.id
        assert rows[spec].n_tokens == sum(lengths)


def test_a_tree_accepts_at_least_its_chain(trained) -> None:
    """A tree whose first child at every level is the chain's token accepts everything the
    chain does, and more where the target's token is a lower-ranked child."""
    scorer = _scorer(trained, draft_lens=(3,), trees=((3, 2, 1), (1, 1, 1)))
    rows = {r.spec.id: r for r in scorer.score([SubnetSpec(2, 0.5, 2, 3)])}
    assert set(rows) == {"h2-v0.50-l2-g3", "h2-v0.50-l2-t3x2x1"}
    assert rows["h2-v0.50-l2-t3x2x1"].tau > rows["h2-v0.50-l2-g3"].tau
    assert len(rows["h2-v0.50-l2-t3x2x1"].accept_rates) == 3


def test_one_rollout_scores_every_draft_len_of_a_triple(trained) -> None:
    scorer = _scorer(trained, draft_lens=(1, 2, 3, 5))
    rows = scorer.score([SubnetSpec(2, 0.5, 2, 3)])
    assert [r.spec.draft_len for r in rows] == [1, 2, 3, 5]
    assert all(r.method == "teacher-forced" and r.n_prompts == 8 for r in rows)
    assert all(len(r.accept_rates) == r.spec.draft_len for r in rows)
    assert all(1.0 <= r.tau <= r.spec.draft_len + 1 for r in rows)
    assert rows[0].context_len == 20  # tiny prompts: bos, word, 16 image tokens, 2 words
    traces = scorer._traces
    scorer.score([SubnetSpec(4, 1.0, 4, 1)])
    assert scorer._traces is traces  # the target ran once per prompt


def test_empty_prompt_list_is_refused(trained) -> None:
    adapter, draft, _ = trained
    with pytest.raises(InputError, match="no evaluation prompts"):
        TeacherForcedScorer(adapter, draft, [], supernet_hash="a", dataset_id="d")


# --- the pure parts ----------------------------------------------------------------------
CYCLES = [
    # (matches per start, draft_len, max_new, eos_index, lengths, proposed)
    ([0] * 9, 3, 10, None, [1] * 9, [3] * 6 + [2, 1, 0]),
    ([3] * 9, 3, 10, None, [4, 4, 1], [3, 3, 0]),
    ([5] * 9, 2, 10, None, [3, 3, 3], [2, 2, 2]),
    # EOS at index 4, the first token of the second cycle, which matched on past it: the
    # loop keeps the tokens up to the EOS (one), not the whole cycle
    ([2, 0, 0, 5, 5], 3, 10, 4, [3, 1], [3, 3]),
    # EOS at index 5, the second token of a fully matching cycle: two tokens kept
    ([2, 0, 0, 5, 5, 5], 3, 10, 5, [3, 2], [3, 3]),
    # EOS as the very first token: no cycle at all
    ([], 3, 10, 0, [], []),
    # the budget leaves no room: a last cycle with zero proposals
    ([1] * 4, 4, 3, None, [2], [1]),
]


@pytest.mark.parametrize(("matches", "draft_len", "max_new", "eos", "lengths", "proposed"), CYCLES)
def test_simulate_cycles(matches, draft_len, max_new, eos, lengths, proposed) -> None:
    got = simulate_cycles(np.array(matches), draft_len, max_new, eos)
    assert got == (lengths, proposed)
    produced = 1 + sum(lengths)
    assert produced <= max_new or eos is not None


def test_accept_rates_follow_the_engines_definition() -> None:
    rates = accept_rates([4, 2, 1, 3], [3, 3, 3, 2], 3)
    assert rates[0] == pytest.approx(3 / 4)  # cycles with >= 1 accepted
    assert rates[1] == pytest.approx(2 / 4)
    assert rates[2] == pytest.approx(1 / 3)  # only three cycles offered a third token
    assert math.isnan(accept_rates([1], [0], 1)[0])


def test_pooled_tau_and_bootstrap_interval() -> None:
    cycles = [([4, 4, 1], [3, 3, 3]), ([1, 1], [3, 3]), ([2, 3, 4, 1], [3, 3, 3, 3])]
    tau, lo, hi = pooled_tau(cycles, 2000, np.random.default_rng(0))
    assert tau == pytest.approx(21 / 9)
    assert lo < tau < hi and lo >= 1.0 and hi <= 4.0
    again = pooled_tau(cycles, 2000, np.random.default_rng(0))
    assert again == (tau, lo, hi)
    assert pooled_tau([([], [])], 10, np.random.default_rng(0)) == (1.0, 1.0, 1.0)


def test_sampled_scoring_is_seeded_real_runs(trained) -> None:
    from dreams_nas.supernet.acceptance.sampled import SampledScorer

    adapter, draft, prompts = trained

    def scorer(seed):
        return SampledScorer(adapter, draft, prompts[:3], supernet_hash="abc", dataset_id="tiny",
                             temperature=0.8, max_new_tokens=12, seed=seed)

    specs = [SubnetSpec(4, 1.0, 4, 3), SubnetSpec(1, 0.25, 2, 2)]
    rows = scorer(0).score(specs)
    assert [r.spec for r in rows] == specs
    assert all(r.method == "sampled" and r.temperature == 0.8 for r in rows)
    assert all(1.0 <= r.tau <= r.spec.draft_len + 1 for r in rows)
    assert [r.tau for r in scorer(0).score(specs)] == [r.tau for r in rows]
    with pytest.raises(InputError, match="needs a temperature > 0"):
        SampledScorer(adapter, draft, prompts, supernet_hash="a", dataset_id="d", temperature=0)


def test_held_out_tau_of_training_equals_the_scorers(trained) -> None:
    """The training loop's held-out tau (the training-time test's parallel passes over
    self-distilled samples) is the scorer's teacher-forced tau on the same greedy answers."""
    from dreams_nas.supernet.training.features import collect_sample
    from dreams_nas.supernet.training.heldout import heldout_tau

    adapter, draft, prompts = trained
    scorer = _scorer(trained)
    samples = []
    for prompt, trace in zip(prompts, scorer.traces(), strict=True):
        end = trace.max_new_tokens if trace.eos_index is None else trace.eos_index + 1
        samples.append(collect_sample(adapter, prompt, trace.continuation[:end], LAYERS, (2,)))
    rows = {r.spec: r for r in scorer.score(SPECS)}
    for spec in SPECS:
        tau = heldout_tau(draft, samples, spec, spec.draft_len, MAX_NEW,
                          adapter.eos_token_ids, batch_size=3)
        assert tau > 1.5
        assert tau == pytest.approx(rows[spec].tau, rel=1e-6), spec.id


def test_parallel_ranks_equal_the_rollout_per_start(trained) -> None:
    """The scorer's batched ranks (the training-time test's passes over whole traces) equal
    the reference rollout that runs the draft's cached forward once per start and depth."""
    from dreams_nas.supernet.acceptance.teacher_forced import batched_ranks, draft_ranks

    _, draft, _ = trained
    traces = _scorer(trained).traces()
    for spec, widths in ((SubnetSpec(4, 1.0, 4, 5), (1, 1, 1, 1, 1)),
                         (SubnetSpec(2, 0.5, 2, 4), (3, 2, 2, 1)),
                         (SubnetSpec(1, 0.25, 2, 7), (4, 1, 1, 1, 1, 1, 1))):
        fast = batched_ranks(draft, traces, spec, widths, batch_size=3)
        for trace, ranks in zip(traces, fast, strict=True):
            np.testing.assert_array_equal(ranks, draft_ranks(draft, trace, spec, widths))


def _memory_only(draft: DreamDraft) -> DreamDraft:
    """The same weights as a draft that keeps visual tokens out of its own sequence."""
    from dataclasses import replace

    other = DreamDraft(replace(draft.config, visual_in_self=False), draft.shared)
    other.load_state_dict(draft.state_dict())
    return other.eval()


def test_a_memory_only_draft_scores_as_it_decodes(trained) -> None:
    """The parallel ranks equal the rollout, and held-out tau equals the scorer's, for a draft
    whose own sequence is text only (`visual_in_self=False`); its positions differ from the
    default draft's, so its ranks do too."""
    from dreams_nas.supernet.acceptance.teacher_forced import batched_ranks, draft_ranks

    adapter, draft, prompts = trained
    other = _memory_only(draft)
    traces = _scorer(trained).traces()
    spec, widths = SubnetSpec(2, 0.5, 2, 4), (3, 2, 2, 1)
    fast = batched_ranks(other, traces, spec, widths, batch_size=3)
    for trace, ranks in zip(traces, fast, strict=True):
        np.testing.assert_array_equal(ranks, draft_ranks(other, trace, spec, widths))
    default = batched_ranks(draft, traces, spec, widths, batch_size=3)
    assert any(not np.array_equal(a, b) for a, b in zip(fast, default, strict=True))
    spec = SubnetSpec(4, 1.0, 4, 3)
    lengths = []
    for prompt in prompts[:4]:
        out = generate(adapter, prompt, DreamDrafter(other, spec), shape=3,
                       max_new_tokens=MAX_NEW)
        lengths += out.stats.cycle_lengths
    scorer = TeacherForcedScorer(adapter, other, prompts[:4], supernet_hash="abc",
                                 dataset_id="tiny", max_new_tokens=MAX_NEW, show_progress=False)
    rows = {r.spec: r for r in scorer.score([spec])}
    assert sum(lengths) / len(lengths) > 1.5  # not the trivial tau = 1
    assert rows[spec].tau == pytest.approx(sum(lengths) / len(lengths), rel=0.02)



# --- acceptance rows of elastic draft sizes (supernet/acceptance/table.py) -------------------
def _size_row(spec: SubnetSpec, tau: float = 1.5):
    from dreams_nas.supernet.acceptance.table import AcceptanceRow

    return AcceptanceRow(spec=spec, tau=tau, tau_lo=tau - 0.1, tau_hi=tau + 0.1,
                         supernet_hash="abc", dataset_id="builtin", max_new_tokens=64,
                         n_prompts=2, n_tokens=10, context_len=30, accept_rates=(0.5,))


def test_a_row_round_trips_depth_and_mlp(tmp_path) -> None:
    import csv

    from dreams_nas.supernet.acceptance.table import (
        ACCEPTANCE_COLUMNS,
        AcceptanceRow,
        AcceptanceTable,
    )

    assert ACCEPTANCE_COLUMNS[7:11] == ("tree", "depth", "mlp", "draft_vocab")
    sized = SubnetSpec(4, 0.5, 2, 1, depth=2, mlp=0.5)
    paper = SubnetSpec(4, 0.5, 2, 1)  # the same fields at depth 1 and the whole MLP
    rows = [_size_row(sized, 1.8), _size_row(paper, 1.6)]
    cells = rows[0].to_csv_row()
    assert (cells["spec_id"], cells["depth"], cells["mlp"]) == ("h4-v0.50-l2-d2-m0.50-g1", 2, 0.5)
    assert AcceptanceRow.from_csv_row({k: str(v) for k, v in cells.items()}) == rows[0]
    table = AcceptanceTable(tmp_path / "a.csv", "abc", "builtin")
    table.append(rows)
    loaded = AcceptanceTable(tmp_path / "a.csv", "abc", "builtin").load()
    assert loaded == {r.spec: r for r in rows}  # two rows: depth and mlp are part of the key
    assert loaded[sized].spec.depth == 2 and loaded[sized].spec.mlp == 0.5
    with (tmp_path / "a.csv").open(newline="") as handle:
        written = list(csv.DictReader(handle))
    assert [(r["depth"], r["mlp"]) for r in written] == [("2", "0.5"), ("1", "1.0")]


def test_a_row_round_trips_draft_vocab(tmp_path) -> None:
    import csv

    from dreams_nas.supernet.acceptance.table import (
        ACCEPTANCE_COLUMNS,
        AcceptanceRow,
        AcceptanceTable,
    )

    assert ACCEPTANCE_COLUMNS.index("draft_vocab") == ACCEPTANCE_COLUMNS.index("mlp") + 1
    small = SubnetSpec(4, 0.5, 2, 1, mlp=0.5, draft_vocab=0.25)
    whole = SubnetSpec(4, 0.5, 2, 1, mlp=0.5)  # the same architecture over the whole vocabulary
    rows = [_size_row(small, 1.4), _size_row(whole, 1.6)]
    cells = rows[0].to_csv_row()
    assert (cells["spec_id"], cells["draft_vocab"]) == ("h4-v0.50-l2-m0.50-n0.25-g1", 0.25)
    assert AcceptanceRow.from_csv_row({k: str(v) for k, v in cells.items()}) == rows[0]
    table = AcceptanceTable(tmp_path / "a.csv", "abc", "builtin")
    table.append(rows)
    loaded = AcceptanceTable(tmp_path / "a.csv", "abc", "builtin").load()
    assert loaded == {r.spec: r for r in rows}  # two rows: the vocabulary is part of the key
    assert loaded[small].spec.draft_vocab == 0.25 and loaded[small].tau == 1.4
    with (tmp_path / "a.csv").open(newline="") as handle:
        written = list(csv.DictReader(handle))
    assert [r["draft_vocab"] for r in written] == ["0.25", "1.0"]
