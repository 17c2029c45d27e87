"""The vectorised evaluation: `Pricing` asks the latency model once per kind for every
distinct step, keyed by the fields the model says a draft step depends on (`draft_fields`);
`MemoizedLatency` remembers the answers across calls (nas/search/candidate.py,
latency/model/query.py)."""

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
    pricing_of,
    run_search,
)
from dreams_nas.latency.kinds import DRAFT_AXES
from dreams_nas.latency.model.predictor import LatencyPredictor
from dreams_nas.latency.model.query import LatencyModel, MemoizedLatency
from dreams_nas.nas.search.candidate import (
    Candidate,
    SubnetFields,
    evaluate,
    evaluate_fields,
)
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.spec import ARCH_FIELDS, SubnetSpec

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


def test_the_real_predictor_and_the_fakes_answer_one_interface(predictor) -> None:
    assert isinstance(predictor, LatencyModel) and isinstance(FakeLatency(), LatencyModel)
    assert predictor.draft_fields == DRAFT_AXES  # not inject_layer, not draft_len
    assert FakeLatency().draft_fields == ARCH_FIELDS  # its draft step reads inject_layer


def test_the_predictor_is_asked_once_per_kind_for_every_distinct_step(
        predictor, counted) -> None:
    memo = MemoizedLatency(predictor)
    candidates = evaluate(_rows(), pricing_of(memo, CONTEXT))
    pairs = len(SMALL_SPACE.heads) * len(SMALL_SPACE.visual_keep)
    # draft, draft_first: one row per (heads, visual_keep); decode; one verify per draft_len
    assert sorted(counted) == sorted([pairs, pairs, 1, len(SMALL_SPACE.draft_len)])
    assert memo.n_calls == 4 and len(candidates) == SMALL_SPACE.size
    evaluate(_rows(), pricing_of(memo, CONTEXT))
    assert len(counted) == 4  # everything memoised: no further call


def test_table_figures_equal_one_prediction_per_spec(predictor) -> None:
    for c in evaluate(_rows(), pricing_of(predictor, CONTEXT)):
        assert c.draft_ms == pytest.approx(predictor.draft_ms([c.spec], CONTEXT)[0])
        assert c.first_draft_ms == pytest.approx(
            predictor.draft_ms([c.spec], CONTEXT, kind="draft_first")[0])
        assert c.verify_ms == pytest.approx(
            predictor.target_ms("verify", [c.spec.draft_len + 1], CONTEXT)[0])
        assert c.decode_ms == pytest.approx(predictor.target_ms("decode", [1], CONTEXT)[0])


def test_memo_keys_ignore_inject_layer_and_draft_len(predictor) -> None:
    memo = MemoizedLatency(predictor)
    a = SubnetSpec(heads=2, visual_keep=0.5, inject_layer=1, draft_len=1)
    b = a.replace(inject_layer=2, draft_len=5)
    assert memo.draft_ms([a], CONTEXT) == memo.draft_ms([b], CONTEXT)
    assert memo.n_calls == 1  # b's draft step was a's
    assert memo.target_ms("verify", [4], CONTEXT) == memo.target_ms("verify", [4], CONTEXT)
    assert memo.n_calls == 2


def test_a_model_reading_inject_layer_is_asked_per_architecture() -> None:
    lat = FakeLatency()  # its draft step reads inject_layer: the key must keep it
    candidates = evaluate(_rows(), pricing_of(lat, CONTEXT))
    archs = len(SMALL_SPACE.heads) * len(SMALL_SPACE.visual_keep) * len(SMALL_SPACE.inject_layer)
    assert lat.calls == 2 * archs + len(SMALL_SPACE.draft_len) + 1
    for c in candidates:
        assert c.draft_ms == lat.step_ms("draft", c.spec, CONTEXT, 1)
        assert c.verify_ms == lat.step_ms("verify", None, CONTEXT, c.spec.draft_len + 1)


def test_search_with_the_real_predictor_finds_the_per_spec_best(predictor) -> None:
    result = run_search(SMALL_SPACE, FakeScorer(), predictor, fake_params, context_len=CONTEXT,
                    show_progress=False)
    # each subnet alone: the table must agree with it
    alone = [evaluate([r], pricing_of(predictor, CONTEXT))[0] for r in _rows()]
    best = min(alone, key=lambda c: (-c.speedup, c.draft_params, c.spec))
    assert result.best.spec == best.spec
    assert result.best.speedup == pytest.approx(best.speedup)


def test_evaluate_fields_is_what_evaluate_computes(predictor) -> None:
    rows = _rows()
    arrays = evaluate_fields([r.tau for r in rows], SubnetFields.of([r.spec for r in rows]),
                             pricing_of(predictor, CONTEXT), max_draft_ms=1.0)
    candidates = evaluate(rows, pricing_of(predictor, CONTEXT), max_draft_ms=1.0)
    assert arrays.speedup.tolist() == [c.speedup for c in candidates]
    assert arrays.feasible.tolist() == [c.feasible for c in candidates]
    assert arrays.feasible.any() and not arrays.feasible.all()


class _Short(FakeLatency):
    """A model that answers one draft value whatever it is asked."""

    def draft_ms(self, specs: Sequence[SubnetSpec], context_len: int, kind: str = "draft",
                 k: int = 1) -> np.ndarray:
        return np.ones(1)


def test_a_model_answering_the_wrong_count_is_refused() -> None:
    with pytest.raises(ValueError, match=r"returned \(1,\) draft predictions for 6 steps"):
        specs = [SubnetSpec(h, v, 1, 1) for h in (1, 2, 4) for v in (0.5, 1.0)]
        MemoizedLatency(_Short()).draft_ms(specs, CONTEXT)


def test_fields_of_different_lengths_are_refused() -> None:
    with pytest.raises(InputError, match="1-d and of one length"):
        SubnetFields(heads=[1, 2], visual_keep=[0.5], inject_layer=[1, 1], draft_len=[1, 1])
    fields = SubnetFields(heads=[1], visual_keep=[0.5], inject_layer=[1], draft_len=[1])
    with pytest.raises(InputError, match=r"2 tau value\(s\) for 1 subnets"):
        evaluate_fields([1.0, 1.5], fields, pricing_of(FakeLatency(), CONTEXT))


class _Recording(FakeLatency):
    """A model whose draft step reads heads, visual_keep, depth, mlp and draft_vocab (its
    `draft_fields`); it records the specs each draft call asks for."""

    draft_fields = DRAFT_AXES

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[list[SubnetSpec]] = []

    @staticmethod
    def _ms(spec: SubnetSpec) -> float:
        return (0.3 * spec.heads + 0.2 * spec.visual_keep + 0.5 * spec.depth + 0.4 * spec.mlp
                + 0.25 * spec.draft_vocab)

    def step_ms(self, kind: str, spec: SubnetSpec | None, context_len: int, k: int) -> float:
        if spec is None:
            return 9.0 + k
        return self._ms(spec) + (0.1 if kind == "draft_first" else 0.0)

    def draft_ms(self, specs: Sequence[SubnetSpec], context_len: int, kind: str = "draft",
                 k: int = 1) -> np.ndarray:
        self.asked.append(list(specs))
        return super().draft_ms(specs, context_len, kind, k)


def test_draft_keys_carry_depth_and_mlp() -> None:
    model = _Recording()
    memo = MemoizedLatency(model)
    rows = FakeScorer().score(list(SIZED_SPACE.enumerate()))
    candidates = evaluate(rows, pricing_of(memo, CONTEXT))
    sizes = {(s.heads, s.visual_keep, s.depth, s.mlp) for s in SIZED_SPACE.enumerate()}
    assert len(model.asked) == 2  # draft, draft_first: once each
    for asked in model.asked:  # one spec per distinct draft size, carrying its depth and mlp
        assert {(s.heads, s.visual_keep, s.depth, s.mlp) for s in asked} == sizes
        assert len(asked) == len(sizes) == 24
    for c in candidates:
        assert c.draft_ms == pytest.approx(model._ms(c.spec))
        assert c.first_draft_ms == pytest.approx(model._ms(c.spec) + 0.1)
    a = SubnetSpec(heads=2, visual_keep=0.5, inject_layer=1, draft_len=1)
    assert memo.draft_ms([a.replace(depth=2)], CONTEXT) != memo.draft_ms([a], CONTEXT)
    assert memo.draft_ms([a.replace(mlp=0.5)], CONTEXT) != memo.draft_ms([a], CONTEXT)


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


def test_the_cycle_overhead_is_priced_per_draft_len_and_lowers_the_speedup(predictor) -> None:
    """A profile with `cycle` rows: each candidate carries its draft_len's overhead, and its
    speedup is the formula's with it; a profile without them prices 0 ms."""
    from dreams_nas.nas.search.speedup import expected_speedup

    rows = predictor.train_rows
    cycles = pd.DataFrame([{"kind": "cycle", "heads": np.nan, "visual_keep": np.nan,
                            "context_len": ctx, "k": k, "median_ms": 0.5 + 0.1 * k}
                           for ctx in (16, 32, 64) for k in range(2, 8)])
    priced = LatencyPredictor.fit(pd.concat([rows, cycles], ignore_index=True), "cpu-test",
                                  holdout=0.0)
    assert priced.prices("cycle") and not priced.prices("cycle_tree")
    plain = {c.spec: c for c in evaluate(_rows(), pricing_of(predictor, CONTEXT))}
    for c in evaluate(_rows(), pricing_of(priced, CONTEXT)):
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


def test_draft_keys_carry_the_draft_vocab() -> None:
    model = _Recording()
    memo = MemoizedLatency(model)
    candidates = evaluate(FakeScorer().score(list(VOCAB_SPACE.enumerate())),
                          pricing_of(memo, CONTEXT))
    sizes = {(s.heads, s.visual_keep, s.draft_vocab) for s in VOCAB_SPACE.enumerate()}
    assert len(model.asked) == 2 and len(sizes) == 12  # one spec per draft step, per kind
    for asked in model.asked:
        assert {(s.heads, s.visual_keep, s.draft_vocab) for s in asked} == sizes
    for c in candidates:  # each vocabulary's own step
        assert c.draft_ms == pytest.approx(model._ms(c.spec))
    a = SubnetSpec(heads=2, visual_keep=0.5, inject_layer=1, draft_len=1)
    assert memo.draft_ms([a.replace(draft_vocab=0.25)], CONTEXT) < memo.draft_ms([a], CONTEXT)
    whole = MemoizedLatency(FakeLatency())  # keyed by the whole architecture
    assert whole.draft_ms([a.replace(draft_vocab=0.25)], CONTEXT) < whole.draft_ms([a], CONTEXT)


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
