from __future__ import annotations

import math
from dataclasses import replace

import pytest
from _support.search import (
    SIZED_SPACE,
    SMALL_SPACE,
    VOCAB_SPACE,
    FakeLatency,
    FakeScorer,
    fake_params,
    run_search,
    tau_of,
)
from dreams_nas.nas.search.scoring import CachedAcceptance
from dreams_nas.nas.search.speedup import expected_speedup
from dreams_nas.nas.search.strategies import best_candidate, pareto_front
from dreams_nas.supernet.acceptance.table import AcceptanceTable
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.space import SearchSpace


def _run(**kwargs):
    scorer = kwargs.pop("scorer", FakeScorer())
    return run_search(SMALL_SPACE, kwargs.pop("acceptance", scorer), FakeLatency(), fake_params,
                  context_len=32, show_progress=False, **kwargs), scorer


def _brute_best(max_draft_ms=None):
    lat = FakeLatency()
    best = None
    for spec in SMALL_SPACE.enumerate():
        draft = lat.step_ms("draft", spec, 32, 1)
        if max_draft_ms is not None and draft > max_draft_ms:
            continue
        s = float(expected_speedup(tau_of(spec), spec.draft_len, draft,
                                   lat.step_ms("verify", None, 32, spec.draft_len + 1), 9.5))
        if best is None or s > best[0]:
            best = (s, spec)
    return best


def test_exhaustive_scores_every_subnet_once_and_finds_the_true_best() -> None:
    result, scorer = _run()
    assert len(result.candidates) == SMALL_SPACE.size
    assert sorted(scorer.calls) == sorted(SMALL_SPACE.enumerate())
    speedup, spec = _brute_best()
    assert result.best.spec == spec
    assert result.best.speedup == pytest.approx(speedup)
    assert result.best.tau == pytest.approx(tau_of(spec))
    assert result.front[0] == result.best  # the front is sorted by speedup


def test_constraint_makes_slow_drafts_infeasible() -> None:
    result, _ = _run(max_draft_ms=1.5)
    assert all(c.feasible == (c.draft_ms <= 1.5) for c in result.candidates)
    assert any(not c.feasible for c in result.candidates)
    assert result.best.draft_ms <= 1.5
    assert result.best.spec == _brute_best(1.5)[1]
    assert all(c.feasible for c in result.front)


def fake_memory(spec) -> int:
    """Weights + KV: more heads and more visual tokens kept cost memory."""
    return 4 * fake_params(spec) + 512 * spec.heads * (16 + round(64 * spec.visual_keep))


@pytest.mark.parametrize(("front", "high", "low"), [
    ("tau-latency", "tau", "cycle_ms"), ("speedup-memory", "speedup", "draft_bytes"),
    ("speedup-params", "speedup", "draft_params")])
def test_front_is_the_non_dominated_set_of_its_pair(front, high, low) -> None:
    result, _ = _run(objective="pareto", front=front, draft_memory=fake_memory)
    cands = result.candidates
    assert result.front_axes == front
    assert all(c.draft_bytes == fake_memory(c.spec) for c in cands)
    for c in cands:
        hi, lo = getattr(c, high), getattr(c, low)
        dominated = any(getattr(o, high) >= hi and getattr(o, low) <= lo
                        and (getattr(o, high) > hi or getattr(o, low) < lo) for o in cands)
        assert (c in result.front) == (not dominated)
    assert pareto_front(list(cands), front) == list(result.front)
    assert best_candidate(list(cands)) == result.best
    assert len(result.front) > 1  # a front worth plotting on this space


def test_the_fronts_differ_and_memory_is_required_for_its_front() -> None:
    fronts = {f: {c.spec for c in _run(objective="pareto", front=f,
                                       draft_memory=fake_memory)[0].front}
              for f in ("tau-latency", "speedup-memory", "speedup-params")}
    assert len({frozenset(v) for v in fronts.values()}) == 3
    with pytest.raises(InputError, match="speedup-memory front needs each draft's memory"):
        _run(objective="pareto", front="speedup-memory")
    with pytest.raises(InputError, match=r"front 'size' is not one of"):
        _run(objective="pareto", front="size")


def test_exhaustive_only_scores_what_the_cache_lacks(tmp_path) -> None:
    table = AcceptanceTable(tmp_path / "acc.csv", "abc123", "builtin")
    first = FakeScorer()
    half = list(SMALL_SPACE.enumerate())[:10]
    CachedAcceptance(first, table).rows(half, show_progress=False)
    second = FakeScorer()
    result, _ = _run(acceptance=CachedAcceptance(second, table))
    assert len(second.calls) == SMALL_SPACE.size - 10
    assert not set(second.calls) & set(half)
    assert len(table.load()) == SMALL_SPACE.size
    assert result.n_scored == SMALL_SPACE.size - 10


def test_optuna_in_memory_is_seeded_and_enqueues_extremes_first() -> None:
    a, scorer = _run(method="optuna", n_trials=12, seed=3)
    b, _ = _run(method="optuna", n_trials=12, seed=3)
    assert [c.spec for c in a.candidates] == [c.spec for c in b.candidates]
    assert a.candidates[0].spec == SMALL_SPACE.largest()
    assert a.candidates[1].spec == SMALL_SPACE.smallest()
    assert len(a.candidates) == 12
    assert len(set(scorer.calls)) == len(scorer.calls)  # never scored twice
    # tau is scored a triple at a time: every draft length of each triple the trials touched
    archs = {c.spec.replace(draft_len=1) for c in a.candidates}
    assert sorted(scorer.calls, key=str) == sorted(
        (t.replace(draft_len=g) for t in archs for g in SMALL_SPACE.draft_len), key=str)
    assert [h[0] for h in a.history] == [c.number for c in a.candidates]
    bests = [h[2] for h in a.history]
    assert bests == sorted(bests) and bests[-1] == pytest.approx(a.best.speedup)


def test_optuna_pareto_and_constraint() -> None:
    result, _ = _run(method="optuna", objective="pareto", n_trials=15, max_draft_ms=1.5)
    assert len(result.candidates) == 15
    assert all(c.feasible for c in result.front)
    assert result.best is None or result.best.draft_ms <= 1.5


def test_optuna_sqlite_resumes_the_same_study(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    first, s1 = _run(method="optuna", n_trials=6, storage=url)
    again, s2 = _run(method="optuna", n_trials=6, storage=url)
    assert s2.calls == []  # the study already holds 6 scored subnets
    assert [c.spec for c in again.candidates] == [c.spec for c in first.candidates]
    more, s3 = _run(method="optuna", n_trials=10, storage=url)
    assert len(more.candidates) == 10
    assert not set(s3.calls) & set(s1.calls)  # the storage's shared rows hold s1's triples
    archs = {c.spec.replace(draft_len=1) for c in more.candidates[6:]}
    assert {s.replace(draft_len=1) for s in s3.calls} == archs - {
        s.replace(draft_len=1) for s in s1.calls}  # only the new triples, whole


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"objective": "fast"}, r"objective 'fast' is not one of"),
        ({"method": "grid"}, r"method 'grid' is not one of"),
        ({"max_draft_ms": 0}, r"max_draft_ms=0 must be a positive"),
        ({"n_trials": 0}, r"n_trials=0 must be at least 1"),
    ],
)
def test_bad_arguments(kwargs, match) -> None:
    with pytest.raises(InputError, match=match):
        _run(**kwargs)


def test_speedups_are_finite() -> None:
    result, _ = _run()
    assert all(math.isfinite(c.speedup) and c.speedup > 0 for c in result.candidates)


def test_the_cold_first_draft_step_enters_every_candidate_and_the_trials_row() -> None:
    from dreams_nas.nas.search.replay import RecordedLatency
    from dreams_nas.nas.stages.export import TRIAL_COLUMNS, trial_rows

    space = SMALL_SPACE
    keys = {(s.heads, s.visual_keep, s.inject_layer) for s in space.enumerate()}
    draft = {k: 0.3 + 0.3 * k[0] for k in keys}
    hot = RecordedLatency(draft, {k: 10.0 for k in range(2, 7)}, decode=9.5)
    cold = RecordedLatency(draft, {k: 10.0 for k in range(2, 7)}, decode=9.5,
                           first_draft={k: 4.0 * ms for k, ms in draft.items()})
    before = run_search(space, FakeScorer(), hot, fake_params, context_len=32, show_progress=False)
    after = run_search(space, FakeScorer(), cold, fake_params, context_len=32, show_progress=False)
    for c in after.candidates:
        d, f = draft[(c.spec.heads, c.spec.visual_keep, c.spec.inject_layer)], c.first_draft_ms
        assert (c.draft_ms, f) == (d, 4.0 * d)
        assert c.speedup == pytest.approx(
            tau_of(c.spec) * 9.5 / ((c.spec.draft_len - 1) * d + f + 10.0), rel=1e-12)
    assert all(c.first_draft_ms == c.draft_ms for c in before.candidates)  # the old formula
    assert after.best.speedup < before.best.speedup
    row = trial_rows([after.best], method="exhaustive", objective="speedup")[0]
    assert set(row) == set(TRIAL_COLUMNS) and row["first_draft_ms"] == after.best.first_draft_ms


# --- elastic depth and MLP width --------------------------------------------------------------
def _sized(**kwargs):
    scorer = kwargs.pop("scorer", FakeScorer())
    return run_search(SIZED_SPACE, scorer, FakeLatency(), fake_params, context_len=32,
                  show_progress=False, **kwargs), scorer


def test_exhaustive_covers_every_depth_and_width_and_finds_the_true_best() -> None:
    result, scorer = _sized()
    assert result.space_size == SIZED_SPACE.size == 4 * SMALL_SPACE.size
    assert sorted(c.spec for c in result.candidates) == sorted(SIZED_SPACE.enumerate())
    assert sorted(scorer.calls) == sorted(SIZED_SPACE.enumerate())  # each scored once
    assert {(c.spec.depth, c.spec.mlp) for c in result.candidates} == {
        (1, 0.5), (1, 1.0), (2, 0.5), (2, 1.0)}
    lat = FakeLatency()

    def speedup(spec):
        draft = lat.step_ms("draft", spec, 32, 1)
        return float(expected_speedup(tau_of(spec), spec.draft_len, draft,
                                      lat.step_ms("verify", None, 32, spec.draft_len + 1),
                                      9.5))

    best = max(SIZED_SPACE.enumerate(), key=speedup)
    assert result.best.spec == best and result.best.speedup == pytest.approx(speedup(best))
    for c in result.candidates:  # every figure is the one of its own depth and width
        assert c.draft_ms == lat.step_ms("draft", c.spec, 32, 1)
        assert c.draft_params == fake_params(c.spec)


def test_the_paper_size_subnets_of_a_sized_space_score_as_in_the_space_without_sizes() -> None:
    sized = {c.spec: c for c in _sized()[0].candidates}
    for c in _run()[0].candidates:
        assert sized[c.spec] == replace(c, number=sized[c.spec].number)


def test_optuna_samples_depth_and_width_when_the_space_has_them() -> None:
    from dreams_nas.nas.search.params import params_of, search_distributions, spec_of

    old = search_distributions(SMALL_SPACE)
    assert set(old) == {"heads", "visual_keep", "inject_layer", "draft_len"}  # as before
    dists = search_distributions(SIZED_SPACE)
    assert set(dists) == {"heads", "visual_keep", "inject_layer", "depth", "mlp", "draft_len"}
    assert sorted(dists["depth"].choices) == [1, 2]
    assert sorted(dists["mlp"].choices) == [0.5, 1.0]
    for spec in SIZED_SPACE.enumerate():
        assert spec_of(params_of(spec, dists)) == spec
    result, scorer = _sized(method="optuna", n_trials=24, seed=5)
    assert len(result.candidates) == 24
    assert result.candidates[0].spec == SIZED_SPACE.largest()  # depth 2, the whole MLP
    assert result.candidates[1].spec == SIZED_SPACE.smallest()  # depth 1, half the MLP
    assert (SIZED_SPACE.largest().depth, SIZED_SPACE.smallest().mlp) == (2, 0.5)
    assert {c.spec.depth for c in result.candidates} == {1, 2}
    assert {c.spec.mlp for c in result.candidates} == {0.5, 1.0}
    assert all(c.spec in SIZED_SPACE for c in result.candidates)
    # tau is scored an architecture at a time: its every draft length, depth and width kept
    archs = {c.spec.arch for c in result.candidates}
    assert sorted(scorer.calls) == sorted(
        a.replace(draft_len=g) for a in archs for g in SIZED_SPACE.draft_len)


def test_a_space_of_one_other_size_carries_it_into_every_trial() -> None:
    from dreams_nas.nas.search.params import search_distributions

    space = SearchSpace(heads=(1, 2), visual_keep=(1.0,), inject_layer=(1,), draft_len=(1, 3),
                        depth=(2,))
    assert "depth" in search_distributions(space) and "mlp" not in search_distributions(space)
    result = run_search(space, FakeScorer(), FakeLatency(), fake_params, context_len=32,
                    method="optuna", n_trials=4, show_progress=False)
    assert {c.spec.depth for c in result.candidates} == {2}
    assert {c.spec.mlp for c in result.candidates} == {1.0}


def test_the_shared_sweep_grids_every_architecture(tmp_path) -> None:
    import optuna

    url = f"sqlite:///{tmp_path / 'study.db'}"
    result, scorer = _sized(storage=url, study_name="sweep")
    assert sorted(c.spec for c in result.candidates) == sorted(SIZED_SPACE.enumerate())
    assert sorted(scorer.calls) == sorted(SIZED_SPACE.enumerate())
    study = optuna.load_study(study_name="sweep", storage=url)
    grid = {t.user_attrs["triple"] for t in study.get_trials(deepcopy=False)}
    assert grid == {"triple:" + a.id for a in SIZED_SPACE.architectures}
    assert len(grid) == SIZED_SPACE.n_architectures == 48
    assert "triple:h4-v1.00-l2-d2-m0.50-g1" in grid
    alone = _sized()[0].best  # the sweep finds what one process finds
    assert result.best == replace(alone, number=result.best.number)


def test_recorded_latency_keys_name_the_draft_size() -> None:
    from dreams_nas.nas.search.replay import RecordedLatency
    from dreams_nas.supernet.core.spec import SubnetSpec

    spec = SubnetSpec(2, 0.5, 1, 3)
    recorded = RecordedLatency({(2, 0.5, 1): 1.0, (2, 0.5, 1, 2, 0.5): 2.5}, {4: 10.0},
                               decode=9.5)
    assert recorded.step_ms("draft", spec, 32, 1) == 1.0  # a key of three: depth 1, mlp 1.0
    assert recorded.step_ms("draft", spec.replace(depth=2, mlp=0.5), 32, 1) == 2.5
    with pytest.raises(InputError, match="no recorded draft latency for h2-v0.50-l1-d2-g3"):
        recorded.step_ms("draft", spec.replace(depth=2), 32, 1)
    with pytest.raises(InputError, match=r"key \(2, 0.5, 1, 2\) must be"):
        RecordedLatency({(2, 0.5, 1, 2): 1.0}, {}, decode=1.0)


# --- the draft vocabulary --------------------------------------------------------------------
def _vocab(**kwargs):
    scorer = kwargs.pop("scorer", FakeScorer())
    return run_search(VOCAB_SPACE, kwargs.pop("acceptance", scorer), FakeLatency(), fake_params,
                  context_len=32, show_progress=False, **kwargs), scorer


def test_exhaustive_scores_each_draft_vocab_as_its_own_architecture(tmp_path) -> None:
    import csv

    table = AcceptanceTable(tmp_path / "acc.csv", "abc123", "builtin")
    scorer = FakeScorer()
    result, _ = _vocab(acceptance=CachedAcceptance(scorer, table))
    assert result.space_size == VOCAB_SPACE.size == 2 * SMALL_SPACE.size
    assert sorted(c.spec for c in result.candidates) == sorted(VOCAB_SPACE.enumerate())
    assert sorted(scorer.calls) == sorted(VOCAB_SPACE.enumerate())  # each scored once
    quarter = {c.spec.replace(draft_vocab=1.0): c for c in result.candidates
               if c.spec.draft_vocab == 0.25}
    assert len(quarter) == SMALL_SPACE.size
    for c in result.candidates:  # the two vocabularies of one architecture differ
        if c.spec.draft_vocab == 1.0:
            assert quarter[c.spec].tau < c.tau and quarter[c.spec].draft_ms < c.draft_ms
            assert quarter[c.spec].draft_params == c.draft_params  # the LM head is the target's
    lat = FakeLatency()

    def speedup(spec):
        draft = lat.step_ms("draft", spec, 32, 1)
        return float(expected_speedup(tau_of(spec), spec.draft_len, draft,
                                      lat.step_ms("verify", None, 32, spec.draft_len + 1),
                                      9.5))

    best = max(VOCAB_SPACE.enumerate(), key=speedup)
    assert result.best.spec == best and result.best.speedup == pytest.approx(speedup(best))
    with (tmp_path / "acc.csv").open(newline="") as handle:
        written = list(csv.DictReader(handle))
    assert {r["draft_vocab"] for r in written} == {"0.25", "1.0"}
    assert len(written) == VOCAB_SPACE.size and len(table.load()) == VOCAB_SPACE.size


def test_optuna_samples_the_draft_vocab_when_the_space_has_it() -> None:
    from dreams_nas.nas.search.params import params_of, search_distributions, spec_of

    assert "draft_vocab" not in search_distributions(SIZED_SPACE)  # the whole one: as before
    dists = search_distributions(VOCAB_SPACE)
    assert set(dists) == {"heads", "visual_keep", "inject_layer", "draft_vocab", "draft_len"}
    assert sorted(dists["draft_vocab"].choices) == [0.25, 1.0]
    for spec in VOCAB_SPACE.enumerate():
        assert spec_of(params_of(spec, dists)) == spec
    result, scorer = _vocab(method="optuna", n_trials=16, seed=5)
    assert len(result.candidates) == 16
    assert result.candidates[0].spec == VOCAB_SPACE.largest()  # the whole vocabulary
    assert result.candidates[1].spec == VOCAB_SPACE.smallest()  # a quarter of it
    assert VOCAB_SPACE.smallest().draft_vocab == 0.25
    assert {c.spec.draft_vocab for c in result.candidates} == {0.25, 1.0}
    assert all(c.spec in VOCAB_SPACE for c in result.candidates)
    archs = {c.spec.arch for c in result.candidates}  # the vocabulary kept in each
    assert sorted(scorer.calls) == sorted(
        a.replace(draft_len=g) for a in archs for g in VOCAB_SPACE.draft_len)


def test_the_shared_sweep_grids_every_draft_vocab(tmp_path) -> None:
    import optuna

    url = f"sqlite:///{tmp_path / 'study.db'}"
    result, scorer = _vocab(storage=url, study_name="sweep")
    assert sorted(c.spec for c in result.candidates) == sorted(VOCAB_SPACE.enumerate())
    assert sorted(scorer.calls) == sorted(VOCAB_SPACE.enumerate())
    study = optuna.load_study(study_name="sweep", storage=url)
    grid = {t.user_attrs["triple"] for t in study.get_trials(deepcopy=False)}
    assert grid == {"triple:" + a.id for a in VOCAB_SPACE.architectures}
    assert len(grid) == VOCAB_SPACE.n_architectures == 24
    assert "triple:h4-v1.00-l2-n0.25-g1" in grid and "triple:h4-v1.00-l2-g1" in grid


def test_recorded_latency_keys_name_the_draft_vocab() -> None:
    from dreams_nas.nas.search.replay import RecordedLatency
    from dreams_nas.supernet.core.spec import SubnetSpec

    spec = SubnetSpec(2, 0.5, 1, 3)
    recorded = RecordedLatency({(2, 0.5, 1, 1, 1.0): 1.0, (2, 0.5, 1, 2, 0.5, 0.25): 2.5},
                               {4: 10.0}, decode=9.5)
    assert recorded.step_ms("draft", spec, 32, 1) == 1.0  # a key of five: the whole one
    assert recorded.step_ms("draft", spec.replace(depth=2, mlp=0.5, draft_vocab=0.25),
                               32, 1) == 2.5
    with pytest.raises(InputError, match="no recorded draft latency for h2-v0.50-l1-n0.25-g3"):
        recorded.step_ms("draft", spec.replace(draft_vocab=0.25), 32, 1)
    with pytest.raises(InputError, match=r"key \(2, 0.5, 1, 2, 0.5, 0.25, 1\) must be"):
        RecordedLatency({(2, 0.5, 1, 2, 0.5, 0.25, 1): 1.0}, {}, decode=1.0)
