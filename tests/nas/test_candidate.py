"""The vectorised evaluation: `LatencyCache` asks a batched predictor once per kind for every
distinct step, keys on what a step depends on, and falls back to one call per step for a plain
`LatencyModel` (nas/search/candidate.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pytest
from _support.search import (
    SIZED_SPACE,
    SMALL_SPACE,
    VOCAB_SPACE,
    FakeLatency,
    FakeScorer,
    fake_params,
)
from dreams_nas.latency.predictor import LatencyPredictor
from dreams_nas.nas.search.candidate import (
    BatchLatencyModel,
    Candidate,
    LatencyCache,
    SubnetFields,
    evaluate,
    evaluate_fields,
)
from dreams_nas.nas.search.strategies import search
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.space import SubnetSpec

CONTEXT = 32


@pytest.fixture(scope="module")
def predictor() -> LatencyPredictor:
    """The real predictor fitted on synthetic profile rows with the real shapes."""
    rows = []
    for ctx in (16, 32, 64):
        for h in SMALL_SPACE.heads:
            for v in SMALL_SPACE.visual_keep:
                for kind, extra in (("draft", 0.0), ("draft_first", 0.4)):
                    rows.append({"kind": kind, "heads": h, "visual_keep": v, "context_len": ctx,
                                 "k": 1, "median_ms": 0.3 + 0.2 * h + 0.3 * v + 0.001 * ctx
                                 + extra})
        for k in range(1, 8):
            rows.append({"kind": "decode" if k == 1 else "verify", "heads": np.nan,
                         "visual_keep": np.nan, "context_len": ctx, "k": k,
                         "median_ms": 4.0 + 0.3 * k})
    return LatencyPredictor.fit(pd.DataFrame(rows), "cpu-test", holdout=0.0)


@pytest.fixture
def counted(predictor, monkeypatch) -> list[int]:
    """Rows per call of the predictor's sklearn pipeline."""
    calls: list[int] = []
    original = predictor.predict_rows

    def predict_rows(rows: pd.DataFrame) -> np.ndarray:
        calls.append(len(rows))
        return original(rows)

    monkeypatch.setattr(predictor, "predict_rows", predict_rows)
    return calls


def _rows():
    return FakeScorer().score(list(SMALL_SPACE.enumerate()))


def test_the_real_predictor_is_batched_and_the_fakes_are_not(predictor) -> None:
    assert isinstance(predictor, BatchLatencyModel)
    assert LatencyCache(predictor, CONTEXT).batched
    assert not LatencyCache(FakeLatency(), CONTEXT).batched


def test_a_batched_predictor_is_asked_once_per_kind_for_every_distinct_step(
        predictor, counted) -> None:
    cache = LatencyCache(predictor, CONTEXT)
    candidates = evaluate(_rows(), cache, fake_params)
    pairs = len(SMALL_SPACE.heads) * len(SMALL_SPACE.visual_keep)
    # draft, draft_first: one row per (heads, visual_keep); target: decode + one verify per gamma
    assert sorted(counted) == sorted([pairs, pairs, 1 + len(SMALL_SPACE.draft_len)])
    assert cache.n_calls == 3
    assert len(candidates) == SMALL_SPACE.size
    evaluate(_rows(), cache, fake_params)
    assert len(counted) == 3  # everything memoised: no further call


def test_batched_figures_equal_one_prediction_per_spec(predictor) -> None:
    cache = LatencyCache(predictor, CONTEXT)
    for c in evaluate(_rows(), cache, fake_params):
        assert c.draft_ms == pytest.approx(predictor.predict_ms("draft", c.spec, CONTEXT, 1))
        assert c.first_draft_ms == pytest.approx(
            predictor.predict_ms("draft_first", c.spec, CONTEXT, 1))
        assert c.verify_ms == pytest.approx(
            predictor.predict_ms("verify", None, CONTEXT, c.spec.draft_len + 1))
        assert c.decode_ms == pytest.approx(predictor.predict_ms("decode", None, CONTEXT, 1))


def test_batched_keys_ignore_inject_layer_and_draft_len(predictor) -> None:
    cache = LatencyCache(predictor, CONTEXT)
    a = SubnetSpec(heads=2, visual_keep=0.5, inject_layer=1, draft_len=1)
    b = a.replace(inject_layer=2, draft_len=5)
    assert cache.draft(a) == cache.draft(b)
    assert cache.n_calls == 1  # b's draft step was a's
    assert cache.verify(4) == cache.verify(4) and cache.n_calls == 2


def test_a_plain_model_is_asked_once_per_distinct_step_and_keeps_inject_layer() -> None:
    lat = FakeLatency()  # its draft step reads inject_layer: the key must keep it
    cache = LatencyCache(lat, CONTEXT)
    candidates = evaluate(_rows(), cache, fake_params)
    triples = len(SMALL_SPACE.heads) * len(SMALL_SPACE.visual_keep) * len(SMALL_SPACE.inject_layer)
    assert lat.calls == cache.n_calls == 2 * triples + len(SMALL_SPACE.draft_len) + 1
    for c in candidates:
        assert c.draft_ms == lat.predict_ms("draft", c.spec, CONTEXT, 1)
        assert c.verify_ms == lat.predict_ms("verify", None, CONTEXT, c.spec.draft_len + 1)


def test_search_with_the_real_predictor_finds_the_per_spec_best(predictor) -> None:
    result = search(SMALL_SPACE, FakeScorer(), predictor, fake_params, context_len=CONTEXT,
                    show_progress=False)
    # each subnet alone, through a fresh cache: the batched table must agree with it
    alone = [evaluate([r], LatencyCache(predictor, CONTEXT), fake_params)[0] for r in _rows()]
    best = min(alone, key=lambda c: (-c.speedup, c.draft_params, c.spec))
    assert result.best.spec == best.spec
    assert result.best.speedup == pytest.approx(best.speedup)


def test_evaluate_fields_is_what_evaluate_computes(predictor) -> None:
    rows = _rows()
    arrays = evaluate_fields([r.tau for r in rows], SubnetFields.of([r.spec for r in rows]),
                             LatencyCache(predictor, CONTEXT), max_draft_ms=1.0)
    candidates = evaluate(rows, LatencyCache(predictor, CONTEXT), fake_params, max_draft_ms=1.0)
    assert arrays.speedup.tolist() == [c.speedup for c in candidates]
    assert arrays.feasible.tolist() == [c.feasible for c in candidates]
    assert arrays.feasible.any() and not arrays.feasible.all()


class _ShortBatch:
    """A batched model that answers one value whatever it is asked."""

    def predict_ms(self, kind: str, spec: SubnetSpec | None, context_len: int, k: int) -> float:
        return 1.0

    def draft_ms(self, specs: Sequence[SubnetSpec], context_len: int) -> np.ndarray:
        return np.ones(1)

    def first_draft_ms(self, specs: Sequence[SubnetSpec], context_len: int) -> np.ndarray:
        return np.ones(1)

    def target_ms(self, k: Sequence[int], context_len: int) -> np.ndarray:
        return np.ones(1)


def test_a_batched_model_answering_the_wrong_count_is_refused() -> None:
    with pytest.raises(ValueError, match=r"returned \(1,\) draft predictions for 6 steps"):
        evaluate(_rows(), LatencyCache(_ShortBatch(), CONTEXT), fake_params)


def test_fields_of_different_lengths_are_refused() -> None:
    with pytest.raises(InputError, match="1-d and of one length"):
        SubnetFields(heads=[1, 2], visual_keep=[0.5], inject_layer=[1, 1], draft_len=[1, 1])
    fields = SubnetFields(heads=[1], visual_keep=[0.5], inject_layer=[1], draft_len=[1])
    with pytest.raises(InputError, match=r"2 tau value\(s\) for 1 subnets"):
        evaluate_fields([1.0, 1.5], fields, LatencyCache(FakeLatency(), CONTEXT))


class _RecordingBatch:
    """A batched model whose draft step reads heads, visual_keep, depth, mlp and draft_vocab; it
    records the specs each call asks for."""

    def __init__(self) -> None:
        self.asked: list[list[SubnetSpec]] = []

    @staticmethod
    def _ms(spec: SubnetSpec) -> float:
        return (0.3 * spec.heads + 0.2 * spec.visual_keep + 0.5 * spec.depth + 0.4 * spec.mlp
                + 0.25 * spec.draft_vocab)

    def predict_ms(self, kind: str, spec: SubnetSpec | None, context_len: int, k: int) -> float:
        return 9.0 + k if spec is None else self._ms(spec)

    def draft_ms(self, specs: Sequence[SubnetSpec], context_len: int) -> np.ndarray:
        self.asked.append(list(specs))
        return np.array([self._ms(s) for s in specs])

    def first_draft_ms(self, specs: Sequence[SubnetSpec], context_len: int) -> np.ndarray:
        self.asked.append(list(specs))
        return np.array([self._ms(s) + 0.1 for s in specs])

    def target_ms(self, k: Sequence[int], context_len: int) -> np.ndarray:
        return 9.0 + np.asarray(k, dtype=np.float64)


def test_batched_keys_carry_depth_and_mlp() -> None:
    model = _RecordingBatch()
    cache = LatencyCache(model, CONTEXT)
    rows = FakeScorer().score(list(SIZED_SPACE.enumerate()))
    candidates = evaluate(rows, cache, fake_params)
    sizes = {(s.heads, s.visual_keep, s.depth, s.mlp) for s in SIZED_SPACE.enumerate()}
    assert len(model.asked) == 2  # draft, draft_first: once each
    for asked in model.asked:  # one spec per distinct draft size, carrying its depth and mlp
        assert {(s.heads, s.visual_keep, s.depth, s.mlp) for s in asked} == sizes
        assert len(asked) == len(sizes) == 24
    for c in candidates:
        assert c.draft_ms == pytest.approx(model._ms(c.spec))
        assert c.first_draft_ms == pytest.approx(model._ms(c.spec) + 0.1)
    a = SubnetSpec(heads=2, visual_keep=0.5, inject_layer=1, draft_len=1)
    assert cache.draft(a.replace(depth=2)) != cache.draft(a)
    assert cache.draft(a.replace(mlp=0.5)) != cache.draft(a)


def test_subnet_fields_default_to_the_paper_size_and_keep_it_in_rows() -> None:
    fields = SubnetFields(heads=[1, 2], visual_keep=[0.5, 1.0], inject_layer=[1, 1],
                          draft_len=[1, 3])
    assert fields.depth.tolist() == [1, 1] and fields.mlp.tolist() == [1.0, 1.0]
    specs = [SubnetSpec(1, 0.5, 1, 1, depth=2, mlp=0.5), SubnetSpec(2, 1.0, 1, 3)]
    of = SubnetFields.of(specs)
    assert of.depth.tolist() == [2, 1] and of.mlp.tolist() == [0.5, 1.0]
    assert of.rows(np.array([True, False])).depth.tolist() == [2]
    with pytest.raises(InputError, match="1-d and of one length"):
        SubnetFields(heads=[1], visual_keep=[0.5], inject_layer=[1], draft_len=[1], depth=[1, 2])


def test_the_cycle_overhead_is_priced_per_gamma_and_lowers_the_speedup(predictor) -> None:
    """A profile with `cycle` rows: each candidate carries its gamma's overhead, and its
    speedup is the formula's with it; a profile without them prices 0 ms."""
    from dreams_nas.nas.search.speedup import expected_speedup

    rows = predictor.train_rows
    cycles = pd.DataFrame([{"kind": "cycle", "heads": np.nan, "visual_keep": np.nan,
                            "context_len": ctx, "k": k, "median_ms": 0.5 + 0.1 * k}
                           for ctx in (16, 32, 64) for k in range(2, 8)])
    priced = LatencyPredictor.fit(pd.concat([rows, cycles], ignore_index=True), "cpu-test",
                                  holdout=0.0)
    cache = LatencyCache(priced, CONTEXT)
    assert cache.cycle_priced == {"chain": True, "tree": False}
    plain = {c.spec: c for c in evaluate(_rows(), LatencyCache(predictor, CONTEXT), fake_params)}
    for c in evaluate(_rows(), cache, fake_params):
        assert c.cycle_overhead_ms == pytest.approx(0.5 + 0.1 * (c.spec.draft_len + 1))
        expected = expected_speedup(c.tau, c.spec.draft_len, c.draft_ms, c.verify_ms,
                                    c.decode_ms, first_draft_ms=c.first_draft_ms,
                                    cycle_overhead_ms=c.cycle_overhead_ms)
        assert c.speedup == pytest.approx(float(expected))
        old = plain[c.spec]
        assert old.cycle_overhead_ms == 0.0 and old.speedup > c.speedup
        assert old.speedup / c.speedup == pytest.approx(
            (c.cycle_ms + c.cycle_overhead_ms) / c.cycle_ms)
        assert c.to_row()["cycle_overhead_ms"] == c.cycle_overhead_ms
        assert Candidate.from_attrs(c.spec, c.to_attrs(), 0).cycle_overhead_ms == \
            c.cycle_overhead_ms


def test_batched_keys_carry_the_draft_vocab() -> None:
    model = _RecordingBatch()
    cache = LatencyCache(model, CONTEXT)
    candidates = evaluate(FakeScorer().score(list(VOCAB_SPACE.enumerate())), cache, fake_params)
    sizes = {(s.heads, s.visual_keep, s.draft_vocab) for s in VOCAB_SPACE.enumerate()}
    assert len(model.asked) == 2 and len(sizes) == 12  # one spec per draft step, per kind
    for asked in model.asked:
        assert {(s.heads, s.visual_keep, s.draft_vocab) for s in asked} == sizes
    for c in candidates:  # each vocabulary's own step
        assert c.draft_ms == pytest.approx(model._ms(c.spec))
    a = SubnetSpec(heads=2, visual_keep=0.5, inject_layer=1, draft_len=1)
    assert cache.draft(a.replace(draft_vocab=0.25)) < cache.draft(a)
    unbatched = LatencyCache(FakeLatency(), CONTEXT)  # keyed by the whole architecture
    assert unbatched.draft(a.replace(draft_vocab=0.25)) < unbatched.draft(a)


def test_subnet_fields_carry_the_draft_vocab() -> None:
    fields = SubnetFields(heads=[1, 2], visual_keep=[0.5, 1.0], inject_layer=[1, 1],
                          draft_len=[1, 3])
    assert fields.draft_vocab.tolist() == [1.0, 1.0]  # the whole vocabulary by default
    specs = [SubnetSpec(1, 0.5, 1, 1, draft_vocab=0.25), SubnetSpec(2, 1.0, 1, 3)]
    of = SubnetFields.of(specs)
    assert of.draft_vocab.tolist() == [0.25, 1.0]
    assert of.rows(np.array([True, False])).draft_vocab.tolist() == [0.25]
    with pytest.raises(InputError, match="1-d and of one length"):
        SubnetFields(heads=[1], visual_keep=[0.5], inject_layer=[1], draft_len=[1],
                     draft_vocab=[1.0, 0.5])
