"""Quick latency-predictor fits for tests that check plumbing, not which regressor the
predictor's cross-validation picks: the same candidates, with any ensemble among them shrunk to
12 trees. The default candidates are linear (`estimators.default_candidates`) and already quick
(a fit takes a fraction of a second on 2 cores), so this matters only while a test passes
ensembles of its own; it is kept so that such tests, and those written when the candidates were
ensembles, stay quick. The real candidates are tested in tests/latency/model/test_predictor.py.

`quick_latency_fits()` patches `dreams_nas.latency.model.draft_regression.default_candidates` for
its `with` block (a no-op where it is patched already). In-process calls only: a `dreams-nas`
subprocess fits with the real candidates.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from dreams_nas.latency.model import draft_regression as estimators

_REAL = estimators.default_candidates


def quick_candidates(random_state: int = 0) -> list[tuple[str, Any]]:
    quick = []
    for name, model in _REAL(random_state):
        if "n_estimators" in model.get_params():
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
