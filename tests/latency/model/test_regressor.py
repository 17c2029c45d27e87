"""One latency model per kind of step (latency/model/regressor.py): linear in the context for the
draft kinds, the target's steps interpolated from their own rows; both extrapolate sanely."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from _support.profiles import VISUAL_TOKENS, linear_cost, linear_profile_rows
from dreams_nas.latency.model.regressor import make_regressor
from dreams_nas.latency.model.validation import metric_kinds
from dreams_nas.supernet.core.errors import InputError


@pytest.mark.parametrize("contexts, far", [
    (range(100, 301, 25), 1000),
    # the check: a ridge on squared log features, fitted on the default grid of a
    # 576-visual-token target (592..832), predicted 296 ms at context 2000 (truth 17 ms)
    ([576 + t for t in (16, 48, 96, 160, 256)], 2000),  # `steps.default_context_lengths(576)`
])
def test_costs_linear_in_the_context_extrapolate_within_10pct_for_every_kind(contexts,
                                                                             far) -> None:
    rows = linear_profile_rows(contexts, noise=0.01, seed=3)  # ~1 % timing noise
    model = make_regressor(VISUAL_TOKENS).fit(rows, rows["median_ms"])
    truth = linear_profile_rows([far])  # noiseless, every kind and tree width
    relative = model.predict(truth) / truth["median_ms"].to_numpy() - 1
    labels = metric_kinds(truth)
    assert set(labels) == {"draft", "draft_tree", "draft_first", "decode", "verify",
                           "verify_tree", "cycle", "cycle_tree"}
    for kind in set(labels):
        worst = float(np.abs(relative[labels == kind]).max())
        assert worst < 0.10, (kind, worst)
    # and far below the range (a short prompt): still positive, still close
    near = linear_profile_rows([contexts[0] // 2])
    relative = model.predict(near) / near["median_ms"].to_numpy() - 1
    assert np.abs(relative).max() < 0.10


def test_target_steps_are_their_own_measurements_inside_the_range(monkeypatch) -> None:
    """Decode and verify are not regressed with the draft rows: a measured (k, context) gives
    back its measurement, and a context between two measured ones lies on the line between
    (the table; the surface, chosen only when it predicts left-out rows better, is never here)."""
    monkeypatch.setattr("dreams_nas.latency.model.target_table.SURFACE_MARGIN", 0.0)
    rows = linear_profile_rows([100, 200, 300], noise=0.05, seed=1)
    model = make_regressor(VISUAL_TOKENS).fit(rows, rows["median_ms"])
    target = rows[~rows.kind.isin(["draft", "draft_first"])]
    np.testing.assert_allclose(model.predict(target), target["median_ms"], rtol=1e-12)
    verify = target[(target.kind == "verify") & (target.k == 5)].set_index("context_len")
    mid = pd.DataFrame({"kind": "verify", "heads": np.nan, "visual_keep": np.nan,
                        "context_len": [150], "k": [5]})
    assert model.predict(mid)[0] == pytest.approx(verify.median_ms[[100, 200]].mean())


def test_a_profile_without_draft_first_rows_refuses_the_first_step() -> None:
    """Every profile times draft_first beside draft: without its rows the first step of a cycle
    is refused, not priced as a hot one."""
    rows = linear_profile_rows([100, 200, 300])
    rows = rows[rows.kind != "draft_first"]
    model = make_regressor(VISUAL_TOKENS).fit(rows, rows["median_ms"])
    assert "draft_first" not in model.regressors()
    hot = rows[(rows.kind == "draft") & (rows.k == 1)]
    with pytest.raises(InputError, match="no draft_first step was profiled"):
        model.predict(hot.assign(kind="draft_first"))


def test_kinds_and_ks_never_profiled_are_refused_not_extrapolated() -> None:
    rows = linear_profile_rows([100, 200, 300])
    chain = rows[(rows.kind != "verify_tree") & (rows.k < 2) | (rows.kind == "verify")]
    model = make_regressor(VISUAL_TOKENS).fit(chain, chain["median_ms"])

    def ask(kind: str, k: int) -> pd.DataFrame:
        spec = {"heads": 2, "visual_keep": 0.5} if kind.startswith("draft") else {
            "heads": np.nan, "visual_keep": np.nan}
        return pd.DataFrame({"kind": [kind], **{n: [v] for n, v in spec.items()},
                             "context_len": [200], "k": [k]})

    with pytest.raises(InputError, match="no verify_tree step was profiled"):
        model.predict(ask("verify_tree", 4))
    with pytest.raises(InputError, match=r"a draft step over a tree level of 2 nodes was not "
                                         r"profiled \(widest timed: 1\)"):
        model.predict(ask("draft", 2))
    with pytest.raises(InputError, match=r"verify step over k=12 positions was not profiled "
                                         r"\(profiled: k 2\.\.8\)"):
        model.predict(ask("verify", 12))
    # a k between two measured ks is interpolated (linear in k at the context)
    sparse = chain[~((chain.kind == "verify") & (chain.k == 5))]
    model = make_regressor(VISUAL_TOKENS).fit(sparse, sparse["median_ms"])
    assert model.predict(ask("verify", 5))[0] == pytest.approx(linear_cost("verify", 200, 5))


def test_the_model_clones_and_refuses_bad_rows() -> None:
    from sklearn.base import clone

    model = make_regressor(VISUAL_TOKENS, cv=3, random_state=7)
    assert clone(model).get_params() == model.get_params()
    rows = linear_profile_rows([100, 200])
    with pytest.raises(ValueError, match="positive milliseconds"):
        model.fit(rows, -rows["median_ms"])
    with pytest.raises(TypeError, match="takes a DataFrame"):
        model.fit(rows.to_numpy(), rows["median_ms"])


def test_cycle_rows_are_interpolated_per_k_and_linear_beyond_the_contexts() -> None:
    """The speculative cycle's own work is a target kind: its own rows per k (draft_len + 1, or
    a tree's nodes + 1), linear in k between them and in the context beyond them."""
    from _support.profiles import CYCLE_KS
    from dreams_nas.latency.model.predictor import LatencyPredictor

    rows = linear_profile_rows([100, 200, 300])
    predictor = LatencyPredictor.fit(rows, "hw", visual_tokens=VISUAL_TOKENS, holdout=0.0)
    assert predictor.prices("cycle") and predictor.prices("cycle_tree")
    assert predictor.model.regressors()["cycle"] == "interpolated"
    for k, ctx in ((CYCLE_KS[0], 200), (3, 150), (5, 250), (CYCLE_KS[-1], 600)):
        assert predictor.target_ms("cycle", [k], ctx)[0] == pytest.approx(
            linear_cost("cycle", ctx, k))
    assert predictor.target_ms("cycle_tree", [4, 7], 50) == pytest.approx(
        [linear_cost("cycle_tree", 50, 4), linear_cost("cycle_tree", 50, 7)])
    with pytest.raises(InputError, match="k=8 positions was not profiled"):
        predictor.target_ms("cycle", [8], 200)  # a longer cycle than any timed: refused


def test_a_profile_without_cycle_rows_says_it_prices_no_cycle() -> None:
    """A profile without the cycle kinds (`profile` times them; rows made otherwise may lack
    them) still predicts every step, and says it prices no cycle (the search then prices the
    cycle's own work 0 ms and says so once)."""
    from dreams_nas.latency.model.predictor import LatencyPredictor

    rows = linear_profile_rows([100, 200, 300])
    old = rows[~rows.kind.isin(["cycle", "cycle_tree"])]
    predictor = LatencyPredictor.fit(old, "hw", visual_tokens=VISUAL_TOKENS, holdout=0.2)
    assert not predictor.prices("cycle") and not predictor.prices("cycle_tree")
    with pytest.raises(InputError, match="no cycle step was profiled"):
        predictor.target_ms("cycle", [2, 4], 200)
    assert "cycle" not in predictor.metrics_by_kind
    assert predictor.target_ms("verify", [4], 200)[0] == pytest.approx(
        linear_cost("verify", 200, 4))
