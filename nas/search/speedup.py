"""Expected speedup of speculative decoding over plain decoding (pure, vectorised).

Per speculative cycle the draft runs γ = draft_len steps and the target verifies γ + 1 positions
in one forward pass; the cycle yields tau tokens on average (tau counts the bonus token, so
1 <= tau <= γ + 1). Plain decoding yields one token per target step of T_decode, hence

    speedup = tau * T_decode / ((γ - 1) * T_draft_step + T_draft_first + T_verify(γ + 1)
                               + T_cycle(γ + 1))

T_draft_first is the cycle's first draft step, which runs right after the target's verify
pass: that pass evicts the draft's weights from the CPU caches (on a GPU, the launch queue
drains at its synchronisation), so the first step costs more than the later ones, timed back
to back. Likewise T_verify is timed right after a cycle's draft steps, and T_decode back to
back, as each runs in its own loop. Without a first-step time, T_draft_first = T_draft_step:
tau * T_decode / (γ * T_draft_step + T_verify(γ + 1) + T_cycle).

T_cycle is the cycle's own work outside the two models' forward passes -- acceptance, the
target's and the draft's cache rollback (a tree's KV compaction), the next inputs, the loop's
bookkeeping -- profiled as the kinds ``cycle`` / ``cycle_tree`` (`dreams_nas.latency`);
0 when not given (a profile made before those kinds).

All arguments broadcast like numpy arrays; the result is a float64 array (a 0-d array for
scalars). A NaN input gives NaN for that element; a non-positive cycle time is an error.
"""

from __future__ import annotations

import numpy as np
from dreams_nas.supernet.core.errors import InputError
from numpy.typing import ArrayLike, NDArray


def expected_speedup(
    tau: ArrayLike,
    draft_len: ArrayLike,
    draft_ms: ArrayLike,
    verify_ms: ArrayLike,
    decode_ms: ArrayLike,
    first_draft_ms: ArrayLike | None = None,
    hot_draft_ms: ArrayLike | None = None,
    cycle_overhead_ms: ArrayLike = 0.0,
) -> NDArray[np.float64]:
    """Expected speedup for each element.

    tau:       mean tokens accepted per cycle, bonus token included (>= 1).
    draft_len: γ, tokens drafted per cycle (>= 1).
    draft_ms:  one draft step (ms).
    verify_ms: one target pass over draft_len + 1 positions (ms).
    decode_ms: one plain target decoding step (ms).
    first_draft_ms: the cycle's first draft step, right after the verify (ms); None: draft_ms.
    hot_draft_ms: the cycle's draft steps after the first, in all (ms); None: a chain's
                  (draft_len - 1) * draft_ms. A token tree's: one step per level after the root,
                  each over that level's nodes; its verify_ms covers its nodes + 1 positions.
    cycle_overhead_ms: the cycle's work outside the forwards (ms); 0: not priced.
    """
    tau_a = np.asarray(tau, dtype=np.float64)
    length = np.asarray(draft_len, dtype=np.float64)
    t_draft = np.asarray(draft_ms, dtype=np.float64)
    t_verify = np.asarray(verify_ms, dtype=np.float64)
    t_decode = np.asarray(decode_ms, dtype=np.float64)
    _check_nonnegative("draft_ms", t_draft)
    _check_nonnegative("verify_ms", t_verify)
    _check_nonnegative("decode_ms", t_decode)
    if first_draft_ms is not None:
        t_first = np.asarray(first_draft_ms, dtype=np.float64)
        _check_nonnegative("first_draft_ms", t_first)
    if np.any(length < 1):
        raise InputError(
            f"draft_len={_first(length, length < 1)} must be at least 1 (tokens drafted per cycle)"
        )
    if np.any(tau_a < 0):
        raise InputError(f"tau={_first(tau_a, tau_a < 0)} must be >= 0 (tokens per cycle)")
    hot = (length - 1) * t_draft
    if hot_draft_ms is not None:
        hot = np.asarray(hot_draft_ms, dtype=np.float64)
        _check_nonnegative("hot_draft_ms", hot)
    t_cycle = np.asarray(cycle_overhead_ms, dtype=np.float64)
    _check_nonnegative("cycle_overhead_ms", t_cycle)
    cycle_ms = hot + (t_draft if first_draft_ms is None else t_first) + t_verify + t_cycle
    if np.any(cycle_ms <= 0):
        raise InputError(
            "a speculative cycle of (draft_len - 1) * draft_ms + first_draft_ms + verify_ms "
            "+ cycle_overhead_ms <= 0 ms cannot be; the "
            "latency predictor returned non-positive times: refit it with `dreams-nas profile`"
        )
    return np.asarray(tau_a * t_decode / cycle_ms, dtype=np.float64)


def _check_nonnegative(name: str, values: NDArray[np.float64]) -> None:
    bad = values < 0
    if np.any(bad):
        raise InputError(
            f"{name}={_first(values, bad)} is negative; latencies are >= 0 ms (check the "
            "latency predictor's inputs or refit it)"
        )


def _first(values: NDArray[np.float64], mask: NDArray[np.bool_]) -> float:
    return float(np.broadcast_to(values, mask.shape)[mask].flat[0])
