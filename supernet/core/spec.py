"""What a subnet is: `SubnetSpec`, a frozen, hashable value with a readable id and a JSON form."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.tree import TokenTree

SPEC_SCHEMA_VERSION = 1

_ID_RE = re.compile(r"^h(\d+)-v(\d+(?:\.\d+)?)-l(\d+)(?:-d(\d+))?(?:-m(\d+(?:\.\d+)?))?"
                    r"(?:-n(\d+(?:\.\d+)?))?-(?:g(\d+)|t(\d+(?:x\d+)*))$")


@dataclass(frozen=True, order=True)
class SubnetSpec:
    """One draft subnet of the supernet.

    heads:        attention heads kept in every draft attention layer (a prefix of the
                  importance-sorted heads).
    visual_keep:  fraction of visual tokens the draft attends to, in (0, 1].
    inject_layer: index into the target's hidden states (0 = embeddings, L = last layer)
                  whose features the draft's cross-attention reads.
    draft_len:    tokens drafted per speculative cycle (γ); for a tree, its levels.
    tree:         () for a chain of `draft_len` tokens, else the token tree's branching vector
                  (children per level, e.g. ``(4, 2, 1)``; `supernet.core.tree`). A vector of
                  ones is the chain it describes and is stored as one (``tree=()``).
    depth:        decoder layers on each side of the cross-attention (the first `depth` of the
                  supernet's stack before it, the last `depth` of the stack after it); 1 is
                  the paper's draft (decoder, cross-attention, decoder).
    mlp:          share of every MLP's intermediate channels kept, in (0, 1] (a prefix of the
                  importance-sorted channels, as heads are).
    draft_vocab:  share of the target's vocabulary the draft predicts over, in (0, 1]: the
                  most frequent tokens of the self-distillation answers (FR-Spec / EAGLE-3),
                  mapped back to target ids; the target verifies, so output is unchanged.
    The id names depth, mlp and draft_vocab only where they differ from 1, 1.0 and 1.0, so the
    paper's draft keeps its id (``h4-v0.50-l12-g5``; ``h4-v0.50-l12-d2-m0.50-n0.25-g5``
    otherwise).
    """

    heads: int
    visual_keep: float
    inject_layer: int
    draft_len: int
    tree: tuple[int, ...] = ()
    depth: int = 1
    mlp: float = 1.0
    draft_vocab: float = 1.0

    def __post_init__(self) -> None:
        given = tree_field(self.tree, keep_chain=True)
        if given and self.draft_len != len(given):
            raise InputError(f"SubnetSpec.draft_len={self.draft_len} must equal the levels of its "
                             f"tree {TokenTree(given).label} ({len(given)})")
        object.__setattr__(self, "tree", () if TokenTree(given or (1,)).is_chain else given)
        for name in ("heads", "inject_layer", "draft_len", "depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise InputError(f"SubnetSpec.{name}={value!r} must be an integer")
            object.__setattr__(self, name, int(value))
        for name in ("visual_keep", "mlp", "draft_vocab"):
            share = getattr(self, name)
            if isinstance(share, bool) or not isinstance(share,
                                                         int | float | np.floating | np.integer):
                raise InputError(f"SubnetSpec.{name}={share!r} must be a number in (0, 1]")
            object.__setattr__(self, name, float(share))
            if not (0.0 < float(share) <= 1.0) or math.isnan(float(share)):
                raise InputError(f"SubnetSpec.{name}={share} must be in (0, 1]")
        if self.heads < 1:
            raise InputError(f"SubnetSpec.heads={self.heads} must be at least 1")
        if self.inject_layer < 0:
            raise InputError(f"SubnetSpec.inject_layer={self.inject_layer} must be >= 0")
        if self.draft_len < 1:
            raise InputError(f"SubnetSpec.draft_len={self.draft_len} must be at least 1")
        if self.depth < 1:
            raise InputError(f"SubnetSpec.depth={self.depth} must be at least 1")

    @property
    def id(self) -> str:
        """Stable readable id, e.g. ``h4-v0.50-l12-g5`` (a chain), ``h4-v0.50-l12-t4x2x1``
        (a tree); ``h4-v0.50-l12-d2-m0.50-g5`` with two layers a side and half the MLP."""
        return f"h{self.heads}-v{self.visual_keep:.2f}-l{self.inject_layer}{self.size_id}-" \
               f"{self.shape_id}"

    @property
    def size_id(self) -> str:
        """The id's size part: ``""`` for depth 1, the whole MLP and the whole vocabulary,
        else ``-d2``, ``-m0.50``, ``-n0.25`` or several."""
        return ((f"-d{self.depth}" if self.depth != 1 else "")
                + (f"-m{self.mlp:.2f}" if self.mlp != 1.0 else "")
                + (f"-n{self.draft_vocab:.2f}" if self.draft_vocab != 1.0 else ""))

    @property
    def shape_id(self) -> str:
        """The id's last part: ``g5`` for a chain, ``t4x2x1`` for a tree."""
        return f"t{self.tree_label}" if self.tree else f"g{self.draft_len}"

    @classmethod
    def from_id(cls, text: str) -> SubnetSpec:
        match = _ID_RE.match(text.strip())
        if match is None:
            raise InputError(
                f"{text!r} is not a subnet id; ids look like 'h4-v0.50-l12-g5' "
                "(heads, visual_keep, inject_layer, draft_len), 'h4-v0.50-l12-t4x2x1' (a tree) or "
                "'h4-v0.50-l12-d2-m0.50-n0.25-g5' (depth 2, half the MLP, a quarter of the "
                "vocabulary)"
            )
        h, v, lyr, depth, mlp, vocab, g, tree = match.groups()
        shape = TokenTree.parse(tree).branching if tree else ()
        return cls(heads=int(h), visual_keep=float(v), inject_layer=int(lyr),
                   draft_len=len(shape) if tree else int(g), tree=shape,
                   depth=int(depth) if depth else 1, mlp=float(mlp) if mlp else 1.0,
                   draft_vocab=float(vocab) if vocab else 1.0)

    @property
    def shape(self) -> TokenTree:
        """What one cycle drafts: the tree, or the chain of `draft_len` tokens."""
        return TokenTree(self.tree) if self.tree else TokenTree.chain(self.draft_len)

    @property
    def is_tree(self) -> bool:
        return bool(self.tree)

    @property
    def tree_label(self) -> str:
        """``4x2x1`` for a tree, ``""`` for a chain (the `tree` column of tables)."""
        return TokenTree(self.tree).label if self.tree else ""

    @property
    def arch(self) -> SubnetSpec:
        """The architecture (heads, visual_keep, inject_layer, depth, mlp, draft_vocab) --
        everything but the draft shape -- as the chain of one token: the unit teacher-forced
        scoring rolls out once for every draft length and tree."""
        return SubnetSpec(self.heads, self.visual_keep, self.inject_layer, 1,
                          depth=self.depth, mlp=self.mlp, draft_vocab=self.draft_vocab)

    def replace(self, **changes: Any) -> SubnetSpec:
        """A copy with `changes`. A new `draft_len` alone makes a chain of that length; a new
        `tree` alone takes its levels as `draft_len`."""
        data = {**self.to_fields(), "tree": self.tree}
        if "draft_len" in changes and "tree" not in changes:
            data["tree"] = ()
        if "tree" in changes and "draft_len" not in changes:
            tree = tree_field(changes["tree"], keep_chain=True)
            changes = {**changes, "tree": tree,
                       "draft_len": len(tree) if tree else self.draft_len}
        return SubnetSpec(**{**data, **changes})

    def to_fields(self) -> dict[str, Any]:
        """The fields as table rows write them (`tree` as its label, ``""`` for a chain)."""
        out = {name: getattr(self, name) for name in SPEC_FIELDS}
        out["tree"] = self.tree_label
        for name in SIZE_DEFAULTS:
            out[name] = getattr(self, name)
        return out

    def to_dict(self) -> dict[str, Any]:
        out = {"schema_version": SPEC_SCHEMA_VERSION, **self.to_fields()}
        if not self.tree:
            del out["tree"]  # a chain has none
        for name, default in SIZE_DEFAULTS.items():  # written where they differ from 1, 1.0
            if out[name] == default:
                del out[name]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SubnetSpec:
        version = data.get("schema_version", SPEC_SCHEMA_VERSION)
        if version != SPEC_SCHEMA_VERSION:
            raise InputError(
                f"subnet spec schema_version={version!r} is not supported (this dreams-nas "
                f"reads version {SPEC_SCHEMA_VERSION}); export the spec again with this version "
                "(`dreams-nas search`)"
            )
        names = list(SPEC_FIELDS)
        missing = [n for n in names if n not in data]
        if missing:
            raise InputError(f"subnet spec is missing field(s) {missing}; a spec needs {names}")
        unknown = sorted(set(data) - set(names) - {"schema_version", "id", "tree", *SIZE_DEFAULTS})
        if unknown:
            optional = ", ".join(map(repr, ("tree", *SIZE_DEFAULTS)))
            raise InputError(f"subnet spec has unknown field(s) {unknown}; a spec has "
                             f"{names} and optionally {optional}")
        sizes = {n: default if data.get(n) in (None, "") else data[n]
                 for n, default in SIZE_DEFAULTS.items()}
        return cls(**{n: data[n] for n in names}, tree=data.get("tree") or (), **sizes)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SubnetSpec:
        return cls.from_dict(json.loads(text))


# The numeric fields every spec has; `tree` and the sizes are optional (SIZE_DEFAULTS).
SPEC_FIELDS: tuple[str, ...] = ("heads", "visual_keep", "inject_layer", "draft_len")
# Elastic depth, MLP width and draft vocabulary of the paper's draft: a spec.json or a search
# space writes a size only where it differs from these, and reads an absent one as these.
SIZE_DEFAULTS: dict[str, Any] = {"depth": 1, "mlp": 1.0, "draft_vocab": 1.0}
# The architecture's fields (all but the draft shape), in enumeration order.
ARCH_FIELDS: tuple[str, ...] = ("heads", "visual_keep", "inject_layer", "depth", "mlp",
                                "draft_vocab")


def tree_field(value: Any, keep_chain: bool = False) -> tuple[int, ...]:
    """A spec's `tree` from a tuple/list, a label (``"4x2x1"``, ``""``) or a `TokenTree`;
    () for a chain (or, with `keep_chain`, a chain's vector of ones as given)."""
    if isinstance(value, TokenTree):
        tree = value
    elif value is None or (isinstance(value, str | tuple | list) and len(value) == 0):
        return ()
    elif isinstance(value, str):
        tree = TokenTree.parse(value)
    elif isinstance(value, tuple | list):
        tree = TokenTree(tuple(int(v) if isinstance(v, np.integer) else v for v in value))
    else:
        raise InputError(f"SubnetSpec.tree={value!r} must be a list of children per level "
                         "such as [4, 2, 1], or a label such as '4x2x1'")
    return () if tree.is_chain and not keep_chain else tree.branching
