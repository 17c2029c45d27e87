"""What a search evaluates (`Candidate`), and how: tau from an acceptance scorer, the steps'
milliseconds from a latency model, both asked for whole tables at once.

* `AcceptanceScorer.score(specs) -> [AcceptanceRow]`: tau of each subnet (the expensive part;
  hardware independent).
* `latency.model.query.LatencyModel`: `draft_ms`, `target_ms` and `prices` of one device
  (`LatencyPredictor` is the real one). `evaluate_fields` asks it once per kind for every
  distinct step a table of subnets needs -- a draft step by the fields the model's cost
  depends on (`draft_fields`), a target step by k -- so evaluating 10^6 subnets costs a handful
  of calls. A model that does not price the cycle's own work (`prices("cycle")` false: a profile
  without those rows) prices it at 0 ms.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from dreams_nas.latency.model.query import LatencyModel
from dreams_nas.nas.search.speedup import expected_speedup
from dreams_nas.supernet.acceptance.table import AcceptanceRow
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.spec import SIZE_DEFAULTS, SubnetSpec
from dreams_nas.supernet.core.tree import TokenTree
from numpy.typing import ArrayLike


@runtime_checkable
class AcceptanceScorer(Protocol):
    def score(self, specs: Sequence[SubnetSpec]) -> list[AcceptanceRow]:
        """One row per spec, in the order given."""
        ...


DraftParams = Callable[[SubnetSpec], int]
# front name -> (figure maximised, figure minimised); figures are `Candidate` attributes
FRONTS: dict[str, tuple[str, str]] = {
    "tau-latency": ("tau", "cycle_ms"),  # model quality vs hardware cost
    "speedup-memory": ("speedup", "draft_bytes"),  # weights + KV at the context
    "speedup-params": ("speedup", "draft_params"),
}
DEFAULT_FRONT = "tau-latency"
DraftMemory = Callable[[SubnetSpec], int]  # bytes of a subnet's draft at the search's context


class DraftCost:
    """What a draft costs besides time: its parameters and, when known, its memory in bytes.
    It is a `DraftParams` itself (calling it gives the parameters)."""

    def __init__(self, params: DraftParams, memory: DraftMemory | None = None) -> None:
        self.params, self.memory = params, memory

    def __call__(self, spec: SubnetSpec) -> int:
        return int(self.params(spec))


@dataclass(frozen=True)
class Candidate:
    """One evaluated subnet: measured tau, predicted latencies, expected speedup."""

    spec: SubnetSpec
    tau: float
    tau_ci: tuple[float, float]
    draft_ms: float  # one draft step (hot: the cycle's 2nd..draft_len-th)
    first_draft_ms: float  # the cycle's first draft step (right after the verify)
    verify_ms: float  # one target pass over draft_len + 1 positions
    decode_ms: float  # one plain target step
    speedup: float
    draft_params: int
    feasible: bool  # meets the constraints (--max-draft-ms)
    number: int = -1  # evaluation order: Optuna trial number or enumeration index
    draft_bytes: int = 0  # draft memory at the context: weights + KV (0: not estimated)
    # the cycle's draft steps after the first: a chain's draft_len - 1 hot steps, a tree's
    # steps over its levels (NaN: a chain's, from draft_ms)
    hot_draft_ms: float = float("nan")
    # the cycle's own work outside the forwards (acceptance, rollback, bookkeeping); 0: not
    # profiled
    cycle_overhead_ms: float = 0.0

    @property
    def cycle_draft_ms(self) -> float:
        """Draft time per cycle: the first step after the verify and the hot ones after it
        (a chain's draft_len - 1 steps, a token tree's steps over its levels)."""
        hot = self.hot_draft_ms
        if hot != hot:
            hot = (self.spec.draft_len - 1) * self.draft_ms
        return self.first_draft_ms + hot

    @property
    def cycle_ms(self) -> float:
        """One speculative cycle's forwards: its draft steps and the target's verify pass
        (the cycle's own work outside them is `cycle_overhead_ms`)."""
        return self.cycle_draft_ms + self.verify_ms

    def value(self, name: str) -> float:
        """The figure a front axis names (`strategies.FRONTS`)."""
        return float(getattr(self, name))

    @property
    def spec_id(self) -> str:
        return self.spec.id

    def to_attrs(self) -> dict[str, Any]:
        """The figures an Optuna trial keeps as user attributes (`from_attrs` reads them)."""
        return {"spec_id": self.spec.id, "tau": self.tau, "tau_lo": self.tau_ci[0],
                "tau_hi": self.tau_ci[1], "draft_ms": self.draft_ms,
                "first_draft_ms": self.first_draft_ms, "verify_ms": self.verify_ms,
                "decode_ms": self.decode_ms, "speedup": self.speedup,
                "draft_params": self.draft_params, "draft_bytes": self.draft_bytes,
                "hot_draft_ms": self.cycle_draft_ms - self.first_draft_ms,
                "cycle_overhead_ms": self.cycle_overhead_ms, "feasible": self.feasible}

    @classmethod
    def from_attrs(cls, spec: SubnetSpec, attrs: Mapping[str, Any], number: int) -> Candidate:
        """The candidate a trial's user attributes describe (see `to_attrs`)."""
        return cls(
            spec=spec, tau=float(attrs["tau"]),
            tau_ci=(float(attrs["tau_lo"]), float(attrs["tau_hi"])),
            draft_ms=float(attrs["draft_ms"]), first_draft_ms=float(attrs["first_draft_ms"]),
            verify_ms=float(attrs["verify_ms"]), decode_ms=float(attrs["decode_ms"]),
            speedup=float(attrs["speedup"]), draft_params=int(attrs["draft_params"]),
            feasible=bool(attrs["feasible"]), number=number,
            draft_bytes=int(attrs["draft_bytes"]), hot_draft_ms=float(attrs["hot_draft_ms"]),
            cycle_overhead_ms=float(attrs["cycle_overhead_ms"]))

    def to_row(self) -> dict[str, Any]:
        """The SCHEMAS.md trials.csv columns this candidate fills."""
        return {
            "number": self.number, "spec_id": self.spec.id, **self.spec.to_fields(),
            "tau": self.tau, "tau_lo": self.tau_ci[0], "tau_hi": self.tau_ci[1],
            "draft_ms": self.draft_ms, "first_draft_ms": self.first_draft_ms,
            "verify_ms": self.verify_ms, "decode_ms": self.decode_ms,
            "speedup": self.speedup, "draft_params": self.draft_params,
            "draft_bytes": self.draft_bytes, "cycle_ms": self.cycle_ms,
            "cycle_overhead_ms": self.cycle_overhead_ms, "feasible": int(self.feasible),
        }


@dataclass(frozen=True)
class SubnetFields:
    """The `SubnetSpec` fields of n subnets as columns: what the vectorised evaluation reads,
    so a table of 10^6 subnets need not exist as 10^6 objects. A subnet's token tree is an
    index into `trees` (-1: a chain); depth, mlp and draft_vocab default to the paper's draft
    (`SIZE_DEFAULTS`: 1, 1.0 and 1.0 for every subnet)."""

    heads: np.ndarray  # (n,) int64
    visual_keep: np.ndarray  # (n,) float64
    inject_layer: np.ndarray  # (n,) int64
    draft_len: np.ndarray  # (n,) int64
    tree_index: np.ndarray | None = None  # (n,) int64 into `trees`, -1 a chain; None: chains
    trees: tuple[tuple[int, ...], ...] = ()  # the distinct branching vectors
    depth: np.ndarray | None = None  # (n,) int64 decoder layers a side; None: all 1
    mlp: np.ndarray | None = None  # (n,) float64 share of the MLP kept; None: all 1.0
    draft_vocab: np.ndarray | None = None  # (n,) float64 vocabulary share; None: all 1.0

    def __post_init__(self) -> None:
        cast = {"heads": np.int64, "visual_keep": np.float64, "inject_layer": np.int64,
                "draft_len": np.int64}
        for name, dtype in cast.items():
            object.__setattr__(self, name, np.asarray(getattr(self, name), dtype=dtype))
        n = len(self.heads)
        index = np.full(n, -1) if self.tree_index is None else self.tree_index
        object.__setattr__(self, "tree_index", np.asarray(index, dtype=np.int64))
        for name, dtype in (("depth", np.int64), ("mlp", np.float64),
                            ("draft_vocab", np.float64)):
            value = getattr(self, name)
            value = np.full(n, SIZE_DEFAULTS[name]) if value is None else value
            object.__setattr__(self, name, np.asarray(value, dtype=dtype))
        sizes = {getattr(self, name).shape
                 for name in (*cast, "tree_index", *SIZE_DEFAULTS)}
        if len(sizes) != 1 or len(next(iter(sizes))) != 1:
            raise InputError(f"SubnetFields columns must be 1-d and of one length, got {sizes}")

    @classmethod
    def of(cls, specs: Sequence[SubnetSpec]) -> SubnetFields:
        trees = tuple(dict.fromkeys(s.tree for s in specs if s.tree))
        where = {t: i for i, t in enumerate(trees)}
        return cls(heads=[s.heads for s in specs], visual_keep=[s.visual_keep for s in specs],
                   inject_layer=[s.inject_layer for s in specs],
                   draft_len=[s.draft_len for s in specs],
                   tree_index=[where[s.tree] if s.tree else -1 for s in specs], trees=trees,
                   depth=[s.depth for s in specs], mlp=[s.mlp for s in specs],
                   draft_vocab=[s.draft_vocab for s in specs])

    def __len__(self) -> int:
        return len(self.heads)

    def rows(self, index: Any) -> SubnetFields:
        """The fields of the subnets `index` selects (a mask or indices)."""
        return SubnetFields(self.heads[index], self.visual_keep[index], self.inject_layer[index],
                            self.draft_len[index], self.tree_index[index], self.trees,
                            depth=self.depth[index], mlp=self.mlp[index],
                            draft_vocab=self.draft_vocab[index])

    def spec(self, i: int) -> SubnetSpec:
        """Subnet i's architecture as a spec (draft_len 1, a chain: what one draft step is)."""
        return SubnetSpec(heads=int(self.heads[i]), visual_keep=float(self.visual_keep[i]),
                          inject_layer=int(self.inject_layer[i]), draft_len=1,
                          depth=int(self.depth[i]), mlp=float(self.mlp[i]),
                          draft_vocab=float(self.draft_vocab[i]))


@dataclass(frozen=True)
class Pricing:
    """What a search prices subnets with: a latency model asked at one context (the mean
    decoding context) and what a draft costs besides time."""

    latency: LatencyModel
    context_len: int
    cost: DraftCost

    def draft_steps(self, fields: SubnetFields, kind: str = "draft", k: int = 1) -> np.ndarray:
        """(n,) ms of one draft step of each subnet; kind ``draft`` (a hot step, over `k`
        nodes: a token tree's level) or ``draft_first`` (the cycle's first, after the verify);
        one spec per distinct `draft_fields` row is asked."""
        first, inverse = _distinct([getattr(fields, f) for f in self.latency.draft_fields])
        specs = [fields.spec(int(i)) for i in first]
        values = np.asarray(self.latency.draft_ms(specs, self.context_len, kind=kind, k=k),
                            dtype=np.float64)
        return values[inverse]

    def target_steps(self, kind: str, ks: ArrayLike) -> np.ndarray:
        """(len(ks),) ms of one `kind` target step (or cycle) over each k positions; 0 for a
        cycle kind the model does not price."""
        ks = np.asarray(ks, dtype=np.int64).reshape(-1)
        if not len(ks) or (kind.startswith("cycle") and not self.latency.prices(kind)):
            return np.zeros(len(ks))
        distinct, inverse = np.unique(ks, return_inverse=True)
        values = np.asarray(self.latency.target_ms(kind, distinct.tolist(), self.context_len),
                            dtype=np.float64)
        return values[inverse.reshape(-1)]


def _distinct(columns: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of equal-length columns: (first index of each distinct row, (n,) index of
    each row's distinct row). Sort-based, O(n log n); never builds tuples per row."""
    code = np.zeros(len(columns[0]), dtype=np.int64)
    for column in columns:
        values, inverse = np.unique(column, return_inverse=True)
        code = code * len(values) + inverse.reshape(-1)
        code = np.unique(code, return_inverse=True)[1].reshape(-1)  # keep the code small
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


@dataclass(frozen=True)
class CandidateArrays:
    """The figures of n evaluated subnets as columns (the vectorised form of `Candidate`)."""

    draft_ms: np.ndarray  # (n,) one hot draft step
    first_draft_ms: np.ndarray  # (n,) the cycle's first draft step
    verify_ms: np.ndarray  # (n,) one target pass over draft_len + 1 (a tree's nodes + 1)
    decode_ms: float  # one plain target step
    speedup: np.ndarray  # (n,)
    feasible: np.ndarray  # (n,) bool
    hot_draft_ms: np.ndarray | None = None  # (n,) the cycle's draft steps after the first
    cycle_overhead_ms: np.ndarray | None = None  # (n,) the cycle's work outside the forwards


def evaluate_fields(tau: ArrayLike, fields: SubnetFields, pricing: Pricing, *,
                    max_draft_ms: float | None = None) -> CandidateArrays:
    """Latencies, expected speedup and feasibility of n subnets, all vectorised: the latency
    model is asked for every distinct step at once (`Pricing`).

    tau: (n,) tokens per cycle of each subnet (its acceptance row's tau).
    """
    tau = np.asarray(tau, dtype=np.float64)
    if tau.shape != (len(fields),):
        raise InputError(f"{tau.shape[0] if tau.ndim else 0} tau value(s) for {len(fields)} "
                         "subnets; give one per subnet")
    draft = pricing.draft_steps(fields)  # (n,)
    first = pricing.draft_steps(fields, kind="draft_first")  # (n,)
    decode = float(pricing.target_steps("decode", [1])[0])
    verify = pricing.target_steps("verify", fields.draft_len + 1)  # (n,) a chain's
    hot = (fields.draft_len - 1) * draft  # a chain's draft_len - 1 hot steps
    overhead = pricing.target_steps("cycle", fields.draft_len + 1)  # (n,) a chain's
    is_tree = fields.tree_index >= 0
    if is_tree.any():
        _tree_costs(fields, is_tree, pricing, hot, verify, overhead)
    speedup = expected_speedup(tau, fields.draft_len, draft, verify, decode,
                               first_draft_ms=first, hot_draft_ms=hot,
                               cycle_overhead_ms=overhead)  # (n,)
    feasible = (np.ones(len(fields), dtype=bool) if max_draft_ms is None
                else draft <= max_draft_ms)
    return CandidateArrays(draft_ms=draft, first_draft_ms=first, verify_ms=verify,
                           decode_ms=decode, speedup=speedup, feasible=feasible,
                           hot_draft_ms=hot, cycle_overhead_ms=overhead)


def _tree_costs(fields: SubnetFields, is_tree: np.ndarray, pricing: Pricing,
                hot: np.ndarray, verify: np.ndarray, overhead: np.ndarray) -> None:
    """Fill the token trees' cycle costs in place: the draft's steps over each level after
    the root (one step per level, as wide as the level), the target's tree verify over
    the nodes and the root, and the tree cycle's own work."""
    sub = fields.rows(is_tree)
    trees = [TokenTree(t) for t in fields.trees]
    tree_hot = np.zeros(len(sub))
    for width in sorted({w for t in trees for w in t.widths[:-1]}):
        count = np.array([sum(w == width for w in t.widths[:-1]) for t in trees])
        tree_hot += count[sub.tree_index] * pricing.draft_steps(sub, k=width)
    hot[is_tree] = tree_hot
    nodes = np.array([t.nodes for t in trees])
    verify[is_tree] = pricing.target_steps("verify_tree", nodes[sub.tree_index] + 1)
    overhead[is_tree] = pricing.target_steps("cycle_tree", nodes[sub.tree_index] + 1)


def evaluate(rows: Sequence[AcceptanceRow], pricing: Pricing, *,
             max_draft_ms: float | None = None,
             numbers: Sequence[int] | None = None) -> list[Candidate]:
    """Candidates for acceptance rows, vectorised over the rows (`evaluate_fields`); the
    pricing's `DraftCost` fills `draft_params` and `draft_bytes` (0 without a memory)."""
    if not rows:
        return []
    specs = [r.spec for r in rows]
    arrays = evaluate_fields([r.tau for r in rows], SubnetFields.of(specs), pricing,
                             max_draft_ms=max_draft_ms)
    numbers = list(numbers) if numbers is not None else list(range(len(rows)))
    memory = pricing.cost.memory
    columns = zip(rows, arrays.draft_ms.tolist(), arrays.first_draft_ms.tolist(),
                  arrays.verify_ms.tolist(), arrays.speedup.tolist(), arrays.feasible.tolist(),
                  numbers, arrays.hot_draft_ms.tolist(), arrays.cycle_overhead_ms.tolist(),
                  strict=True)
    return [
        Candidate(
            spec=r.spec, tau=float(r.tau), tau_ci=(float(r.tau_lo), float(r.tau_hi)),
            draft_ms=draft, first_draft_ms=first, verify_ms=verify,
            decode_ms=arrays.decode_ms, speedup=speedup, draft_params=pricing.cost(r.spec),
            feasible=feasible, number=int(number),
            draft_bytes=int(memory(r.spec)) if memory is not None else 0,
            hot_draft_ms=hot, cycle_overhead_ms=overhead,
        )
        for r, draft, first, verify, speedup, feasible, number, hot, overhead in columns
    ]
