"""What a saved predictor may hold and be fitted on (latency.model.persist): the model by type
as well as by hash, the rows as positive times (issue #48)."""

from __future__ import annotations

import copy
import hashlib
import json

import numpy as np
import pandas as pd
import pytest
from _support.profiles import VISUAL_TOKENS, linear_profile_rows
from dreams_nas.latency.model import persist, regressor
from dreams_nas.latency.model.predictor import LatencyPredictor
from dreams_nas.supernet.core.errors import InputError
from sklearn.dummy import DummyRegressor
from sklearn.linear_model import LinearRegression, Ridge

REFIT = r"rerun `dreams-nas profile --fit-only`"


@pytest.fixture(scope="module")
def fitted() -> LatencyPredictor:
    return LatencyPredictor.fit(linear_profile_rows([100, 200, 300], noise=0.01), "cpu-test-1t",
                                visual_tokens=VISUAL_TOKENS, holdout=0.0)


def _plant(folder, payload: bytes) -> None:
    """predictor.skops replaced by `payload`, predictor.json's hash updated to match: what
    anyone who can write the run folder can do."""
    (folder / persist.MODEL_FILE).write_bytes(payload)
    meta = json.loads((folder / "predictor.json").read_text())
    meta["skops_sha256"] = hashlib.sha256(payload).hexdigest()
    (folder / "predictor.json").write_text(json.dumps(meta))


def test_a_valid_sklearn_estimator_with_its_hash_updated_is_refused(fitted, tmp_path) -> None:
    """skops trusts every scikit-learn estimator: a DummyRegressor loaded, and every latency
    became 0.5 ms."""
    import skops.io as sio

    fitted.save(tmp_path)
    dummy = DummyRegressor(strategy="constant", constant=0.5).fit(np.zeros((2, 1)), [0.5, 0.5])
    _plant(tmp_path, sio.dumps(dummy))
    with pytest.raises(InputError, match=r"predictor\.skops is not a latency model this "
                                         r"dreams-nas fits \(a sklearn\.dummy\.DummyRegressor, "
                                         rf"not a LatencyRegressor\); {REFIT}") as err:
        LatencyPredictor.load(tmp_path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("swap, message", [
    (lambda m: m.draft_models_["draft"].__setattr__(
        "best_estimator_", LinearRegression().fit(np.eye(3), [1.0, 2.0, 3.0])),
     r"best_estimator_: a sklearn\.linear_model\._base\.LinearRegression, not a RelativeRidge"),
    (lambda m: m.target_models_.__setitem__("verify", DummyRegressor().fit([[0]], [1.0])),
     r"target_models_: a sklearn\.dummy\.DummyRegressor, not a TargetTable"),
    (lambda m: m.target_models_["decode"].__setattr__("extra_", Ridge()),
     r"\['decode'\]\.extra_: a sklearn\.linear_model\._ridge\.Ridge, which make_regressor "
     r"never builds"),
    (lambda m: m.__setattr__("draft_features_", copy.copy(m.draft_features_)) or
     m.draft_features_.__dict__.clear(), r"draft_features_: an unfitted DraftFeatures"),
], ids=["another regressor", "another table", "an estimator added", "an unfitted part"])
def test_a_part_of_another_class_inside_the_model_is_refused(fitted, tmp_path, swap,
                                                             message) -> None:
    import skops.io as sio

    fitted.save(tmp_path)
    model = copy.deepcopy(fitted.model)
    swap(model)
    _plant(tmp_path, sio.dumps(model))  # skops trusts these: only the type check refuses
    with pytest.raises(InputError, match=message + rf".*{REFIT}"):
        LatencyPredictor.load(tmp_path)
    assert regressor.model_problem(model) is not None


def test_a_model_loading_would_refuse_is_never_written(fitted, tmp_path) -> None:
    odd = regressor.make_regressor(VISUAL_TOKENS, candidates=[("ridge", Ridge())], cv=2)
    odd.fit(fitted.train_rows, fitted.train_rows["median_ms"])
    with pytest.raises(InputError, match=r"not one loading accepts \(.*Ridge.*\); fit it with "
                                         "the default candidate regressors"):
        persist.dump_model(odd)
    assert regressor.model_problem(fitted.model) is None


def test_a_row_without_a_positive_time_is_refused_naming_it(fitted, tmp_path) -> None:
    """A negative latency reached the regressor and exited 1 ("internal error: ValueError")."""
    rows = linear_profile_rows([100, 200])
    verify = rows.index[(rows.kind == "verify") & (rows.k == 3)][0]
    for bad, shown in ((-1.5, "-1.5"), (0.0, "0"), (np.nan, "nan")):
        broken = rows.copy()
        broken.loc[verify, "median_ms"] = bad
        with pytest.raises(InputError, match=rf"the verify row at context_len 100, k 3 has "
                                             rf"median_ms {shown}: not a positive time in ms"):
            LatencyPredictor.fit(broken, "cpu-test-1t", holdout=0.0)
    with pytest.raises(InputError, match=r"draft row of h1-v0\.25-l1-g3 .* has p10_ms -2"):
        LatencyPredictor.fit(rows.assign(p10_ms=np.where(rows.index == 0, -2.0, 1.0)),
                             "cpu-test-1t", holdout=0.0, stat="p10_ms")
    # the rows a saved predictor was fitted on: refused on loading
    fitted.save(tmp_path)
    train = pd.read_csv(tmp_path / "predictor_train.csv")
    train.loc[train.kind == "decode", "median_ms"] = -3.0
    train.to_csv(tmp_path / "predictor_train.csv", index=False)
    with pytest.raises(InputError, match=r"predictor_train\.csv cannot be read as predictor "
                                         r"training rows \(the decode row at context_len 100, k 1 "
                                         rf"has median_ms -3: not a positive time in ms\); {REFIT}"
                       ) as err:
        LatencyPredictor.load(tmp_path)
    assert "\n" not in str(err.value)
