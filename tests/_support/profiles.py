"""Synthetic profile rows of every step kind whose costs are linear in the context, as real
step costs are (a fixed part plus attention over the keys the step reads): what the latency
predictor's extrapolation, validation and per-kind metrics are tested on (no model is timed)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

VISUAL_TOKENS = 32
# The draft grid: heads x visual_keep x depth (MLP whole); the tree levels' widths are timed
# for the smallest and the largest subnet, as the profile plan does.
HEADS, KEEPS, DEPTHS = (1, 2, 4), (0.25, 0.5, 1.0), (1, 2)
LEVEL_WIDTHS = (2, 4)
VERIFY_KS = tuple(range(2, 9))
TREE_KS = (4, 7)
CYCLE_KS = (2, 4, 6)  # the speculative cycle's own work, per draft_len + 1 of the space's chains


def linear_cost(kind: str, context_len: float, k: int = 1, heads: int = 0,
                visual_keep: float = 1.0, depth: int = 1, mlp: float = 1.0) -> float:
    """Milliseconds of one step: affine in the context for every kind."""
    attended = context_len - VISUAL_TOKENS * (1 - visual_keep)
    blocks = 2 * depth + 1
    if kind in ("draft", "draft_first"):
        step = (0.3 + blocks * (0.06 + 0.02 * heads + 0.04 * mlp + 0.00004 * heads * attended)
                + (k - 1) * blocks * (0.01 + 0.004 * heads + 0.00001 * heads * attended))
        return 1.25 * step + 0.08 if kind == "draft_first" else step
    if kind == "decode":
        return 3.0 + 0.004 * context_len
    if kind == "verify":
        return 3.0 + 0.25 * k + 0.004 * context_len + 0.0003 * k * context_len
    if kind == "verify_tree":
        return 3.1 + 0.27 * k + 0.004 * context_len + 0.00035 * k * context_len
    if kind == "cycle":
        return 0.4 + 0.05 * k + 0.0002 * context_len
    if kind == "cycle_tree":
        return 0.5 + 0.06 * k + 0.0002 * context_len
    raise ValueError(kind)


def linear_profile_rows(contexts: Sequence[int], noise: float = 0.0, seed: int = 0
                        ) -> pd.DataFrame:
    """Every kind at every context of `contexts`, each cost times exp(N(0, noise))."""
    rng = np.random.default_rng(seed)
    nan = float("nan")
    rows = []

    def draft(kind, ctx, heads, keep, depth, k=1):
        rows.append({"kind": kind, "spec_id": f"h{heads}-v{keep:.2f}-l1-g3", "heads": heads,
                     "visual_keep": keep, "depth": depth, "mlp": 1.0, "context_len": ctx,
                     "k": k, "median_ms": linear_cost(kind, ctx, k, heads, keep, depth)})

    def target(kind, ctx, k):
        rows.append({"kind": kind, "spec_id": "", "heads": nan, "visual_keep": nan,
                     "depth": nan, "mlp": nan, "context_len": ctx, "k": k,
                     "median_ms": linear_cost(kind, ctx, k)})

    for ctx in contexts:
        for heads in HEADS:
            for keep in KEEPS:
                for depth in DEPTHS:
                    draft("draft", ctx, heads, keep, depth)
                    draft("draft_first", ctx, heads, keep, depth)
        for heads, keep, depth in ((HEADS[0], KEEPS[0], DEPTHS[0]),
                                   (HEADS[-1], KEEPS[-1], DEPTHS[-1])):
            for width in LEVEL_WIDTHS:
                draft("draft", ctx, heads, keep, depth, k=width)
        target("decode", ctx, 1)
        for k in VERIFY_KS:
            target("verify", ctx, k)
        for k in TREE_KS:
            target("verify_tree", ctx, k)
            target("cycle_tree", ctx, k)
        for k in CYCLE_KS:
            target("cycle", ctx, k)
    frame = pd.DataFrame(rows)
    frame["median_ms"] *= np.exp(rng.normal(0.0, noise, len(frame)))
    return frame
