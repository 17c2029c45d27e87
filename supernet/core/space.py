"""Which subnets a search may pick: `SearchSpace`, the allowed values of each `SubnetSpec` field."""

from __future__ import annotations

import itertools
import json
import math
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.spec import (
    ARCH_FIELDS,
    SIZE_DEFAULTS,
    SPEC_FIELDS,
    SubnetSpec,
    tree_field,
)
from dreams_nas.supernet.core.tree import TokenTree, tree_family

SPACE_SCHEMA_VERSION = 1

DEFAULT_VISUAL_KEEP = (0.25, 0.5, 0.75, 1.0)
DEFAULT_DRAFT_LENS = tuple(range(1, 8))
# Elastic depth and MLP width of the default space: decoder layers on each side of the
# cross-attention (a prefix of the supernet's stacks), and the MLP's share of channels.
DEFAULT_DEPTHS = (1, 2, 3)
DEFAULT_MLP = (0.25, 0.5, 1.0)
# Draft vocabulary (FR-Spec / EAGLE-3): where the target's vocabulary has at least
# LARGE_VOCAB tokens, the default space also offers a draft whose LM head predicts over the
# most frequent quarter of it (8,000 of LLaVA-1.5's 32,000; 38,000 of Qwen2-VL's 152,000).
DEFAULT_DRAFT_VOCAB = (0.25, 1.0)
LARGE_VOCAB = 16_000
# Token trees of the default space: the family of `tree_family` up to 12 nodes (14 shapes, wide
# near the root, chains below, at most 6 levels), beside the chains of DEFAULT_DRAFT_LENS.
DEFAULT_TREE_NODES = 12


def default_draft_vocab(vocab_size: int) -> tuple[float, ...]:
    """The draft vocabulary shares a supernet of a target with `vocab_size` tokens offers by
    default: DEFAULT_DRAFT_VOCAB from LARGE_VOCAB tokens up, else the whole vocabulary only."""
    return DEFAULT_DRAFT_VOCAB if int(vocab_size) >= LARGE_VOCAB else (1.0,)


def vocab_rows(vocab_size: int, share: float) -> int:
    """Tokens a draft of vocabulary share `share` predicts over: ceil(share * vocab_size),
    within 1..vocab_size."""
    return max(1, min(int(vocab_size), math.ceil(share * int(vocab_size) - 1e-9)))


def _as_values(name: str, values: Sequence[Any], kind: type) -> tuple[Any, ...]:
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray):
        raise InputError(f"search space field '{name}' must be a list of values, got {values!r}")
    out: list[Any] = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
            raise InputError(f"search space field '{name}' holds {v!r}, which is not a number")
        if kind is int and float(v) != int(v):
            raise InputError(f"search space field '{name}' holds {v!r}; it needs whole numbers")
        out.append(kind(v))
    if not out:
        raise InputError(f"search space field '{name}' is empty; give at least one value")
    if len(set(out)) != len(out):
        raise InputError(f"search space field '{name}' repeats a value in {out}; list each once")
    return tuple(sorted(out))


def _as_trees(values: Any) -> tuple[tuple[int, ...], ...]:
    """The space's trees from branching vectors or labels, each a real tree (chains belong in
    `draft_len`), listed once, in the order given."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise InputError(f"search space field 'trees' must be a list of trees such as "
                         f"['4x2x1', '3x1'], got {values!r}")
    out: list[tuple[int, ...]] = []
    for value in values:
        tree = tree_field(value, keep_chain=True)
        if not tree or TokenTree(tree).is_chain:
            raise InputError(f"search space field 'trees' holds the chain {value!r}; list "
                             "chains under 'draft_len' and only branching shapes under 'trees'")
        if tree in out:
            raise InputError(f"search space field 'trees' repeats {TokenTree(tree).label}; "
                             "list each once")
        out.append(tree)
    return tuple(out)


@dataclass(frozen=True)
class SearchSpace:
    """The allowed values of each `SubnetSpec` field. The space is the product of the
    architectures (heads x visual_keep x inject_layer x depth x mlp) with the draft shapes: a
    chain for each `draft_len`, then each tree of `trees` (branching vectors; none by default).
    depth and mlp default to the paper's single draft size (1 layer a side, the whole MLP)."""

    heads: tuple[int, ...]
    visual_keep: tuple[float, ...]
    inject_layer: tuple[int, ...]
    draft_len: tuple[int, ...]
    trees: tuple[tuple[int, ...], ...] = ()
    depth: tuple[int, ...] = (1,)
    mlp: tuple[float, ...] = (1.0,)
    draft_vocab: tuple[float, ...] = (1.0,)

    def __post_init__(self) -> None:
        kinds = {"heads": int, "visual_keep": float, "inject_layer": int, "draft_len": int,
                 "depth": int, "mlp": float, "draft_vocab": float}
        for name, kind in kinds.items():
            object.__setattr__(self, name, _as_values(name, getattr(self, name), kind))
        rules = {
            "heads": (lambda v: v >= 1, "at least 1"),
            "visual_keep": (lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
            "inject_layer": (lambda v: v >= 0, ">= 0"),
            "draft_len": (lambda v: v >= 1, "at least 1"),
            "depth": (lambda v: v >= 1, "at least 1"),
            "mlp": (lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
            "draft_vocab": (lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
        }
        for name, (ok, rule) in rules.items():
            bad = [v for v in getattr(self, name) if not ok(v)]
            if bad:
                raise InputError(f"search space field '{name}' holds {bad}; values must be {rule}")
        object.__setattr__(self, "trees", _as_trees(self.trees))

    # --- size and order -------------------------------------------------------------
    @property
    def shapes(self) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """Every draft shape as (draft_len, tree): the chains, then the trees."""
        return (tuple((g, ()) for g in self.draft_len)
                + tuple((len(t), t) for t in self.trees))

    @property
    def architectures(self) -> Iterator[SubnetSpec]:
        """Every architecture (`SubnetSpec.arch`: all fields but the draft shape), in
        enumeration order."""
        for h, v, lyr, d, m, n in itertools.product(*(getattr(self, f) for f in ARCH_FIELDS)):
            yield SubnetSpec(h, v, lyr, 1, depth=d, mlp=m, draft_vocab=n)

    @property
    def n_architectures(self) -> int:
        return math.prod(len(getattr(self, n)) for n in ARCH_FIELDS)

    @property
    def size(self) -> int:
        return self.n_architectures * len(self.shapes)

    def __len__(self) -> int:
        return self.size

    def enumerate(self) -> Iterator[SubnetSpec]:
        """Every subnet, exactly once, in a stable order (heads, visual_keep, inject_layer,
        depth, mlp, then the shapes: chains by draft_len, then the trees in the space's
        order)."""
        shapes = self.shapes
        for arch in self.architectures:
            for g, tree in shapes:
                yield arch.replace(draft_len=g, tree=tree)

    def sample(self, n: int, rng: np.random.Generator | int | None = None) -> list[SubnetSpec]:
        """`n` distinct subnets drawn uniformly without replacement."""
        if n < 0 or n > self.size:
            raise InputError(f"cannot sample {n} subnets from a space of {self.size}; "
                             f"use 0..{self.size}")
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        picks = gen.choice(self.size, size=n, replace=False)
        all_specs = list(self.enumerate())
        return [all_specs[int(i)] for i in picks]

    def largest(self) -> SubnetSpec:
        """The largest chain subnet (every field at its maximum)."""
        return SubnetSpec(*(max(getattr(self, n)) for n in SPEC_FIELDS),
                          **{n: max(getattr(self, n)) for n in SIZE_DEFAULTS})

    def smallest(self) -> SubnetSpec:
        return SubnetSpec(*(min(getattr(self, n)) for n in SPEC_FIELDS),
                          **{n: min(getattr(self, n)) for n in SIZE_DEFAULTS})

    @property
    def max_draft_len(self) -> int:
        """The longest chain or tree: how many draft steps a cycle may take."""
        return max([*self.draft_len, *(len(t) for t in self.trees)])

    def __contains__(self, spec: object) -> bool:
        if not isinstance(spec, SubnetSpec):
            return False
        shape_ok = spec.tree in self.trees if spec.tree else spec.draft_len in self.draft_len
        return shape_ok and all(getattr(spec, n) in getattr(self, n) for n in ARCH_FIELDS)

    def validate(self, spec: SubnetSpec) -> SubnetSpec:
        """Return `spec` if it lies in the space; otherwise name the field, value and allowed
        values."""
        if spec.tree and spec.tree not in self.trees:
            allowed = [TokenTree(t).label for t in self.trees] or "none"
            raise InputError(
                f"The tree {spec.tree_label} of subnet {spec.id} isn't contained in the search "
                f"space (trees: {allowed}); pick one of its trees or add it to the space")
        names = (*ARCH_FIELDS, "draft_len") if not spec.tree else ARCH_FIELDS
        for name in names:
            value, allowed = getattr(spec, name), getattr(self, name)
            if value not in allowed:
                raise InputError(
                    f"The value {value!r} of field '{name}' in subnet {spec.id} isn't contained "
                    f"in the search space (allowed: {list(allowed)}); pick an allowed value or "
                    "widen the space"
                )
        return spec

    # --- construction ---------------------------------------------------------------
    @classmethod
    def default_for(
        cls,
        num_target_layers: int,
        num_draft_heads: int,
        visual_keep: Sequence[float] = DEFAULT_VISUAL_KEEP,
        draft_len: Sequence[int] = DEFAULT_DRAFT_LENS,
        trees: Sequence[Sequence[int]] | None = None,
        depth: Sequence[int] = (1,),
        mlp: Sequence[float] = (1.0,),
        draft_vocab: Sequence[float] = (1.0,),
    ) -> SearchSpace:
        """A sensible default space.

        heads: quarters of the draft's head count (1/4, 1/2, 3/4, all), rounded, at least 1.
        inject_layer: four target layers spread over the depth, 1-based hidden-state indices
        (L/4, L/2, 3L/4, L); the last one is the EAGLE-style choice.
        trees: the token trees beside the chains; None: `tree_family` up to
        DEFAULT_TREE_NODES nodes, no deeper than the longest chain; () for chains only.
        depth, mlp: the draft sizes (`SubnetSpec.depth`/`mlp`) a supernet trained with
        elastic depth and width offers (DEFAULT_DEPTHS, DEFAULT_MLP); the paper's one size by
        default. draft_vocab: the vocabulary shares (`default_draft_vocab`); the whole by default.
        """
        if num_target_layers < 1 or num_draft_heads < 1:
            raise InputError(
                f"cannot derive a space from {num_target_layers} target layers and "
                f"{num_draft_heads} draft heads; both must be at least 1"
            )
        heads = sorted({max(1, round(num_draft_heads * q / 4)) for q in (1, 2, 3, 4)})
        layers = sorted({max(1, round(num_target_layers * q / 4)) for q in (1, 2, 3, 4)})
        if trees is None:
            trees = [t.branching for t in tree_family(DEFAULT_TREE_NODES, max(draft_len))]
        return cls(heads=tuple(heads), visual_keep=tuple(visual_keep),
                   inject_layer=tuple(layers), draft_len=tuple(draft_len), trees=tuple(trees),
                   depth=tuple(depth), mlp=tuple(mlp), draft_vocab=tuple(draft_vocab))

    @classmethod
    def from_configs(cls, target_config: Any, draft_config: Any, **kwargs: Any) -> SearchSpace:
        """Derive the default space from a Hugging Face target config and a draft config."""
        text_cfg = getattr(target_config, "text_config", None) or target_config
        layers = getattr(text_cfg, "num_hidden_layers", None)
        heads = getattr(draft_config, "num_attention_heads", None)
        if layers is None or heads is None:
            raise InputError(
                "cannot derive a search space: the target config needs num_hidden_layers and "
                "the draft config num_attention_heads"
            )
        return cls.default_for(int(layers), int(heads), **kwargs)

    # --- persistence ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The space as run.json holds it: `trees` (labels) only when it has any, and each
        size field only when it holds more than the paper's size (`SIZE_DEFAULTS`)."""
        out = {"schema_version": SPACE_SCHEMA_VERSION,
               **{n: list(getattr(self, n)) for n in SPEC_FIELDS}}
        if self.trees:
            out["trees"] = [TokenTree(t).label for t in self.trees]
        for name, default in SIZE_DEFAULTS.items():  # only when searched
            if tuple(getattr(self, name)) != (default,):
                out[name] = list(getattr(self, name))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchSpace:
        version = data.get("schema_version", SPACE_SCHEMA_VERSION)
        if version != SPACE_SCHEMA_VERSION:
            raise InputError(
                f"search space schema_version={version!r} is not supported (this dreams-nas "
                f"reads version {SPACE_SCHEMA_VERSION}); write the space again with this "
                "version (`dreams-nas train` records it in run.json)"
            )
        missing = [n for n in SPEC_FIELDS if n not in data]
        if missing:
            raise InputError(f"search space is missing field(s) {missing}; "
                             f"it needs {list(SPEC_FIELDS)}")
        unknown = sorted(set(data) - set(SPEC_FIELDS) - {"schema_version", "trees",
                                                          *SIZE_DEFAULTS})
        if unknown:
            raise InputError(
                f"search space has unknown field(s) {unknown}; "
                f"allowed fields are {[*SPEC_FIELDS, 'trees', *SIZE_DEFAULTS]}"
            )
        sizes = {n: data.get(n) or (default,) for n, default in SIZE_DEFAULTS.items()}
        return cls(**{n: data[n] for n in SPEC_FIELDS}, trees=data.get("trees") or (), **sizes)

    def to_toml(self) -> str:
        lines = [f"schema_version = {SPACE_SCHEMA_VERSION}"]
        for n in SPEC_FIELDS:
            lines.append(f"{n} = [{', '.join(repr(v) for v in getattr(self, n))}]")
        if self.trees:
            labels = ", ".join(f'"{TokenTree(t).label}"' for t in self.trees)
            lines.append(f"trees = [{labels}]")
        for name, default in SIZE_DEFAULTS.items():
            if tuple(getattr(self, name)) != (default,):
                lines.append(f"{name} = [{', '.join(repr(v) for v in getattr(self, name))}]")
        return "\n".join(lines) + "\n"

    def save(self, path: str | Path) -> Path:
        from dreams_nas.supernet.core.io import atomic_write_text

        path = Path(path)
        if path.suffix == ".toml":
            text = self.to_toml()
        elif path.suffix == ".json":
            text = json.dumps(self.to_dict(), indent=2) + "\n"
        else:
            raise InputError(f"cannot save a search space as {path.name!r}; "
                             "use a .toml or .json file")
        atomic_write_text(path, text)
        return path

    @classmethod
    def load(cls, path: str | Path) -> SearchSpace:
        path = Path(path)
        if not path.is_file():
            raise InputError(f"search space file {path} does not exist; give a .toml or .json file")
        text = path.read_text(encoding="utf-8")
        try:
            if path.suffix == ".toml":
                data = tomllib.loads(text)
            elif path.suffix == ".json":
                data = json.loads(text)
            else:
                raise InputError(f"cannot read a search space from {path.name!r}; "
                                 "use .toml or .json")
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"search space file {path} is not valid "
                             f"{path.suffix[1:].upper()}: {exc}") from None
        if not isinstance(data, dict):
            raise InputError(f"search space file {path} must hold a table of fields")
        return cls.from_dict(data)
