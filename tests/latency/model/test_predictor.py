from __future__ import annotations

import hashlib
import itertools
import json
import pathlib
import pickle

import numpy as np
import pandas as pd
import pytest
from dreams_nas.latency.kinds import DRAFT_AXES
from dreams_nas.latency.model import persist
from dreams_nas.latency.model.draft_regression import (
    FEATURE_NAMES,
    CVSelectedRegressor,
    DraftFeatures,
    default_candidates,
    latency_metrics,
)
from dreams_nas.latency.model.predictor import LatencyPredictor, holdout_split
from dreams_nas.latency.model.query import LatencyModel
from dreams_nas.latency.model.regressor import SKOPS_TRUSTED_TYPES, make_regressor
from dreams_nas.supernet.core.errors import InputError, MissingArtefactError
from dreams_nas.supernet.core.spec import SubnetSpec
from sklearn.base import BaseEstimator, RegressorMixin, clone
from sklearn.ensemble import RandomForestRegressor
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import Ridge
from sklearn.utils.estimator_checks import parametrize_with_checks

SMALL = [("ridge", Ridge(alpha=1.0)),
         ("forest", RandomForestRegressor(n_estimators=5, random_state=0))]


@pytest.fixture
def quick_fits():
    """Default candidates with small ensembles (`_support.fits`), for the tests of saving,
    loading, refitting and refusing files: what they check does not depend on the regressor
    cross-validation picks. The real candidates are fitted by
    test_pipeline_fits_log_latency_and_is_accurate_on_held_out_rows,
    test_save_load_and_spec_level_predictions and
    test_save_then_load_predicts_the_same_for_every_regressor_family."""
    from _support.fits import quick_latency_fits

    with quick_latency_fits():
        yield


@parametrize_with_checks([CVSelectedRegressor(candidates=SMALL, cv=3)])
def test_sklearn_estimator_contract(estimator, check) -> None:
    check(estimator)


def synthetic_rows(visual_tokens: int = 32, noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """Step costs shaped like real ones: draft ~ heads x attended keys, target ~ k x context."""
    rng = np.random.default_rng(seed)
    rows = []
    for ctx in (48, 96, 144, 192, 240):
        for heads in (1, 2, 3, 4):
            for keep in (0.25, 0.5, 0.75, 1.0):
                att = ctx - visual_tokens * (1 - keep)
                rows.append({"kind": "draft", "heads": heads, "visual_keep": keep,
                             "context_len": ctx, "k": 1,
                             "median_ms": 0.4 + 0.05 * heads + 0.0004 * heads * att})
        for k in range(1, 9):
            rows.append({"kind": "decode" if k == 1 else "verify", "heads": np.nan,
                         "visual_keep": np.nan, "context_len": ctx, "k": k,
                         "median_ms": 3.0 + 0.3 * k + 0.002 * ctx + 0.0002 * k * ctx})
    frame = pd.DataFrame(rows)
    frame["median_ms"] *= np.exp(rng.normal(0, noise, len(frame)))
    frame["spec_id"] = ""
    return frame


def test_features_ignore_inject_layer_and_draft_len() -> None:
    rows = synthetic_rows().head(3)
    feats = DraftFeatures(visual_tokens=32).fit(rows)
    a = feats.transform(rows)
    moved = rows.assign(inject_layer=[1, 5, 9], draft_len=[1, 4, 7])
    np.testing.assert_array_equal(a, feats.transform(moved))
    assert a.shape == (3, len(FEATURE_NAMES))
    assert list(feats.get_feature_names_out()) == list(FEATURE_NAMES)
    # attended keys: text + kept visual tokens
    assert a[0, FEATURE_NAMES.index("attended")] == 48 - 32 * 0.75


def test_features_refuse_bad_rows() -> None:
    drafts = synthetic_rows()[lambda f: f.kind == "draft"]
    feats = DraftFeatures().fit(drafts)
    with pytest.raises(ValueError, match=r"lack column\(s\) \['k'\]"):
        feats.transform(drafts.drop(columns="k"))
    with pytest.raises(ValueError, match=r"takes draft steps \(draft, draft_first\), not "
                                         r"\['decode', 'verify'\]"):
        feats.transform(synthetic_rows())  # target steps have a model of their own
    with pytest.raises(TypeError, match="takes a DataFrame"):
        feats.transform(np.zeros((2, 5)))
    with pytest.raises(ValueError, match=r"unknown step kind\(s\) \['prefill'\]"):
        make_regressor().fit(synthetic_rows().assign(kind="prefill"), np.ones(200))


def test_model_is_accurate_on_held_out_rows_per_kind() -> None:
    rows = synthetic_rows(noise=0.01)
    train, hold = holdout_split(rows, 0.7, seed=0)
    model = make_regressor(visual_tokens=32).fit(rows[train], rows.median_ms[train])
    metrics = latency_metrics(rows.median_ms[hold], model.predict(rows[hold]))
    assert (metrics["mape"] < 0.03 and metrics["within_10pct"] > 0.97
            and metrics["kendall_tau"] > 0.9)
    # the synthetic verify costs are the surface's shape exactly (1 % noise): it predicts left-out
    # rows better than interpolating them; decode's five contexts leave the table
    assert model.regressors() == {"draft": model.draft_models_["draft"].best_name_,
                                  "decode": "interpolated", "verify": "surface"}
    selector = model.draft_models_["draft"]
    assert set(selector.cv_scores_) == {"linear", "linear_sizes2"}
    scores = model.cv_scores()
    assert scores["draft"] == selector.cv_scores_ and set(scores) == {"draft", "decode", "verify"}
    assert scores["verify"]["surface"] < 0.9 * scores["verify"]["interpolated"]
    lowest = min(selector.cv_scores_.values())
    # the first (simplest) candidate within one standard error of the lowest CV error
    assert selector.cv_scores_[selector.best_name_] <= lowest * 1.5
    assert clone(model).get_params()["visual_tokens"] == 32
    with pytest.raises(NotFittedError):
        make_regressor().predict(rows)


class _Constant(RegressorMixin, BaseEstimator):
    """Predicts a fixed offset from the mean: a candidate whose CV error we control."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def fit(self, X, y):
        self.mean_ = float(np.mean(y))
        return self

    def predict(self, X):
        return np.full(len(X), self.mean_ + self.offset)


def test_the_one_standard_error_rule_prefers_the_simpler_candidate() -> None:
    """The first candidate within one SE of the lowest CV error wins, not the lowest."""
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 2)), rng.normal(size=40)
    near = [("simple", _Constant(0.2)), ("rich", _Constant(0.0))]  # within one SE
    chosen = CVSelectedRegressor(candidates=near, cv=5).fit(X, y)
    assert chosen.cv_scores_["rich"] < chosen.cv_scores_["simple"]
    assert chosen.best_name_ == "simple"
    far = [("simple", _Constant(3.0)), ("rich", _Constant(0.0))]  # clearly worse
    assert CVSelectedRegressor(candidates=far, cv=5).fit(X, y).best_name_ == "rich"


def test_metrics_by_hand() -> None:
    m = latency_metrics([1.0, 2.0, 4.0, 8.0], [1.1, 2.0, 3.0, 8.0])
    assert m["mape"] == pytest.approx((0.1 + 0 + 0.25 + 0) / 4)
    assert m["within_10pct"] == pytest.approx(0.75)
    assert m["kendall_tau"] == pytest.approx(1.0)
    assert m["rmse"] == pytest.approx(np.sqrt((0.01 + 1.0) / 4))


def test_save_load_and_spec_level_predictions(tmp_path) -> None:
    rows = synthetic_rows(noise=0.01)
    pred = LatencyPredictor.fit(rows, "cpu-test-1t", visual_tokens=32, holdout=0.3)
    pred.save(tmp_path)
    doc = json.loads((tmp_path / "predictor.json").read_text())
    assert {"hardware_id", "regressor", "regressors", "cv_scores", "metrics", "metrics_by_kind",
            "context_range", "context_margin", "holdout", "n_train", "n_holdout",
            "holdout_fraction", "versions"} <= set(doc)
    assert set(doc["metrics"]) == {"mape", "rmse", "within_10pct", "kendall_tau"}
    assert doc["n_holdout"] == len(doc["holdout"]) > 0
    # per kind: every kind of the held-out rows, with its row count
    assert set(doc["metrics_by_kind"]) == {"draft", "decode", "verify"}
    for kind, m in doc["metrics_by_kind"].items():
        assert set(m) == {"mape", "rmse", "within_10pct", "kendall_tau", "n"}
        assert m["n"] == sum(h["kind"] == kind for h in doc["holdout"])
        assert m["mape"] < 0.05 and m["within_10pct"] == 1.0
    assert doc["context_range"] == [48, 240] and doc["context_margin"] == 0.1
    loo = doc["cv_scores"]["verify"]  # the surface predicts only when clearly better
    assert doc["regressors"]["verify"] == (
        "surface" if loo["surface"] <= 0.9 * loo["interpolated"] else "interpolated")
    loaded = LatencyPredictor.load(tmp_path)
    specs = [SubnetSpec(1, 0.25, 2, 3), SubnetSpec(4, 1.0, 9, 7), SubnetSpec(4, 1.0, 1, 1)]
    draft = loaded.draft_ms(specs, 144)
    np.testing.assert_allclose(draft, pred.draft_ms(specs, 144))
    # inject_layer / draft_len: same cost (to the last bits, which BLAS may round per row)
    assert draft[0] < draft[1] and draft[1] == pytest.approx(draft[2], rel=1e-12)
    decode = loaded.target_ms("decode", [1], 144)[0]
    assert decode < loaded.target_ms("verify", [6], 144)[0]
    assert decode == pytest.approx(3.0 + 0.3 + 0.288 + 0.0288, rel=0.05)
    train = pd.read_csv(tmp_path / "predictor_train.csv")
    assert list(train.columns) == list(persist.TRAIN_COLUMNS[:2]) + [
        c for c in persist.TRAIN_COLUMNS[2:] if c not in ("inject_layer", "draft_len")]


@pytest.mark.usefixtures("quick_fits")
def test_the_query_answers_every_kind_the_search_asks_for() -> None:
    pred = LatencyPredictor.fit(synthetic_rows(noise=0.01), "cpu-test-1t", visual_tokens=32,
                                holdout=0.0)
    assert isinstance(pred, LatencyModel) and pred.draft_fields == DRAFT_AXES
    spec = SubnetSpec(4, 1.0, 2, 3)
    assert pred.draft_ms([spec], 144)[0] > 0
    assert pred.target_ms("decode", [1], 144)[0] < pred.target_ms("verify", [6], 144)[0]
    assert [pred.prices(kind) for kind in ("draft", "draft_first", "decode", "verify",
                                           "verify_tree", "cycle")] == [True, False, True, True,
                                                                        False, False]
    with pytest.raises(ValueError, match="draft kind 'decode' is not one of"):
        pred.draft_ms([spec], 144, kind="decode")
    with pytest.raises(ValueError, match="target kind 'prefill' is not one of"):
        pred.target_ms("prefill", [1], 144)
    # a kind never profiled is refused, not guessed from another kind's rows
    with pytest.raises(InputError, match="no verify_tree step was profiled, and it is not "
                                         "guessed from another kind's; rerun `dreams-nas "
                                         "profile`"):
        pred.target_ms("verify_tree", [4], 144)
    with pytest.raises(InputError, match="no draft_first step was profiled"):
        pred.draft_ms([spec], 144, kind="draft_first")
    with pytest.raises(InputError, match="a draft step over a tree level of 3 nodes was not "
                                         r"profiled \(widest timed: 1\)"):
        pred.draft_ms([spec], 144, k=3)
    with pytest.raises(InputError, match=r"a verify step over k=9 positions was not profiled "
                                         r"\(profiled: k 2\.\.8\)"):
        pred.target_ms("verify", [9], 144)


@pytest.mark.usefixtures("quick_fits")
def test_a_folder_of_another_schema_or_sklearn_is_refused_naming_the_refit(tmp_path,
                                                                           monkeypatch) -> None:
    LatencyPredictor.fit(synthetic_rows(noise=0.01), "cpu-test-1t", visual_tokens=32,
                         holdout=0.0).save(tmp_path)
    good = json.loads((tmp_path / "predictor.json").read_text())
    loads = []
    monkeypatch.setattr("skops.io.loads", lambda *a, **kw: loads.append(a))
    for change, why in (({"schema_version": 8}, "has schema 8; this dreams-nas reads schema 9"),
                        ({"versions": {**good["versions"], "scikit-learn": "0.24.2"}},
                         "was fitted with scikit-learn 0.24.2; this is")):
        (tmp_path / "predictor.json").write_text(json.dumps({**good, **change}))
        with pytest.raises(InputError, match=why + r".*rerun `dreams-nas profile --fit-only`"
                           ) as err:
            LatencyPredictor.load(tmp_path)
        assert "\n" not in str(err.value)
    assert loads == []  # the model file is never read
    assert persist.PREDICTOR_SCHEMA_VERSION == 9


def test_missing_predictor_and_too_few_rows(tmp_path) -> None:
    with pytest.raises(MissingArtefactError, match="run `dreams-nas profile` first"):
        LatencyPredictor.load(tmp_path)
    with pytest.raises(InputError, match="only 3 successful measurements"):
        LatencyPredictor.fit(synthetic_rows().head(3), "x")


@pytest.mark.usefixtures("quick_fits")
def test_a_predictor_answers_only_for_its_fingerprint(tmp_path) -> None:
    from dreams_nas.supernet.core.errors import InputError

    fingerprint = {"hardware_id": "cpu-test-1t", "dtype": "bfloat16", "torch": "2.13.0",
                   "architecture_hash": "0123456789abcdef"}
    LatencyPredictor.fit(synthetic_rows(noise=0.01), "cpu-test-1t", visual_tokens=32,
                         holdout=0.0, fingerprint=fingerprint).save(tmp_path)
    assert json.loads((tmp_path / "predictor.json").read_text())["fingerprint"] == fingerprint
    same = LatencyPredictor.load(tmp_path, expect={"dtype": "bfloat16",
                                                   "architecture_hash": "0123456789abcdef"})
    assert same.fingerprint == fingerprint and same.target_ms("decode", [1], 144)[0] > 0
    for key, other in (("dtype", "float32"), ("architecture_hash", "fedcba9876543210")):
        with pytest.raises(InputError, match=f"timed with {key} .* this run has {key} {other}"):
            LatencyPredictor.load(tmp_path, expect={key: other})
        with pytest.raises(InputError, match="dreams-nas profile"):
            same.check_fingerprint({key: other})


@pytest.mark.usefixtures("quick_fits")
def test_missing_or_unreadable_training_rows_are_one_line_naming_the_file(tmp_path) -> None:
    LatencyPredictor.fit(synthetic_rows(noise=0.01), "cpu-test-1t", visual_tokens=32,
                         holdout=0.0).save(tmp_path)
    train = tmp_path / "predictor_train.csv"
    train.unlink()
    with pytest.raises(MissingArtefactError, match=r"no predictor training rows in "
                                                   r".*predictor_train\.csv; rerun `dreams-nas "
                                                   r"profile --fit-only`") as err:
        LatencyPredictor.load(tmp_path)
    assert "\n" not in str(err.value) and "Errno" not in str(err.value)
    for garbage in (b"\xff\xfe\x00garbage", b"", b"kind,k\ndraft,1\n"):
        train.write_bytes(garbage)
        with pytest.raises(InputError, match=r"predictor_train\.csv cannot be read as predictor "
                                             r"training rows \(.+\); rerun `dreams-nas profile "
                                             r"--fit-only`") as err:
            LatencyPredictor.load(tmp_path)
        assert "\n" not in str(err.value)


@pytest.mark.usefixtures("quick_fits")
def test_a_garbage_or_swapped_model_file_is_refused_not_loaded(tmp_path) -> None:
    good = LatencyPredictor.fit(synthetic_rows(noise=0.01), "cpu-test-1t", visual_tokens=32,
                                holdout=0.0)
    good.save(tmp_path / "good")
    LatencyPredictor.fit(synthetic_rows(noise=0.3, seed=5), "cpu-test-1t", visual_tokens=32,
                         holdout=0.0).save(tmp_path / "other")
    model = tmp_path / "good" / "predictor.skops"
    original = model.read_bytes()
    # a valid skops file, not its own; then no skops file at all
    for swap in ((tmp_path / "other" / "predictor.skops").read_bytes(), b"not a skops file"):
        model.write_bytes(swap)
        with pytest.raises(InputError, match="does not match the hash predictor.json records "
                                             r"\(damaged or replaced\); rerun `dreams-nas "
                                             "profile --fit-only`"):
            LatencyPredictor.load(tmp_path / "good")
    model.unlink()
    with pytest.raises(InputError, match=r"cannot read .*predictor\.skops"):
        LatencyPredictor.load(tmp_path / "good")
    model.write_bytes(original)
    assert LatencyPredictor.load(tmp_path / "good").target_ms("decode", [1], 144)[0] == \
        pytest.approx(good.target_ms("decode", [1], 144)[0], rel=1e-9)


@pytest.mark.usefixtures("quick_fits")
def test_a_one_row_holdout_keeps_nan_in_memory_and_writes_null(tmp_path) -> None:
    """`profile --holdout 0.02` printed and saved "kendall_tau": NaN, which is not JSON."""
    pred = LatencyPredictor.fit(synthetic_rows(noise=0.01), "cpu-test-1t", visual_tokens=32,
                                holdout=0.01)  # one draft row of 80; no decode/verify row
    assert pred.n_holdout == 1 and np.isnan(pred.metrics["kendall_tau"])
    pred.save(tmp_path)
    text = (tmp_path / "predictor.json").read_text()
    assert "NaN" not in text

    def refuse(token: str):
        raise ValueError(f"{token} is not JSON")

    doc = json.loads(text, parse_constant=refuse)
    assert doc["metrics"]["kendall_tau"] is None and doc["metrics"]["mape"] >= 0
    loaded = LatencyPredictor.load(tmp_path)
    assert np.isnan(loaded.metrics["kendall_tau"])
    assert loaded.metrics["mape"] == pytest.approx(pred.metrics["mape"])


# --- no pickle is trusted (issue #17) -------------------------------------------------------
class _Touch:
    """Unpickling it touches `path`: what a crafted pickle in a run folder could do."""

    def __init__(self, path) -> None:
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.path),))


@pytest.mark.usefixtures("quick_fits")
def test_a_crafted_pickle_with_a_matching_hash_is_never_unpickled(tmp_path) -> None:
    rows = synthetic_rows(noise=0.01)
    LatencyPredictor.fit(rows, "cpu-test-1t", visual_tokens=32, holdout=0.0).save(tmp_path)
    proof = tmp_path / "proof"
    pickle.loads(pickle.dumps(_Touch(proof)))
    assert proof.exists()  # the crafted object runs its code when unpickled
    # an old-format folder (schema 2: predictor.joblib) whose pickle is crafted, hash and all
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Touch(marker))
    (tmp_path / "predictor.skops").unlink()
    (tmp_path / "predictor.joblib").write_bytes(payload)
    doc = json.loads((tmp_path / "predictor.json").read_text())
    del doc["skops_sha256"]
    doc.update(schema_version=2, joblib_sha256=hashlib.sha256(payload).hexdigest())
    (tmp_path / "predictor.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match="has schema 2; this dreams-nas reads schema 9"):
        LatencyPredictor.load(tmp_path)
    assert not marker.exists()


class _Planted(BaseEstimator):
    """Building it from a skops file (its __setstate__) touches `path`."""

    def __init__(self, path: str = "") -> None:
        self.path = path

    def __setstate__(self, state) -> None:
        pathlib.Path(state["path"]).touch()
        super().__setstate__(state)


@pytest.mark.usefixtures("quick_fits")
def test_a_crafted_skops_file_with_an_untrusted_type_is_refused(tmp_path) -> None:
    import skops.io as sio

    rows = synthetic_rows(noise=0.01)
    LatencyPredictor.fit(rows, "cpu-test-1t", visual_tokens=32, holdout=0.0).save(tmp_path)
    planted = f"{_Planted.__module__}._Planted"
    proof = tmp_path / "proof"
    sio.loads(sio.dumps(_Planted(str(proof))), trusted=[planted])
    assert proof.exists()  # trusted, the planted type runs its code when loaded
    marker = tmp_path / "pwned"
    payload = sio.dumps(_Planted(str(marker)))
    (tmp_path / "predictor.skops").write_bytes(payload)
    doc = json.loads((tmp_path / "predictor.json").read_text())
    doc["skops_sha256"] = hashlib.sha256(payload).hexdigest()  # the crafted folder's own hash
    (tmp_path / "predictor.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match=f"cannot read .*{planted}"):
        LatencyPredictor.load(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("name", [name for name, _ in default_candidates()])
def test_save_then_load_predicts_the_same_for_every_regressor_family(tmp_path, caplog,
                                                                    name) -> None:
    import skops.io as sio

    rows = synthetic_rows(noise=0.01)
    forced = [c for c in default_candidates() if c[0] == name]
    pred = LatencyPredictor.fit(rows, "cpu-test-1t", visual_tokens=32, holdout=0.0,
                                candidates=forced)
    pred.save(tmp_path)
    assert not (tmp_path / "predictor.joblib").exists()
    payload = (tmp_path / "predictor.skops").read_bytes()
    assert set(sio.get_untrusted_types(data=payload)) <= set(SKOPS_TRUSTED_TYPES)
    with caplog.at_level("WARNING", logger="dreams_nas.latency"):
        loaded = LatencyPredictor.load(tmp_path)
    assert caplog.text == ""  # loaded, not refitted
    assert loaded.model.regressors()["draft"] == name
    probe = pd.concat([rows, rows.assign(context_len=rows.context_len + 7),
                       rows.assign(context_len=rows.context_len * 3)])  # beyond the range too
    np.testing.assert_allclose(loaded.predict_rows(probe), pred.predict_rows(probe),
                               rtol=1e-12, atol=0)


# --- elastic depth and MLP width ------------------------------------------------------------
def sized_rows(noise: float = 0.0, seed: int = 0, visual_tokens: int = 32) -> pd.DataFrame:
    """Draft steps of every (heads, visual_keep, depth, mlp) whose cost is a + b * blocks, blocks =
    2 * depth + 1 (each block a fixed cost, the paper's draft has 3), plus the target's steps."""
    rng = np.random.default_rng(seed)
    rows = []
    for ctx in (48, 144, 240):
        for heads, keep, depth, mlp in itertools.product((1, 2, 4), (0.5, 1.0), (1, 2, 3),
                                                         (0.25, 0.5, 1.0)):
            ms = 0.3 + 0.2 * (2 * depth + 1)
            for kind, scale in (("draft", 1.0), ("draft_first", 1.3)):
                rows.append({"kind": kind, "heads": heads, "visual_keep": keep, "depth": depth,
                             "mlp": mlp, "context_len": ctx, "k": 1, "median_ms": scale * ms})
        for k in range(1, 9):
            rows.append({"kind": "decode" if k == 1 else "verify", "heads": np.nan,
                         "visual_keep": np.nan, "depth": np.nan, "mlp": np.nan,
                         "context_len": ctx, "k": k, "median_ms": 3.0 + 0.3 * k + 0.002 * ctx})
    frame = pd.DataFrame(rows)
    frame["median_ms"] *= np.exp(rng.normal(0, noise, len(frame)))
    frame["spec_id"] = ""
    return frame


def test_features_carry_depth_and_mlp() -> None:
    rows = pd.DataFrame({"kind": ["draft", "draft", "draft_first", "draft"],
                         "heads": [2, 2, 2, 2], "visual_keep": [1.0, 1.0, 1.0, 1.0],
                         "depth": [1, 3, 3, 1], "mlp": [1.0, 0.5, 0.5, 1.0],
                         "context_len": 64, "k": [1, 1, 1, 4]})
    feats = DraftFeatures(visual_tokens=32).fit(rows)
    a = feats.transform(rows)
    col = {name: a[:, i] for i, name in enumerate(FEATURE_NAMES)}
    assert list(col["blocks"]) == [3, 7, 7, 3]  # 2 * depth + 1
    assert list(col["mlp"]) == [1.0, 0.5, 0.5, 1.0]
    assert list(col["blocks_x_heads"]) == [6, 14, 14, 6]
    assert list(col["blocks_x_mlp"]) == [3, 3.5, 3.5, 3]
    assert list(col["blocks_x_heads_x_attended"]) == [3 * 2 * 64, 7 * 2 * 64, 7 * 2 * 64,
                                                      3 * 2 * 64]
    # a tree level of 4 nodes: 3 extra nodes, each repeating the per-block work
    assert list(col["extra_nodes"]) == [0, 0, 0, 3]
    assert list(col["extra_x_blocks_x_heads"]) == [0, 0, 0, 3 * 3 * 2]
    assert not np.array_equal(a[0], a[1])  # depth and width are seen
    # rows without the columns (written before them) are the paper's draft: depth 1, mlp 1
    np.testing.assert_array_equal(feats.transform(rows.drop(columns=["depth", "mlp"]))[0], a[0])
    with pytest.raises(ValueError, match="draft rows need numeric depth, mlp and draft_vocab"):
        feats.transform(rows.assign(depth=[np.nan, 3, 3, 1]))


def test_every_feature_is_affine_in_the_context() -> None:
    """No feature squares the context or takes its log: each one's second difference over
    evenly spaced contexts is zero, from far below the profiled range to far above it."""
    rows = pd.DataFrame({"kind": "draft", "heads": 3, "visual_keep": 0.5, "depth": 2,
                         "mlp": 0.5, "context_len": [40, 540, 1040, 1540, 2040], "k": 3})
    a = DraftFeatures(visual_tokens=32).fit(rows).transform(rows)
    np.testing.assert_allclose(np.diff(a, n=2, axis=0), 0.0, atol=1e-6)


def test_an_unprofiled_depth_and_width_is_predicted_from_the_profiled_ones() -> None:
    """A combination never timed (depth 2 with half the MLP) inside the profiled range: the
    per-block features carry the cost, a + b * (2 * depth + 1), to it."""
    rows = sized_rows(noise=0.01)
    unprofiled = ((rows.depth == 2) & (rows.mlp == 0.5)).to_numpy()
    pred = LatencyPredictor.fit(rows[~unprofiled], "cpu-test-1t", visual_tokens=32, holdout=0.0)
    exact = sized_rows()[unprofiled]
    rel = np.abs(pred.predict_rows(exact) / exact.median_ms.to_numpy() - 1)
    assert rel.max() < 0.03
    specs = [SubnetSpec(2, 1.0, 4, 3, depth=d, mlp=0.5) for d in (1, 2, 3)]
    draft = pred.draft_ms(specs, 144)
    np.testing.assert_allclose(draft, [0.3 + 0.2 * (2 * d + 1) for d in (1, 2, 3)], rtol=0.03)
    first = pred.draft_ms(specs, 144, kind="draft_first")
    np.testing.assert_allclose(first / draft, 1.3, rtol=0.03)


@pytest.mark.usefixtures("quick_fits")
def test_a_predictor_refuses_a_depth_or_width_it_never_timed() -> None:
    pred = LatencyPredictor.fit(sized_rows()[lambda f: (f.depth != 3) & (f.mlp != 0.25)],
                                "cpu-test-1t", visual_tokens=32, holdout=0.0)
    assert pred.size_range() == {"depth": (1.0, 2.0), "mlp": (0.5, 1.0),
                                 "draft_vocab": (1.0, 1.0)}
    assert pred.draft_ms([SubnetSpec(2, 1.0, 4, 3, depth=2, mlp=0.75)], 144)[0] > 0  # inside
    with pytest.raises(InputError, match=r"profiled at depth 1\.\.2, not at depth 3; rerun "
                                         r"`dreams-nas profile`"):
        pred.draft_ms([SubnetSpec(2, 1.0, 4, 3, depth=3)], 144)
    with pytest.raises(InputError, match=r"profiled at mlp 0\.5\.\.1, not at mlp 0\.25"):
        pred.draft_ms([SubnetSpec(2, 1.0, 4, 3, mlp=0.25)], 144, kind="draft_first")


# --- the profiled context range ---------------------------------------------------------------
@pytest.mark.usefixtures("quick_fits")
def test_the_predictor_records_its_context_range_and_refuses_a_search_far_outside(
        tmp_path) -> None:
    pred = LatencyPredictor.fit(synthetic_rows(noise=0.01), "cpu-test-1t", visual_tokens=32,
                                holdout=0.0)
    assert pred.contexts() == [48, 96, 144, 192, 240]
    assert pred.context_range() == (48, 240)
    # a tenth of the span (19.2 tokens) either side is allowed: the search's context is an
    # estimate, and the fitted lines are barely less certain there
    assert pred.allowed_contexts() == pytest.approx((28.8, 259.2))
    for inside in (29, 48, 100, 240, 259):
        pred.check_context(inside)
    for outside, grid in ((28, "28 48 96 144 192 240"), (260, "48 96 144 192 240 260"),
                          (2000, "48 96 144 192 240 2000")):
        with pytest.raises(InputError) as err:
            pred.check_context(outside, "the eval prompts' median length plus half the answer")
        message = str(err.value)
        assert message == (
            f"the search runs at context length {outside} (the eval prompts' median length "
            "plus half the answer), outside the contexts the latency profile of cpu-test-1t was "
            "timed at: 48..240 (a search may lie up to 10% of that span outside it: "
            "28.8..259.2); its predictions are not trusted that far from its measurements: "
            f"re-profile with a context grid spanning it, e.g. `dreams-nas profile "
            f"--context-lengths {grid}`")
    # saved and loaded (and refitted) alike: the range is the training rows'
    pred.save(tmp_path)
    doc = json.loads((tmp_path / "predictor.json").read_text())
    assert doc["context_range"] == [48, 240] and doc["context_margin"] == 0.1
    assert LatencyPredictor.load(tmp_path).context_range() == (48, 240)


@pytest.mark.usefixtures("quick_fits")
def test_a_profile_at_one_context_answers_for_that_context_only() -> None:
    rows = synthetic_rows(noise=0.01)
    pred = LatencyPredictor.fit(rows[rows.context_len == 96], "cpu-test-1t", visual_tokens=32,
                                holdout=0.0)
    pred.check_context(96)
    with pytest.raises(InputError, match=r"timed at: 96; its predictions are not trusted .* "
                                         r"--context-lengths 96 97`$"):
        pred.check_context(97)


# --- the draft vocabulary ---------------------------------------------------------------------
def test_features_carry_the_draft_vocabulary_times_the_positions() -> None:
    rows = pd.DataFrame({"kind": ["draft", "draft", "draft_first", "draft"],
                         "heads": 2, "visual_keep": 1.0, "depth": 1, "mlp": 1.0,
                         "draft_vocab": [1.0, 0.25, 0.25, 0.25],
                         "context_len": 64, "k": [1, 1, 1, 4]})
    feats = DraftFeatures(visual_tokens=32).fit(rows)
    a = feats.transform(rows)
    col = {name: a[:, i] for i, name in enumerate(FEATURE_NAMES)}
    # the LM head: its rows (the share) for each position it computes (1 + extra nodes)
    assert list(col["draft_vocab"]) == [1.0, 0.25, 0.25, 0.25]
    assert list(col["extra_x_draft_vocab"]) == [0, 0, 0, 3 * 0.25]
    assert list(col["heads_x_draft_vocab"]) == [2.0, 0.5, 0.5, 0.5]
    assert not np.array_equal(a[0], a[1])  # the share is seen
    # rows without the column (written before it) are at the whole vocabulary
    np.testing.assert_array_equal(feats.transform(rows.drop(columns="draft_vocab"))[0], a[0])
    with pytest.raises(ValueError, match="draft rows need numeric depth, mlp and draft_vocab"):
        feats.transform(rows.assign(draft_vocab=[np.nan, 1.0, 1.0, 1.0]))


def vocab_cost(heads: int, keep: float, depth: int, vocab: float, ctx: int, k: int = 1,
               visual_tokens: int = 32) -> float:
    """A draft step whose LM head costs 0.8 ms per position at the whole vocabulary, linear in
    its share; the blocks as real ones (per-block work, heads over the attended keys)."""
    attended = ctx - visual_tokens * (1 - keep)
    blocks = 2 * depth + 1
    return (0.3 + blocks * (0.05 + 0.02 * heads + 0.00005 * heads * attended)
            + 0.8 * vocab * k + (k - 1) * blocks * 0.03)


def vocab_rows(noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """Draft steps of every (heads, visual_keep, depth, draft_vocab) at three contexts, tree
    levels of the smallest and the largest subnet (as the plan times them), target steps."""
    rng = np.random.default_rng(seed)
    rows = []

    def draft(kind, h, v, d, n, ctx, k=1, scale=1.0):
        rows.append({"kind": kind, "heads": h, "visual_keep": v, "depth": d, "mlp": 1.0,
                     "draft_vocab": n, "context_len": ctx, "k": k,
                     "median_ms": scale * vocab_cost(h, v, d, n, ctx, k)})

    for ctx in (48, 144, 240):
        for h, v, d, n in itertools.product((1, 2, 4), (0.5, 1.0), (1, 2), (0.25, 1.0)):
            draft("draft", h, v, d, n, ctx)
            draft("draft_first", h, v, d, n, ctx, scale=1.3)
        for (h, v, d, n), k in itertools.product(((1, 0.5, 1, 0.25), (4, 1.0, 2, 1.0)), (2, 4)):
            draft("draft", h, v, d, n, ctx, k)
        for k in range(1, 9):
            rows.append({"kind": "decode" if k == 1 else "verify", "heads": np.nan,
                         "visual_keep": np.nan, "depth": np.nan, "mlp": np.nan,
                         "draft_vocab": np.nan, "context_len": ctx, "k": k,
                         "median_ms": 3.0 + 0.3 * k + 0.002 * ctx})
    frame = pd.DataFrame(rows)
    frame["median_ms"] *= np.exp(rng.normal(0, noise, len(frame)))
    frame["spec_id"] = ""
    return frame


def test_a_predictor_fitted_at_both_vocabularies_predicts_each() -> None:
    rows = vocab_rows(noise=0.005)
    # one combination never timed: two heads, two layers a side, a quarter of the vocabulary
    unprofiled = ((rows.heads == 2) & (rows.depth == 2) & (rows.draft_vocab == 0.25)).to_numpy()
    pred = LatencyPredictor.fit(rows[~unprofiled], "cpu-test-1t", visual_tokens=32,
                                holdout=0.0)
    assert pred.size_range()["draft_vocab"] == (0.25, 1.0)
    exact = vocab_rows()
    rel = np.abs(pred.predict_rows(exact) / exact.median_ms.to_numpy() - 1)
    assert rel.max() < 0.03  # the rows fitted on and the unprofiled ones
    specs = [SubnetSpec(2, 1.0, 4, 3, depth=2, draft_vocab=n) for n in (0.25, 1.0)]
    draft = pred.draft_ms(specs, 144)
    np.testing.assert_allclose(draft, [vocab_cost(2, 1.0, 2, n, 144) for n in (0.25, 1.0)],
                               rtol=0.03)
    assert draft[0] < draft[1]  # the smaller head is cheaper
    assert pred.draft_ms(specs[:1], 144, kind="draft_first")[0] == pytest.approx(
        1.3 * draft[0], rel=0.03)
    # a tree level: the head once per node. Timed for the smallest and the largest subnet
    # only (the plan's tree keys), whose every size differs: predicted there, and ranked by
    # the share between them (how the per-node cost splits among the sizes is not identified)
    ends = [SubnetSpec(1, 0.5, 4, 3, draft_vocab=0.25), SubnetSpec(4, 1.0, 4, 3, depth=2)]
    np.testing.assert_allclose(pred.draft_ms(ends, 144, k=4),
                               [vocab_cost(1, 0.5, 1, 0.25, 144, k=4),
                                vocab_cost(4, 1.0, 2, 1.0, 144, k=4)], rtol=0.03)
    level = pred.draft_ms(specs, 144, k=4)
    assert level[0] < level[1] and (level > draft).all()
    # a share between the profiled ones is interpolated; one below them is refused
    assert pred.draft_ms([specs[0].replace(draft_vocab=0.5)], 144)[0] == pytest.approx(
        vocab_cost(2, 1.0, 2, 0.5, 144), rel=0.03)
    with pytest.raises(InputError, match=r"profiled at draft_vocab 0\.25\.\.1, not at "
                                         r"draft_vocab 0\.125; rerun `dreams-nas profile`"):
        pred.draft_ms([specs[0].replace(draft_vocab=0.125)], 144)
