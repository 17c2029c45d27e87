"""What to time: the measurement keys and the sampling plan over them.

Four kinds of step are timed, each at several context lengths:

* ``draft``: one step of an extracted subnet. Its cost depends on `heads` and `visual_keep`
  (sliced weights, fewer visual keys), `depth` (decoder layers on each side of the
  cross-attention: a step runs 2 * depth + 1 blocks), `mlp` (the MLP channels kept),
  `draft_vocab` (the LM head computes only the rows of the draft's vocabulary) and the context
  length -- not on `inject_layer` (every target layer has the same width, so the
  cross-attention costs the same) and not on `draft_len` (that is how many steps a cycle
  takes, not what one step costs). A draft measurement therefore stands for every spec sharing
  its (heads, visual_keep, depth, mlp, draft_vocab); it is recorded for the canonical spec with
  the largest inject_layer and draft_len of the space (`canonical_spec`).
* ``draft_first``: the same draft step timed right after a target verify, as the first step
  of every speculative cycle runs: the verify evicts the draft's weights from the CPU caches
  (on a GPU the launch queue drains at the verify's synchronisation), so this step costs more
  than ``draft``, which is timed back to back (hot). A cycle of draft_len steps pays one
  ``draft_first`` and draft_len - 1 ``draft``. Keyed exactly like ``draft`` (a spec, k = 1).
* ``decode``: the target's one-token step (k = 1), timed back to back as plain decoding runs.
* ``verify``: the target's step over k = 2..8 positions, timed right after the draft steps of
  the space's largest subnet (untimed), as every verify of a speculative cycle runs.
* ``verify_tree``: the target's step over a token tree of k - 1 nodes and its root, with the
  tree's attention mask and per-node positions (`TargetAdapter.verify_tree`), prepared like
  ``verify``; one key per tree size of the space, at every context length.
* ``draft`` with k > 1: one draft step over a tree level of k nodes (each node's logits and
  its top children), for every level width > 1 the space's trees draft after the root, timed
  for the largest and the smallest subnet at every context length (the regressor carries the
  width's cost to the other subnets).
* ``cycle``: the speculative cycle's own work outside the two models' forward passes
  (acceptance, the target's and the draft's cache rollback, the next inputs, the loop's
  bookkeeping), per cycle of a chain of draft_len drafts, k = draft_len + 1, for every draft_len
  of the
  space: `supernet.decoding.loop.cycle` timed whole, less the time inside the target's
  verify and the draft's forward passes (`dreams_nas.latency.measure.cycle`).
* ``cycle_tree``: the same for a cycle of a token tree of k - 1 nodes (acceptance along the
  tree, the target's KV compaction), one key per tree size of the space.

The target-like steps (decode, verify, verify_tree, cycle, cycle_tree) are few (contexts x
(8 + the space's draft_lens + its tree sizes)) and always all timed. The draft grid is
(heads x visual_keep x depth x mlp x draft_vocab x context) and is timed whole when it has at
most FULL_GRID_LIMIT points and no budget is given; otherwise the points are a discrete Latin
hypercube over the six axes (each level of each axis used about equally often), always
including the largest subnet (every axis at its maximum) and the smallest (every axis at its
minimum) at every context length, so the regressor interpolates between measured extremes.
Every draft point chosen is timed twice, as ``draft`` and as ``draft_first``: the budget
counts draft *points* (a fraction is a share of the draft grid), so a plan has twice as many
draft keys as the budget says.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from dreams_nas.latency.kinds import DRAFT_AXES, DRAFT_KINDS, KINDS
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.core.spec import SIZE_DEFAULTS, SubnetSpec
from dreams_nas.supernet.core.tree import TokenTree

DEFAULT_VERIFY_KS = tuple(range(2, 9))
FULL_GRID_LIMIT = 256  # draft points timed whole when no budget is given


@dataclass(frozen=True, order=True)
class StepKey:
    """One measurement: a kind of step, the subnet (draft only), the context length and k."""

    kind: str
    context_len: int
    k: int = 1
    spec: SubnetSpec | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"step kind {self.kind!r} is not one of {list(KINDS)}")
        drafted = self.kind in DRAFT_KINDS
        if (self.spec is None) == drafted:
            raise InputError(f"a {self.kind} step {'needs' if drafted else 'takes no'} subnet spec")
        if self.context_len < 1 or self.k < 1:
            raise InputError(
                f"context_len={self.context_len} and k={self.k} must both be at least 1"
            )
        if self.kind in ("decode", "draft_first") and self.k != 1:
            raise InputError(f"a {self.kind} step times one position; k={self.k} must be 1")
        if self.kind in ("verify", "verify_tree", "cycle", "cycle_tree") and self.k < 2:
            raise InputError(f"a {self.kind} step times k >= 2 positions; k={self.k} is not")

    @property
    def spec_id(self) -> str:
        return "" if self.spec is None else self.spec.id

    @property
    def ident(self) -> tuple[str, str, int, int]:
        """The resume key: (kind, spec_id, context_len, k)."""
        return (self.kind, self.spec_id, int(self.context_len), int(self.k))


def canonical_spec(space: SearchSpace, heads: int, visual_keep: float,
                   depth: int = SIZE_DEFAULTS["depth"], mlp: float = SIZE_DEFAULTS["mlp"],
                   draft_vocab: float = SIZE_DEFAULTS["draft_vocab"]) -> SubnetSpec:
    """The spec a draft measurement of (heads, visual_keep, depth, mlp, draft_vocab) is recorded
    under: the space's largest inject_layer and draft_len (neither changes one step's cost).
    depth, mlp and draft_vocab default to the paper's draft size (one layer a side, the whole
    MLP, the whole vocabulary)."""
    return SubnetSpec(heads=heads, visual_keep=visual_keep,
                      inject_layer=max(space.inject_layer), draft_len=max(space.draft_len),
                      depth=depth, mlp=mlp, draft_vocab=draft_vocab)


def draft_axes(space: SearchSpace) -> tuple[tuple[int | float, ...], ...]:
    """The axes a draft step's cost depends on, in grid order (`DRAFT_AXES`: heads,
    visual_keep, depth, mlp, draft_vocab), each sorted ascending (the first level is the
    smallest, the last the largest)."""
    return tuple(tuple(sorted(getattr(space, name))) for name in DRAFT_AXES)


def parse_budget(budget: float | int | str | None, option: str = "--budget") -> float | None:
    """The budget as a number (None: the whole grid), refused unless it is a positive count or
    a fraction in (0, 1); `option` is the flag that gave it (the demo's is `--profile-budget`),
    named in the message. Needs no grid, so a command can check it before any slow work."""
    if budget is None:
        return None
    try:
        value = float(budget)
    except (TypeError, ValueError):
        raise InputError(
            f"{option} {budget!r} is not a number; give a count (e.g. 40) or a fraction "
            "(e.g. 0.3)"
        ) from None
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{option} {budget!r} must be a positive count or a fraction in (0, 1)")
    if value >= 1 and value != int(value):
        raise InputError(f"{option} {budget!r} above 1 must be a whole count of measurements")
    return value


def resolve_budget(budget: float | int | str | None, grid_size: int,
                   option: str = "--budget") -> int:
    """``None`` -> the whole grid (up to FULL_GRID_LIMIT); an int N -> N points; a fraction in
    (0, 1) -> that share of the grid (rounded up). `option` names the flag in messages."""
    value = parse_budget(budget, option)
    if value is None:
        return min(grid_size, FULL_GRID_LIMIT)
    if value < 1:
        return max(1, math.ceil(value * grid_size))
    return min(int(value), grid_size)


def latin_hypercube_grid(
    levels: Sequence[int], n: int, rng: np.random.Generator, taken: Iterable[tuple[int, ...]] = ()
) -> list[tuple[int, ...]]:
    """`n` distinct new grid points (index tuples) over axes with `levels[d]` levels each.

    A discrete Latin hypercube: on every axis each level is used as equally often as possible
    over the taken points and the new ones together (the taken points' use is counted first),
    the axes' level sequences are shuffled independently and zipped; collisions are repaired by
    swapping levels between new points (which keeps every axis balanced), and a point still
    colliding moves to the nearest free grid point (ties broken at random).
    """
    grid = [tuple(int(v) for v in p) for p in np.ndindex(*levels)]
    chosen = {tuple(int(v) for v in p) for p in taken}
    if n + len(chosen) > len(grid):
        raise InputError(f"cannot choose {n} more points from a grid of {len(grid)} "
                         f"({len(chosen)} taken)")
    if n == 0:
        return []
    total = n + len(chosen)
    columns = []
    for axis, count in enumerate(levels):
        used = np.bincount([p[axis] for p in chosen], minlength=count)
        quota = np.full(count, total // count)
        quota[rng.choice(count, size=total % count, replace=False)] += 1
        need = np.maximum(quota - used, 0)
        while need.sum() > n:  # anchors overfilled some level: trim the most-needed ones
            need[rng.choice(np.flatnonzero(need == need.max()))] -= 1
        while need.sum() < n:
            load = used + need
            need[rng.choice(np.flatnonzero(load == load.min()))] += 1
        columns.append(rng.permutation(np.repeat(np.arange(count), need)))
    points = _repair_collisions(np.stack(columns, axis=1), chosen, rng)
    scale = np.array([max(L - 1, 1) for L in levels], dtype=float)
    out: list[tuple[int, ...]] = []
    for p in points:
        key = tuple(int(v) for v in p)
        if key in chosen:
            free = np.array([g for g in grid if g not in chosen])
            dist = np.linalg.norm((free - p) / scale, axis=1)
            best = np.flatnonzero(dist <= dist.min() + 1e-12)
            key = tuple(int(v) for v in free[rng.choice(best)])
        chosen.add(key)
        out.append(key)
    return out


def _collisions(points: np.ndarray, taken: set[tuple[int, ...]]) -> int:
    keys = [tuple(int(v) for v in p) for p in points]
    return len(keys) - len(set(keys)) + sum(k in taken for k in keys)


def _repair_collisions(points: np.ndarray, taken: set[tuple[int, ...]], rng: np.random.Generator,
                       tries: int = 2000) -> np.ndarray:
    """Swap one axis' levels between two points while that lowers the number of collisions."""
    points = points.copy()
    bad = _collisions(points, taken)
    for _ in range(tries):
        if bad == 0 or len(points) < 2:
            break
        i, j = rng.choice(len(points), size=2, replace=False)
        axis = rng.integers(points.shape[1])
        points[[i, j], axis] = points[[j, i], axis]
        now = _collisions(points, taken)
        if now <= bad:
            bad = now
        else:
            points[[i, j], axis] = points[[j, i], axis]
    return points


def build_plan(
    space: SearchSpace,
    context_lengths: Sequence[int],
    *,
    budget: float | int | str | None = None,
    verify_ks: Sequence[int] = DEFAULT_VERIFY_KS,
    seed: int = 0,
    budget_option: str = "--budget",
) -> list[StepKey]:
    """Every key to time: the target's decode and verify steps and a ``cycle`` per draft_len of
    the space at every context length, and the draft points the budget allows, each as a
    ``draft`` and a ``draft_first`` key (see the module docstring). `budget_option`: the
    flag that gave the budget, named in messages."""
    contexts = sorted({int(c) for c in context_lengths})
    if not contexts or contexts[0] < 1:
        raise InputError(f"--context-lengths {list(context_lengths)} must be positive token counts")
    bad_k = [k for k in verify_ks if k < 2]
    if bad_k:
        raise InputError(f"verify k values {bad_k} must be at least 2 (k=1 is the decode step)")
    axes = draft_axes(space)
    levels = (*(len(a) for a in axes), len(contexts))
    grid_size = math.prod(levels)
    n = resolve_budget(budget, grid_size, budget_option)
    bottom, top = (0,) * len(axes), tuple(len(a) - 1 for a in axes)
    anchors = sorted({(*bottom, c) for c in range(len(contexts))}
                     | {(*top, c) for c in range(len(contexts))})
    if n < len(anchors) and n < grid_size:
        raise InputError(
            f"{budget_option} {budget} gives {n} draft measurements, fewer than the {len(anchors)} "
            f"that the largest and smallest subnets at {len(contexts)} context lengths need; "
            f"give at least {len(anchors)}"
        )
    if n >= grid_size:
        picks = [tuple(int(v) for v in p) for p in np.ndindex(*levels)]
    else:
        rng = np.random.default_rng(seed)
        picks = anchors + latin_hypercube_grid(levels, n - len(anchors), rng, taken=anchors)
    keys = [
        StepKey(kind, contexts[p[-1]], 1,
                canonical_spec(space, *(axis[i] for axis, i in zip(axes, p[:-1], strict=True))))
        for kind in DRAFT_KINDS for p in sorted(picks)
    ]
    for c in contexts:
        keys.append(StepKey("decode", c, 1))
        keys.extend(StepKey("verify", c, int(k)) for k in sorted(set(verify_ks)))
        keys.extend(StepKey("cycle", c, int(g) + 1) for g in sorted(set(space.draft_len)))
    keys.extend(tree_keys(space, contexts))
    return keys


def tree_sizes(space: SearchSpace) -> tuple[list[int], list[int]]:
    """What the space's trees cost beyond chains: (the verify widths, nodes + 1 of each tree;
    the draft level widths > 1 drafted after the root)."""
    trees = [TokenTree(t) for t in space.trees]
    verify = sorted({t.nodes + 1 for t in trees})
    levels = sorted({w for t in trees for w in t.widths[:-1] if w > 1})
    return verify, levels


def tree_keys(space: SearchSpace, contexts: Sequence[int]) -> list[StepKey]:
    """The ``verify_tree`` and ``cycle_tree`` keys (every tree size, every context) and the
    wide ``draft`` keys (every level width, the largest and smallest subnet -- every draft axis
    at its maximum, at its minimum -- every context) of the space's trees."""
    verify, levels = tree_sizes(space)
    axes = draft_axes(space)
    ends = sorted({tuple(a[0] for a in axes), tuple(a[-1] for a in axes)})
    keys = [StepKey("draft", c, w, canonical_spec(space, *end))
            for end in ends for c in contexts for w in levels]
    keys += [StepKey("verify_tree", c, k) for c in contexts for k in verify]
    keys += [StepKey("cycle_tree", c, k) for c in contexts for k in verify]
    return keys
