"""Quick latency-predictor fits for tests that check plumbing, not which regressor the
predictor's cross-validation picks: the same five candidates, with 12 trees instead of 150 and
100 in the two ensembles (a fit drops from ~1.6 s to ~0.3 s on 2 cores). The real candidates
are tested in tests/latency/test_predictor.py.

`quick_latency_fits()` patches `dreams_nas.latency.estimators.default_candidates` for its
`with` block (a no-op where it is patched already). In-process calls only: a `dreams-nas`
subprocess fits with the real candidates.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from dreams_nas.latency import estimators

_REAL = estimators.default_candidates


def quick_candidates(random_state: int = 0) -> list[tuple[str, Any]]:
    quick = []
    for name, model in _REAL(random_state):
        if name in ("gradient_boosting", "random_forest"):
            model = model.set_params(n_estimators=12)
        quick.append((name, model))
    return quick


@contextmanager
def quick_latency_fits() -> Iterator[None]:
    if estimators.default_candidates is quick_candidates:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(estimators, "default_candidates", quick_candidates)
        yield
