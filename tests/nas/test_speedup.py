from __future__ import annotations

import math

import numpy as np
import pytest
from dreams_nas.nas.search.speedup import expected_speedup
from dreams_nas.supernet.core.errors import InputError

# (tau, draft_len, draft_ms, verify_ms, decode_ms, expected)
CASES = [
    # free drafting, verify as cheap as decode: speedup = tau
    (3.0, 4, 0.0, 10.0, 10.0, 3.0),
    # every draft rejected (tau = 1, only the bonus token): a cycle costs more than a step
    (1.0, 1, 2.0, 10.0, 10.0, 10.0 / 12.0),
    # worked example: 4.2 * 20 / (5 * 1.5 + 24) = 84 / 31.5
    (4.2, 5, 1.5, 24.0, 20.0, 84.0 / 31.5),
    # all accepted at draft_len 7 (tau = 8), verify twice a decode step, draft 1 ms
    (8.0, 7, 1.0, 20.0, 10.0, 80.0 / 27.0),
    # a draft as slow as the target: no gain even with tau = draft_len + 1
    (3.0, 2, 10.0, 10.0, 10.0, 1.0),
]


@pytest.mark.parametrize(("tau", "draft_len", "draft", "verify", "decode", "expected"), CASES)
def test_table(tau, draft_len, draft, verify, decode, expected) -> None:
    got = expected_speedup(tau, draft_len, draft, verify, decode)
    assert got.shape == ()
    assert float(got) == pytest.approx(expected, rel=1e-12)


def test_vectorised_matches_elementwise() -> None:
    cols = np.array([c[:5] for c in CASES], dtype=float).T
    got = expected_speedup(*cols)
    assert got.shape == (len(CASES),)
    np.testing.assert_allclose(got, [c[5] for c in CASES], rtol=1e-12)


def test_broadcasts_one_decode_time_over_a_grid() -> None:
    tau = np.array([[1.5], [3.0]])  # (2, 1)
    draft_len = np.array([1, 2, 3])  # (3,)
    got = expected_speedup(tau, draft_len, 1.0, 10.0, 10.0)
    assert got.shape == (2, 3)
    assert got[1, 2] == pytest.approx(3.0 * 10 / (3 + 10))


def test_nan_propagates_per_element() -> None:
    got = expected_speedup([2.0, math.nan], [2, 2], 1.0, 10.0, 10.0)
    assert got[0] == pytest.approx(20.0 / 12.0)
    assert math.isnan(got[1])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"draft_ms": -1.0}, r"draft_ms=-1.0 is negative"),
        ({"verify_ms": -3.0}, r"verify_ms=-3.0 is negative"),
        ({"decode_ms": -2.0}, r"decode_ms=-2.0 is negative"),
        ({"draft_len": 0}, r"draft_len=0.0 must be at least 1"),
        ({"tau": -0.5}, r"tau=-0.5 must be >= 0"),
        ({"draft_ms": 0.0, "verify_ms": 0.0}, r"cycle .* <= 0 ms"),
    ],
)
def test_bad_inputs_name_the_value(kwargs, match) -> None:
    base = {"tau": 2.0, "draft_len": 3, "draft_ms": 1.0, "verify_ms": 10.0, "decode_ms": 9.0}
    with pytest.raises(InputError, match=match):
        expected_speedup(**{**base, **kwargs})


# (tau, draft_len, draft_ms, first_draft_ms, verify_ms, decode_ms, expected): the cycle's first
# draft step runs after the verify (caches cold) and costs first_draft_ms; the rest draft_ms.
FIRST_CASES = [
    # the built-in target's CPU: 0.71 ms hot, 1.31 ms cold; 3.2 * 9 / (3 * 0.71 + 1.31 + 8)
    (3.2, 4, 0.71, 1.31, 8.0, 9.0, 28.8 / (2.13 + 1.31 + 8.0)),
    # draft_len 1: the only draft step is the first one; draft_ms plays no part
    (1.8, 1, 123.0, 2.0, 10.0, 10.0, 18.0 / 12.0),
    # first step as hot as the rest: the formula without the term
    (4.2, 5, 1.5, 1.5, 24.0, 20.0, 84.0 / 31.5),
    # free drafting except the cold first step
    (3.0, 4, 0.0, 2.0, 10.0, 10.0, 30.0 / 12.0),
]


@pytest.mark.parametrize(("tau", "draft_len", "draft", "first", "verify", "decode", "expected"),
                         FIRST_CASES)
def test_table_with_a_cold_first_draft_step(tau, draft_len, draft, first, verify, decode,
                                            expected) -> None:
    got = expected_speedup(tau, draft_len, draft, verify, decode, first_draft_ms=first)
    assert float(got) == pytest.approx(expected, rel=1e-12)
    if first > draft:  # a cold first step only ever lowers the expected speedup
        assert float(got) < float(expected_speedup(tau, draft_len, draft, verify, decode))


def test_first_draft_term_broadcasts_and_is_checked() -> None:
    got = expected_speedup([2.0, 2.0], [1, 3], 1.0, 10.0, 10.0, first_draft_ms=[2.0, 3.0])
    np.testing.assert_allclose(got, [20.0 / 12.0, 20.0 / 15.0], rtol=1e-12)
    with pytest.raises(InputError, match=r"first_draft_ms=-1.0 is negative"):
        expected_speedup(2.0, 3, 1.0, 10.0, 9.0, first_draft_ms=-1.0)


def test_the_cycle_overhead_adds_to_the_cycle_by_exactly_its_milliseconds() -> None:
    """tau * T_decode / (draft steps + T_verify + T_cycle): hand-made numbers."""
    # draft_len 3: 2 hot steps of 1 ms, a first step of 2 ms, verify 10 ms -> 14 ms; + 2 ms = 16
    without = expected_speedup(3.0, 3, 1.0, 10.0, 8.0, first_draft_ms=2.0)
    assert float(without) == pytest.approx(24.0 / 14.0)
    priced = expected_speedup(3.0, 3, 1.0, 10.0, 8.0, first_draft_ms=2.0, cycle_overhead_ms=2.0)
    assert float(priced) == pytest.approx(24.0 / 16.0)
    assert float(without) / float(priced) == pytest.approx(16.0 / 14.0)
    # vectorised, and 0 (the default) changes nothing
    got = expected_speedup([3.0, 3.0], 3, 1.0, 10.0, 8.0, first_draft_ms=2.0,
                           cycle_overhead_ms=[0.0, 2.0])
    assert got.tolist() == pytest.approx([24.0 / 14.0, 24.0 / 16.0])
    with pytest.raises(InputError, match="cycle_overhead_ms=-1.0 is negative"):
        expected_speedup(3.0, 3, 1.0, 10.0, 8.0, cycle_overhead_ms=-1.0)
