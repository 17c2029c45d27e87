"""The nas tests drive whole pipelines (profile, score, search, demo) many times over; what they
check is the plumbing, not which regressor the latency predictor's cross-validation picks.
They fit it with `_support.fits`' quick candidates (any ensemble shrunk; the default candidates
are linear and quick already). The real candidates are tested in
tests/latency/model/test_predictor.py: the patch holds for one module of this folder at a time
(module scope), so it never reaches a module of another folder that an xdist worker runs after
one of these.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", autouse=True)
def quick_latency_fits():
    from _support.fits import quick_latency_fits

    with quick_latency_fits():
        yield
