"""What a search evaluates (`Candidate`) and the two things it needs to evaluate one.

The search is written against two small protocols so it runs with the real acceptance
scorer and latency predictor as well as with deterministic ones in tests:

* `AcceptanceScorer.score(specs) -> [AcceptanceRow]`: tau of each subnet (the expensive part;
  hardware independent).
* `LatencyModel.predict_ms(kind, spec, context_len, k) -> ms` for kind "draft" (one draft
  step of `spec`), "draft_first" (the cycle's first draft step, right after the target's
  verify), "verify" (one target pass over k positions) or "decode" (one plain target step);
  `spec` is None for the target's kinds. `dreams_nas.latency.LatencyPredictor` is the real one.

A model that also predicts many steps per call (`BatchLatencyModel`: `draft_ms(specs, ...)`,
`first_draft_ms(specs, ...)`, `target_ms(ks, ...)`, as `LatencyPredictor` does) is asked once
per kind for every distinct step a table of subnets needs, so evaluating 10^6 subnets costs
three predictor calls; any other `LatencyModel` is asked once per distinct step.

A model with a ``cycle_ms(ks, context_len, tree=False)`` method (`LatencyPredictor`) also
prices the speculative cycle's own work outside the forwards (acceptance, cache rollback,
bookkeeping: the profile's ``cycle`` / ``cycle_tree`` kinds) per chain gamma and tree size;
without one, or from a profile without those rows, the overhead is priced 0 ms.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from dreams_nas.nas.search.speedup import expected_speedup
from dreams_nas.supernet.acceptance.table import AcceptanceRow
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.space import SIZE_DEFAULTS, SubnetSpec
from dreams_nas.supernet.core.tree import TokenTree
from numpy.typing import ArrayLike


@runtime_checkable
class AcceptanceScorer(Protocol):
    def score(self, specs: Sequence[SubnetSpec]) -> list[AcceptanceRow]:
        """One row per spec, in the order given."""
        ...


@runtime_checkable
class LatencyModel(Protocol):
    def predict_ms(self, kind: str, spec: SubnetSpec | None, context_len: int, k: int) -> float:
        ...


@runtime_checkable
class BatchLatencyModel(LatencyModel, Protocol):
    """A latency model that also predicts many steps in one call. Its draft steps depend on a spec's
    heads, visual_keep, depth, mlp and draft_vocab only (not inject_layer, not draft_len), which
    is what lets the cache share one prediction between every subnet with the same five."""

    def draft_ms(self, specs: Sequence[SubnetSpec], context_len: int) -> np.ndarray:
        ...

    def first_draft_ms(self, specs: Sequence[SubnetSpec], context_len: int) -> np.ndarray:
        ...

    def target_ms(self, k: Sequence[int], context_len: int) -> np.ndarray | float:
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

    @classmethod
    def of(cls, cost: DraftParams | DraftCost) -> DraftCost:
        return cost if isinstance(cost, DraftCost) else cls(cost)

    def __call__(self, spec: SubnetSpec) -> int:
        return int(self.params(spec))


@dataclass(frozen=True)
class Candidate:
    """One evaluated subnet: measured tau, predicted latencies, expected speedup."""

    spec: SubnetSpec
    tau: float
    tau_ci: tuple[float, float]
    draft_ms: float  # one draft step (hot: the cycle's 2nd..gamma-th)
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
            draft_bytes=int(attrs.get("draft_bytes", 0)),
            hot_draft_ms=float(attrs.get("hot_draft_ms", float("nan"))),
            cycle_overhead_ms=float(attrs.get("cycle_overhead_ms", 0.0)))

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


class LatencyCache:
    """Memoises step predictions by what they depend on.

    A `BatchLatencyModel`'s draft step depends on (heads, visual_keep, depth, mlp, draft_vocab)
    and a target pass on k only, so a whole space needs one prediction per distinct draft size
    and per gamma, asked in one call per kind. Any other `LatencyModel` gets the whole
    architecture (`SubnetSpec.arch`: draft_len 1) and is asked once per distinct architecture:
    its `predict_ms` may read inject_layer (recorded tables do), so collapsing it would make
    answers order-dependent.
    """

    def __init__(self, predictor: LatencyModel, context_len: int) -> None:
        self.predictor = predictor
        self.context_len = int(context_len)
        self._batch = predictor if isinstance(predictor, BatchLatencyModel) else None
        self.n_calls = 0  # predictor calls made so far (tests and benchmarks read it)
        self._memo: dict[tuple[Any, ...], float] = {}

    @property
    def batched(self) -> bool:
        """Whether the predictor is asked for many steps per call."""
        return self._batch is not None

    # --- tables -------------------------------------------------------------------------
    def draft_steps(self, fields: SubnetFields, kind: str = "draft", k: int = 1) -> np.ndarray:
        """(n,) ms of one draft step of each subnet; kind ``draft`` (a hot step, over `k`
        nodes: a token tree's level) or ``draft_first`` (the cycle's first, right after the
        verify)."""
        if kind not in ("draft", "draft_first"):
            raise ValueError(f"draft kind {kind!r} is not one of draft, draft_first")
        columns = [fields.heads, fields.visual_keep, fields.depth, fields.mlp, fields.draft_vocab]
        if not self.batched:
            columns.append(fields.inject_layer)
        first, inverse = _distinct(columns)
        keys = [(kind, int(fields.heads[i]), float(fields.visual_keep[i]), int(k),
                 int(fields.depth[i]), float(fields.mlp[i]), float(fields.draft_vocab[i]))
                + (() if self.batched else (int(fields.inject_layer[i]),)) for i in first]
        missing = [(key, int(i)) for key, i in zip(keys, first, strict=True)
                   if key not in self._memo]
        if missing:
            specs = [SubnetSpec(heads=int(fields.heads[i]),
                                visual_keep=float(fields.visual_keep[i]),
                                inject_layer=int(fields.inject_layer[i]), draft_len=1,
                                depth=int(fields.depth[i]), mlp=float(fields.mlp[i]),
                                draft_vocab=float(fields.draft_vocab[i]))
                     for _, i in missing]
            values = self._predict_draft(kind, specs, k)
            self._memo.update(zip((key for key, _ in missing), values, strict=True))
        per_key = np.array([self._memo[key] for key in keys], dtype=np.float64)
        return per_key[inverse]

    def tree_steps(self, ks: ArrayLike) -> np.ndarray:
        """(len(ks),) ms of the target's verify of a token tree over k positions."""
        ks = np.asarray(ks, dtype=np.int64).reshape(-1)
        distinct, inverse = np.unique(ks, return_inverse=True)
        missing = [int(k) for k in distinct if ("tree", int(k)) not in self._memo]
        if missing:
            if self._batch is not None and hasattr(self._batch, "tree_verify_ms"):
                self.n_calls += 1
                values = _as_floats(self._batch.tree_verify_ms(missing, self.context_len),
                                    len(missing), "verify_tree")
            else:
                self.n_calls += len(missing)
                values = [float(self.predictor.predict_ms("verify_tree", None, self.context_len,
                                                          k)) for k in missing]
            self._memo.update(zip((("tree", k) for k in missing), values, strict=True))
        per_key = np.array([self._memo[("tree", int(k))] for k in distinct], dtype=np.float64)
        return per_key[inverse]

    @property
    def cycle_priced(self) -> dict[str, bool]:
        """{``chain``/``tree``: whether the model prices that cycle's own work}; False for a
        model without ``cycle_ms`` or a profile without ``cycle`` (``cycle_tree``) rows."""
        profiled = getattr(self.predictor, "cycle_profiled", None)
        has = callable(getattr(self.predictor, "cycle_ms", None))
        return {shape: bool(has and (profiled is None or profiled(shape == "tree")))
                for shape in ("chain", "tree")}

    def cycle_steps(self, ks: ArrayLike, tree: bool = False) -> np.ndarray:
        """(len(ks),) ms of a speculative cycle's own work outside the forwards: k = gamma + 1
        of a chain, or a tree's nodes + 1 (`tree`); 0 where the model does not price it
        (`cycle_priced`)."""
        ks = np.asarray(ks, dtype=np.int64).reshape(-1)
        if not len(ks) or not self.cycle_priced["tree" if tree else "chain"]:
            return np.zeros(len(ks))
        cycle_ms = self.predictor.cycle_ms  # type: ignore[attr-defined]
        name = "cycle_tree" if tree else "cycle"
        distinct, inverse = np.unique(ks, return_inverse=True)
        missing = [int(k) for k in distinct if (name, int(k)) not in self._memo]
        if missing:
            self.n_calls += 1
            values = _as_floats(cycle_ms(missing, self.context_len, tree=tree), len(missing),
                                name)
            self._memo.update(zip(((name, k) for k in missing), values, strict=True))
        per_key = np.array([self._memo[(name, int(k))] for k in distinct], dtype=np.float64)
        return per_key[inverse]

    def target_steps(self, ks: ArrayLike) -> np.ndarray:
        """(len(ks),) ms of one target pass over k positions: k = 1 a plain decoding step,
        k = gamma + 1 the verify of gamma drafted tokens."""
        ks = np.asarray(ks, dtype=np.int64).reshape(-1)
        distinct, inverse = np.unique(ks, return_inverse=True)
        missing = [int(k) for k in distinct if ("target", int(k)) not in self._memo]
        if missing:
            values = self._predict_target(missing)
            self._memo.update(zip((("target", k) for k in missing), values, strict=True))
        per_key = np.array([self._memo[("target", int(k))] for k in distinct], dtype=np.float64)
        return per_key[inverse]

    # --- one step -----------------------------------------------------------------------
    def draft(self, spec: SubnetSpec) -> float:
        return float(self.draft_steps(SubnetFields.of([spec]))[0])

    def first_draft(self, spec: SubnetSpec) -> float:
        return float(self.draft_steps(SubnetFields.of([spec]), kind="draft_first")[0])

    def verify(self, draft_len: int) -> float:
        return float(self.target_steps([draft_len + 1])[0])

    def decode(self) -> float:
        return float(self.target_steps([1])[0])

    # --- the predictor ------------------------------------------------------------------
    def _predict_draft(self, kind: str, specs: list[SubnetSpec], k: int = 1) -> list[float]:
        if self._batch is not None:
            self.n_calls += 1
            if kind == "draft":
                values = (self._batch.draft_ms(specs, self.context_len) if k == 1
                          else self._batch.draft_ms(specs, self.context_len, k=k))
            else:
                values = self._batch.first_draft_ms(specs, self.context_len)
            return _as_floats(values, len(specs), kind)
        self.n_calls += len(specs)
        return [float(self.predictor.predict_ms(kind, s, self.context_len, k)) for s in specs]

    def _predict_target(self, ks: list[int]) -> list[float]:
        if self._batch is not None:
            self.n_calls += 1
            return _as_floats(self._batch.target_ms(ks, self.context_len), len(ks), "target")
        self.n_calls += len(ks)
        return [float(self.predictor.predict_ms("decode" if k == 1 else "verify", None,
                                                self.context_len, k)) for k in ks]


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


def _as_floats(values: Any, n: int, kind: str) -> list[float]:
    out = np.atleast_1d(np.asarray(values, dtype=np.float64))
    if out.shape != (n,):
        raise ValueError(f"the latency model returned {out.shape} {kind} predictions for {n} "
                         "steps; a batched model must return one per step asked")
    return out.tolist()


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


def evaluate_fields(
    tau: ArrayLike,
    fields: SubnetFields,
    latency: LatencyCache,
    *,
    max_draft_ms: float | None = None,
) -> CandidateArrays:
    """Latencies, expected speedup and feasibility of n subnets, all vectorised: the
    predictor is asked for every distinct step at once (`LatencyCache`).

    tau: (n,) tokens per cycle of each subnet (its acceptance row's tau).
    """
    tau = np.asarray(tau, dtype=np.float64)
    if tau.shape != (len(fields),):
        raise InputError(f"{tau.shape[0] if tau.ndim else 0} tau value(s) for {len(fields)} "
                         "subnets; give one per subnet")
    draft = latency.draft_steps(fields)  # (n,)
    first = latency.draft_steps(fields, kind="draft_first")  # (n,)
    target = latency.target_steps(np.concatenate([[1], fields.draft_len + 1]))  # (1 + n,)
    decode, verify = float(target[0]), target[1:].copy()
    hot = (fields.draft_len - 1) * draft  # a chain's gamma - 1 hot steps
    overhead = latency.cycle_steps(fields.draft_len + 1)  # (n,) a chain's; trees' below
    is_tree = fields.tree_index >= 0
    if is_tree.any():
        _tree_costs(fields, is_tree, latency, hot, verify, overhead)
    speedup = expected_speedup(tau, fields.draft_len, draft, verify, decode,
                               first_draft_ms=first, hot_draft_ms=hot,
                               cycle_overhead_ms=overhead)  # (n,)
    feasible = (np.ones(len(fields), dtype=bool) if max_draft_ms is None
                else draft <= max_draft_ms)
    return CandidateArrays(draft_ms=draft, first_draft_ms=first, verify_ms=verify,
                           decode_ms=decode, speedup=speedup, feasible=feasible,
                           hot_draft_ms=hot, cycle_overhead_ms=overhead)


def _tree_costs(fields: SubnetFields, is_tree: np.ndarray, latency: LatencyCache,
                hot: np.ndarray, verify: np.ndarray, overhead: np.ndarray) -> None:
    """Fill the token trees' cycle costs in place: the draft's steps over each level after
    the root (one step per depth, as wide as the level), the target's tree verify over
    the nodes and the root, and the tree cycle's own work."""
    sub = fields.rows(is_tree)
    trees = [TokenTree(t) for t in fields.trees]
    tree_hot = np.zeros(len(sub))
    for width in sorted({w for t in trees for w in t.widths[:-1]}):
        count = np.array([sum(w == width for w in t.widths[:-1]) for t in trees])
        tree_hot += count[sub.tree_index] * latency.draft_steps(sub, k=width)
    hot[is_tree] = tree_hot
    nodes = np.array([t.nodes for t in trees])
    verify[is_tree] = latency.tree_steps(nodes[sub.tree_index] + 1)
    overhead[is_tree] = latency.cycle_steps(nodes[sub.tree_index] + 1, tree=True)


def evaluate(
    rows: Sequence[AcceptanceRow],
    latency: LatencyCache,
    draft_params: DraftParams,
    *,
    max_draft_ms: float | None = None,
    numbers: Sequence[int] | None = None,
    draft_memory: DraftMemory | None = None,
) -> list[Candidate]:
    """Candidates for acceptance rows, vectorised over the rows (`evaluate_fields`);
    `draft_memory` fills `draft_bytes` (0 without it)."""
    if not rows:
        return []
    specs = [r.spec for r in rows]
    arrays = evaluate_fields([r.tau for r in rows], SubnetFields.of(specs), latency,
                             max_draft_ms=max_draft_ms)
    numbers = list(numbers) if numbers is not None else list(range(len(rows)))
    columns = zip(rows, arrays.draft_ms.tolist(), arrays.first_draft_ms.tolist(),
                  arrays.verify_ms.tolist(), arrays.speedup.tolist(), arrays.feasible.tolist(),
                  numbers, arrays.hot_draft_ms.tolist(), arrays.cycle_overhead_ms.tolist(),
                  strict=True)
    return [
        Candidate(
            spec=r.spec, tau=float(r.tau), tau_ci=(float(r.tau_lo), float(r.tau_hi)),
            draft_ms=draft, first_draft_ms=first, verify_ms=verify,
            decode_ms=arrays.decode_ms, speedup=speedup, draft_params=int(draft_params(r.spec)),
            feasible=feasible, number=int(number),
            draft_bytes=int(draft_memory(r.spec)) if draft_memory is not None else 0,
            hot_draft_ms=hot, cycle_overhead_ms=overhead,
        )
        for r, draft, first, verify, speedup, feasible, number, hot, overhead in columns
    ]
