"""The nas tests drive whole pipelines (profile, score, search, demo) many times over; what they
check is the plumbing, not which regressor the latency predictor's cross-validation picks.
They fit it with the same five candidates, with fewer trees in the two ensembles: the fit that
dominated every `profile` call here drops from seconds to a fraction of one. The real
candidates are tested in tests/latency/test_predictor.py, which runs before this folder.
"""

from __future__ import annotations

from typing import Any

import pytest


def _quick_candidates(random_state: int = 0) -> list[tuple[str, Any]]:
    from dreams_nas.latency import estimators

    quick = []
    for name, model in estimators.real_default_candidates(random_state):
        if name in ("gradient_boosting", "random_forest"):
            model = model.set_params(n_estimators=12)
        quick.append((name, model))
    return quick


@pytest.fixture(scope="session", autouse=True)
def quick_latency_fits():
    from dreams_nas.latency import estimators

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(estimators, "real_default_candidates", estimators.default_candidates,
                      raising=False)
        patch.setattr(estimators, "default_candidates", _quick_candidates)
        yield
