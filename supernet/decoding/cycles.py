"""The speculative loop's bookkeeping replayed from accepted levels (no model): how many
tokens each cycle yields given, per start, how deep the draft agrees with the target's greedy
continuation. Teacher-forced scoring and training's held-out check both replay it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def accepted_levels(ranks: np.ndarray, branching: Sequence[int]) -> np.ndarray:
    """Per start, the levels a tree of `branching` accepts: the leading levels whose target
    token is among the draft's top `branching[j]` -> (n_starts,) int (a chain: branching of
    ones, the leading argmax matches)."""
    b = np.asarray(branching, dtype=np.int64)
    inside = ranks[:, : len(b)] < b[None]
    return np.cumprod(inside, axis=1).sum(axis=1)


def simulate_cycles(matches: np.ndarray, draft_len: int, max_new_tokens: int,
                    eos_index: int | None) -> tuple[list[int], list[int]]:
    """Replay the engine's loop: (cycle lengths = accepted + 1, tokens proposed per cycle)."""
    lengths: list[int] = []
    proposed: list[int] = []
    produced = 1  # y_0 comes from the prefill
    done = eos_index == 0
    while not done and produced < max_new_tokens:
        this_len = min(draft_len, max_new_tokens - produced - 1)  # never past the budget
        last = produced - 1
        n = min(int(matches[last]) if last < len(matches) else 0, this_len)
        lengths.append(n + 1)
        proposed.append(this_len)
        end = last + n + 1  # index of the cycle's bonus token
        if eos_index is not None and last < eos_index <= end:
            lengths[-1] = eos_index - last  # the loop keeps the tokens up to the EOS only
            done = True
            produced = eos_index + 1
        else:
            produced = end + 1
    return lengths, proposed
