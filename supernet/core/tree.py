"""Static token trees: the shape a drafter drafts in one speculative cycle (no torch).

A tree is a branching vector, one entry per level: ``(4, 2, 2, 1, 1)`` drafts the top 4 tokens
at level 1, the top 2 children of each of those at level 2, and so on; ``(1,) * draft_len`` is
the chain of ``draft_len`` tokens. A tree's `draft_len` is its number of levels: the draft runs
one step per level. Its nodes are numbered breadth first: node 0 is the *root* (the newest
token, which the target has not consumed yet), then level 1's nodes, then level 2's, each
level ordered by parent and, under one parent, by the draft's rank (best first). So a
node's parent always has a smaller number, and the verify forward takes the nodes in this
order with each node attending to its ancestors only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from dreams_nas.supernet.core.errors import InputError

_SHAPE_RE = re.compile(r"^\d+(x\d+)*$")
# Widest node count a verify forward takes in one tree (the DREAM-S space stays far below).
MAX_TREE_NODES = 512


@dataclass(frozen=True)
class TokenTree:
    """A static token tree given by its branching vector (children per node at each level)."""

    branching: tuple[int, ...]

    def __post_init__(self) -> None:
        values = self.branching
        if isinstance(values, str | bytes) or not isinstance(values, Sequence):
            raise InputError(f"tree {values!r} must be a list of children per level, "
                             "e.g. [4, 2, 1]")
        out = []
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"tree {list(values)} holds {v!r}; every level needs a whole "
                                 "number of children >= 1, e.g. [4, 2, 1]")
            out.append(int(v))
        if not out:
            raise InputError("a tree needs at least one level, e.g. [4, 2, 1]")
        object.__setattr__(self, "branching", tuple(out))
        if self.nodes > MAX_TREE_NODES:
            raise InputError(f"tree {self.label} has {self.nodes} nodes, over the limit of "
                             f"{MAX_TREE_NODES}; use fewer children per level")

    @classmethod
    def chain(cls, draft_len: int) -> TokenTree:
        return cls((1,) * int(draft_len))

    @classmethod
    def parse(cls, text: str) -> TokenTree:
        """``"4x2x1"`` -> TokenTree((4, 2, 1))."""
        text = str(text).strip().removeprefix("t")
        if not _SHAPE_RE.match(text):
            raise InputError(f"{text!r} is not a tree shape; shapes look like '4x2x1' "
                             "(children per level)")
        return cls(tuple(int(v) for v in text.split("x")))

    @property
    def label(self) -> str:
        """``4x2x1``: the shape as ids and tables write it."""
        return "x".join(str(b) for b in self.branching)

    @property
    def draft_len(self) -> int:
        """Levels: the draft steps one cycle runs (a chain's tokens)."""
        return len(self.branching)

    @property
    def is_chain(self) -> bool:
        return all(b == 1 for b in self.branching)

    @cached_property
    def widths(self) -> tuple[int, ...]:
        """Nodes at each level 1..draft_len: the running products of the branching vector."""
        return tuple(math.prod(self.branching[: d + 1]) for d in range(self.draft_len))

    @property
    def nodes(self) -> int:
        """Drafted nodes (the root excluded): the tokens one verify checks besides the root."""
        return sum(self.widths)

    @cached_property
    def parents(self) -> tuple[int, ...]:
        """parents[i] is node i's parent (-1 for the root), over nodes 0..nodes."""
        parents = [-1]
        level = [0]
        for b in self.branching:
            nxt = []
            for p in level:
                for _ in range(b):
                    nxt.append(len(parents))
                    parents.append(p)
            level = nxt
        return tuple(parents)

    @cached_property
    def levels(self) -> tuple[int, ...]:
        """levels[i]: 0 for the root, d for a node at level d."""
        out = [0]
        for d, w in enumerate(self.widths, start=1):
            out.extend([d] * w)
        return tuple(out)

    @cached_property
    def ranks(self) -> tuple[int, ...]:
        """ranks[i]: which of its parent's children node i is (0 = the draft's best); root 0."""
        out = [0]
        for d, b in enumerate(self.branching):
            out.extend(list(range(b)) * (self.widths[d] // b))
        return tuple(out)

    def nodes_at(self, d: int) -> range:
        """Node numbers at level d (0 is the root)."""
        if d == 0:
            return range(0, 1)
        start = 1 + sum(self.widths[: d - 1])
        return range(start, start + self.widths[d - 1])

    def path(self, node: int) -> list[int]:
        """Nodes from the root to `node`, both included."""
        out = [node]
        while self.parents[out[-1]] >= 0:
            out.append(self.parents[out[-1]])
        return out[::-1]

    def children(self, node: int) -> list[int]:
        """Node numbers of `node`'s children, best rank first."""
        d = self.levels[node]
        if d >= self.draft_len:
            return []
        width = self.branching[d]  # siblings are consecutive, parent-major (breadth first)
        first = self.nodes_at(d + 1).start + (node - self.nodes_at(d).start) * width
        return list(range(first, first + width))


def tree_family(max_nodes: int, max_draft_len: int = 7, widths: Sequence[int] = (2, 3, 4)
                ) -> list[TokenTree]:
    """A family of non-chain trees up to `max_nodes` nodes: for each first-level width w and
    draft_len, the shape that branches w ways at level 1, 2 ways at level 2 when the budget allows,
    then single children (the shapes EAGLE's and Sequoia's trees approach at batch 1: wide
    near the root, chains below)."""
    out: dict[tuple[int, ...], TokenTree] = {}
    for w in widths:
        for draft_len in range(2, max_draft_len + 1):
            for second in (2, 1):
                shape = (w, second) + (1,) * (draft_len - 2)
                tree = TokenTree(shape)
                if tree.nodes <= max_nodes and not tree.is_chain:
                    out.setdefault(shape, tree)
    return sorted(out.values(), key=lambda t: (t.nodes, t.branching))
