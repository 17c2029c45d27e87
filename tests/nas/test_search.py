from __future__ import annotations

import math

import pytest
from _support.search import SMALL_SPACE, FakeLatency, FakeScorer, fake_params, tau_of
from dreams_nas.nas.search.scoring import CachedAcceptance
from dreams_nas.nas.search.speedup import expected_speedup
from dreams_nas.nas.search.strategies import best_candidate, pareto_front, search
from dreams_nas.supernet.acceptance.table import AcceptanceTable
from dreams_nas.supernet.core.errors import InputError


def _run(**kwargs):
    scorer = kwargs.pop("scorer", FakeScorer())
    return search(SMALL_SPACE, kwargs.pop("acceptance", scorer), FakeLatency(), fake_params,
                  context_len=32, show_progress=False, **kwargs), scorer


def _brute_best(max_draft_ms=None):
    lat = FakeLatency()
    best = None
    for spec in SMALL_SPACE.enumerate():
        draft = lat.predict_ms("draft", spec, 32, 1)
        if max_draft_ms is not None and draft > max_draft_ms:
            continue
        s = float(expected_speedup(tau_of(spec), spec.draft_len, draft,
                                   lat.predict_ms("verify", None, 32, spec.draft_len + 1), 9.5))
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
    triples = {c.spec.replace(draft_len=1) for c in a.candidates}
    assert sorted(scorer.calls, key=str) == sorted(
        (t.replace(draft_len=g) for t in triples for g in SMALL_SPACE.draft_len), key=str)
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
    triples = {c.spec.replace(draft_len=1) for c in more.candidates[6:]}
    assert {s.replace(draft_len=1) for s in s3.calls} == triples - {
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
    before = search(space, FakeScorer(), hot, fake_params, context_len=32, show_progress=False)
    after = search(space, FakeScorer(), cold, fake_params, context_len=32, show_progress=False)
    for c in after.candidates:
        d, f = draft[(c.spec.heads, c.spec.visual_keep, c.spec.inject_layer)], c.first_draft_ms
        assert (c.draft_ms, f) == (d, 4.0 * d)
        assert c.speedup == pytest.approx(
            tau_of(c.spec) * 9.5 / ((c.spec.draft_len - 1) * d + f + 10.0), rel=1e-12)
    assert all(c.first_draft_ms == c.draft_ms for c in before.candidates)  # the old formula
    assert after.best.speedup < before.best.speedup
    row = trial_rows([after.best], method="exhaustive", objective="speedup")[0]
    assert set(row) == set(TRIAL_COLUMNS) and row["first_draft_ms"] == after.best.first_draft_ms
