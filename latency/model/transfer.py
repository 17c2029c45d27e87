"""Few-shot latency transfer: a new device's step costs from the predictor(s) of fully profiled
devices and a handful of the new device's own measurements (`dreams-nas profile
--transfer-from`).

A step's cost on two devices differs in a structured way. Its fixed part (launches, Python,
the host's bookkeeping) and its compute part scale differently from device to device, and so do
the three engines a cycle runs: the draft's forward passes, the target's, and the loop's own
work on the host. So the new device's milliseconds are an affine map of the sources' prices,
with the map allowed to differ by engine and, below that, by kind of step, as far as the
measurements show it does:

    y = sum_s w_s x_s + b m  +  (d_g + d_kind) x~  +  (o_g m_g + o_kind m_kind)

x_s is source s's predicted price of the step, x~ = sum_s w^_s x_s their blend (w^ fitted
first, without the engine and kind terms), m, m_g and m_kind the typical price of all steps, of
the engine g's and of the kind's (medians of x~ over the candidate steps). The fit is a ridge
regression read as a linear model with Gaussian priors: each measurement's relative error has a
standard deviation of `NOISE`, and every engine and kind term a zero-mean prior (`PRIOR_SD`), so
a term the measurements pin down is fitted freely while one they say nothing of stays at zero
(the engine's, or the global map). The priors of the source weights and the global offset are
centred on a first fit of the global map alone to the same rows (empirical Bayes: the rows count
twice there, which only keeps the global map where the other terms have no rows to go on). The
source weights are kept non-negative. With one source and only the global terms the map is a
scale and an offset; with the engine and kind terms it becomes, as measurements accrue, a scale
and an offset per kind.

Which steps to measure (`choose_rows`) follows from the same model: greedily the step whose
transferred price is least certain (largest posterior variance of its relative error, which
maximises the determinant of the posterior precision, D-optimal design). That picks the
cheapest and the dearest step of each engine and kind first -- the extremes an affine map is
pinned by -- and so spreads the measurements over contexts and sizes.

The kinds are the predictor's metric kinds (`validation.metric_kinds`): a draft step over a
token tree's level (``draft`` with k > 1) is ``draft_tree``, its own kind in the draft engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dreams_nas.supernet.core.errors import InputError

ENGINES = {"draft": "draft", "draft_tree": "draft", "draft_first": "draft",
           "decode": "target", "verify": "target", "verify_tree": "target",
           "cycle": "host", "cycle_tree": "host"}
# Relative standard deviation of one measurement (a profile's p10 of one step, minute to minute
# on a shared machine: a few per cent).
NOISE = 0.05
# Prior standard deviations, relative: the source weights about their first fit (a multiple
# of the blend's scale), the global offset (in typical prices), each engine's and each kind's
# scale and offset deviations.
PRIOR_SD = {"source": 2.0, "offset": 1.0, "engine_scale": 1.0, "engine_offset": 0.5,
            "kind_scale": 0.1, "kind_offset": 0.05}
LEVELS = ("global", "engine", "kind")
# The level sets a fit chooses among, simplest first (`select_levels`).
LEVEL_SETS = (("global",), ("global", "engine"), LEVELS)


@dataclass(frozen=True)
class TransferDesign:
    """The model's columns for a set of candidate steps: their kinds, the source weights the
    blend x~ uses, and the typical prices the offsets are measured in."""

    sources: int
    kinds: tuple[str, ...]  # the metric kinds present among the candidates
    blend: tuple[float, ...]  # w^: x~ = x @ blend
    typical: float  # m
    engine_typical: Mapping[str, float]
    kind_typical: Mapping[str, float]
    levels: tuple[str, ...] = LEVELS

    @classmethod
    def of(cls, kinds: Sequence[str], x: np.ndarray, blend: Sequence[float],
           levels: Sequence[str] = LEVELS) -> TransferDesign:
        """The design of candidate steps of metric kinds `kinds` with source prices `x`
        (rows, sources), blended by `blend`."""
        x = _prices(x)
        kinds_arr = np.asarray(kinds, dtype=object)
        _check_lengths(kinds_arr, x)
        unknown = sorted(set(kinds_arr) - set(ENGINES))
        if unknown:
            raise ValueError(f"unknown step kind(s) {unknown}; kinds are {', '.join(ENGINES)}")
        bad = [lv for lv in levels if lv not in LEVELS]
        if bad or "global" not in levels:
            raise ValueError(f"levels {list(levels)} must include global, of {LEVELS}")
        ref = x @ np.asarray(blend, dtype=float)
        engines = np.array([ENGINES[k] for k in kinds_arr], dtype=object)
        return cls(sources=x.shape[1], kinds=tuple(dict.fromkeys(sorted(kinds_arr))),
                   blend=tuple(float(b) for b in blend), typical=float(np.median(ref)),
                   engine_typical={g: float(np.median(ref[engines == g]))
                                   for g in dict.fromkeys(sorted(engines))},
                   kind_typical={k: float(np.median(ref[kinds_arr == k]))
                                 for k in dict.fromkeys(sorted(kinds_arr))},
                   levels=tuple(levels))

    def names(self) -> list[str]:
        """The columns, in order."""
        out = [f"w{s}" for s in range(self.sources)] + ["offset"]
        if "engine" in self.levels:
            out += [f"engine_scale:{g}" for g in self.engine_typical]
            out += [f"engine_offset:{g}" for g in self.engine_typical]
        if "kind" in self.levels:
            out += [f"kind_scale:{k}" for k in self.kinds]
            out += [f"kind_offset:{k}" for k in self.kinds]
        return out

    def matrix(self, kinds: Sequence[str], x: np.ndarray) -> np.ndarray:
        """(rows, columns) the model's design for steps of `kinds` with source prices `x`."""
        x = _prices(x)
        kinds_arr = np.asarray(kinds, dtype=object)
        _check_lengths(kinds_arr, x)
        missing = sorted(set(kinds_arr) - set(self.kinds))
        if missing:
            raise InputError(f"the transfer was not fitted for step kind(s) {missing}")
        ref = x @ np.asarray(self.blend)
        columns = [x[:, s] for s in range(self.sources)]
        columns.append(np.full(len(x), self.typical))
        if "engine" in self.levels:
            engines = np.array([ENGINES[k] for k in kinds_arr], dtype=object)
            columns += [ref * (engines == g) for g in self.engine_typical]
            columns += [m * (engines == g) for g, m in self.engine_typical.items()]
        if "kind" in self.levels:
            columns += [ref * (kinds_arr == k) for k in self.kinds]
            columns += [m * (kinds_arr == k) for k, m in self.kind_typical.items()]
        return np.column_stack(columns).astype(float)

    def prior(self, offset: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """(prior means, prior standard deviations) of the columns: the source weights about
        the blend, the global offset about `offset`, every other term about zero."""
        scale = max(sum(self.blend), 1e-12)
        mean = [*self.blend, offset]
        sd = [PRIOR_SD["source"] * max(b, scale / self.sources) for b in self.blend]
        sd.append(PRIOR_SD["offset"])
        for level, items in (("engine", self.engine_typical), ("kind", self.kinds)):
            if level in self.levels:
                mean += [0.0] * (2 * len(items))
                sd += ([PRIOR_SD[f"{level}_scale"]] * len(items)
                       + [PRIOR_SD[f"{level}_offset"]] * len(items))
        # the engine and kind scale terms multiply x~, which carries the blend's scale already
        return np.asarray(mean, dtype=float), np.asarray(sd, dtype=float)

    def lower_bounds(self) -> np.ndarray:
        """Non-negative source weights, every other term free."""
        names = self.names()
        return np.array([0.0 if n.startswith("w") else -np.inf for n in names])


def _prices(x: Any) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or not np.isfinite(x).all() or (x <= 0).any():
        raise ValueError("source prices must be positive, finite milliseconds (rows, sources)")
    return x


def _check_lengths(kinds: np.ndarray, x: np.ndarray) -> None:
    if len(kinds) != len(x):
        raise ValueError(f"{len(kinds)} step kinds for {len(x)} rows of prices")


def _solve(design: TransferDesign, kinds: Sequence[str], x: np.ndarray, y: np.ndarray,
           offset: float = 0.0) -> np.ndarray:
    """The posterior mean: least squares of the relative errors (sd `NOISE`) and the priors,
    the source weights bounded below by zero."""
    from scipy.optimize import lsq_linear

    A = design.matrix(kinds, x) / y[:, None]
    mean, sd = design.prior(offset)
    rows = np.vstack([A / NOISE, np.diag(1.0 / sd)])
    target = np.concatenate([np.ones(len(y)) / NOISE, mean / sd])
    low = design.lower_bounds()
    start = np.clip(mean, low, None)
    solved = lsq_linear(rows, target, bounds=(low, np.full(len(low), np.inf)), method="bvls")
    return solved.x if solved.success else start


@dataclass
class LatencyTransfer:
    """The fitted map from the sources' prices to the new device's (module docstring)."""

    design: TransferDesign
    coef: np.ndarray
    n: int  # measurements fitted on
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def fit(cls, cand_kinds: Sequence[str], cand_x: np.ndarray, kinds: Sequence[str],
            x: np.ndarray, y: Sequence[float], levels: Sequence[str] | None = None
            ) -> LatencyTransfer:
        """Fit on measured steps (`kinds`, source prices `x`, measured ms `y`); the candidate
        steps (`cand_kinds`, `cand_x`: every step the new device will be priced at) set the
        typical prices. levels: the terms fitted (`LEVELS`); None: chosen by leave-one-out
        on the measured steps (`select_levels`)."""
        y = np.asarray(y, dtype=float)
        x = _prices(x)
        if len(y) < 1 or len(y) != len(x) or not (np.isfinite(y) & (y > 0)).all():
            raise InputError(f"the transfer needs positive measured milliseconds, one per step; "
                             f"got {len(y)} for {len(x)} steps")
        cand_x = _prices(cand_x)
        extra: dict[str, Any] = {}
        if levels is None:
            levels, extra["levels_loo"] = select_levels(cand_kinds, cand_x, kinds, x, y)
        even = np.full(x.shape[1], 1.0 / x.shape[1])
        start = even * float(np.median(y / (x @ even)))  # the right units to start from
        # first the global map alone (the sources' weights and an offset): the blend x~
        first = TransferDesign.of(cand_kinds, cand_x, start, levels=("global",))
        coef = _solve(first, kinds, x, y)
        blend = coef[: x.shape[1]] if coef[: x.shape[1]].sum() > 0 else start
        design = TransferDesign.of(cand_kinds, cand_x, blend, levels=levels)
        # the first fit's offset, in ms, as the second design's unit (its typical price) counts
        offset = float(coef[-1]) * first.typical / design.typical
        return cls(design=design, coef=_solve(design, kinds, x, y, offset), n=len(y),
                   extra=extra)

    def predict(self, kinds: Sequence[str], x: np.ndarray) -> np.ndarray:
        """The new device's milliseconds of steps of `kinds` with source prices `x`; never
        below a tenth of the blended source price (an offset far below zero could cross it)."""
        x = _prices(x)
        out = self.design.matrix(kinds, x) @ self.coef
        return np.maximum(out, 0.1 * (x @ np.asarray(self.design.blend)))

    def summary(self) -> dict[str, Any]:
        """What was fitted, for predictor.json: the source weights, the global offset in ms,
        and each engine's and kind's effective scale (its terms' share over the blend) where
        fitted."""
        named = dict(zip(self.design.names(), self.coef.tolist(), strict=True))
        out: dict[str, Any] = {
            "levels": list(self.design.levels), "n": self.n, **self.extra,
            "source_weights": [round(named[f"w{s}"], 6) for s in range(self.design.sources)],
            "offset_ms": round(named["offset"] * self.design.typical, 6)}
        for level in ("engine", "kind"):
            items = (self.design.engine_typical if level == "engine" else self.design.kind_typical)
            if level in self.design.levels:
                out[f"{level}_scale"] = {k: round(named[f"{level}_scale:{k}"], 6)
                                         for k in items}
                out[f"{level}_offset_ms"] = {k: round(named[f"{level}_offset:{k}"] * m, 6)
                                             for k, m in items.items()}
        return out


def select_levels(cand_kinds: Sequence[str], cand_x: np.ndarray, kinds: Sequence[str],
                  x: np.ndarray, y: Sequence[float]) -> tuple[tuple[str, ...], dict[str, float]]:
    """The terms to fit, among `LEVEL_SETS`: the simplest whose leave-one-out mean relative
    error on the measured steps is within one standard error of the lowest (the one-standard-
    error rule), with each set's error; the global map alone below three steps. Terms the
    measurements cannot tell from noise (two devices that differ by a scale) would otherwise
    fit the noise of a few rows."""
    y = np.asarray(y, dtype=float)
    if len(y) < 3:
        return LEVEL_SETS[0], {}
    errors = {levels: np.abs(leave_one_out(cand_kinds, cand_x, kinds, x, y, levels) - y) / y
              for levels in LEVEL_SETS}
    means = {levels: float(e.mean()) for levels, e in errors.items()}
    lowest = min(means, key=means.get)
    bound = means[lowest] + float(errors[lowest].std(ddof=1) / np.sqrt(len(y)))
    chosen = next(levels for levels in LEVEL_SETS if means[levels] <= bound)
    return chosen, {"+".join(levels): round(error, 6) for levels, error in means.items()}


def leave_one_out(cand_kinds: Sequence[str], cand_x: np.ndarray, kinds: Sequence[str],
                  x: np.ndarray, y: Sequence[float], levels: Sequence[str] | None = LEVELS
                  ) -> np.ndarray:
    """Each measured step's price by the transfer fitted on the others (NaN with one step);
    levels None: each of those fits chooses its own (`select_levels`), as the full fit did."""
    y = np.asarray(y, dtype=float)
    x = _prices(x)
    kinds = np.asarray(kinds, dtype=object)
    out = np.full(len(y), np.nan)
    if len(y) < 2:
        return out
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        model = LatencyTransfer.fit(cand_kinds, cand_x, kinds[keep], x[keep], y[keep], levels)
        out[i] = model.predict(kinds[i:i + 1], x[i:i + 1])[0]
    return out


def choose_rows(kinds: Sequence[str], x: np.ndarray, n: int, taken: Sequence[int] = (),
                levels: Sequence[str] = LEVELS, exclude: Sequence[int] = ()) -> list[int]:
    """`n` more candidate steps to measure (indices into `kinds`/`x`, the source prices),
    beyond `taken` (already measured): greedily the step whose transferred price has the
    largest posterior variance of its relative error (D-optimal; module docstring), never one
    of `exclude`. Ties go to the earlier candidate, so the choice is deterministic."""
    x = _prices(x)
    kinds = np.asarray(kinds, dtype=object)
    design = TransferDesign.of(kinds, x, np.full(x.shape[1], 1.0 / x.shape[1]), levels)
    Z = design.matrix(kinds, x) / (x.mean(axis=1))[:, None]  # relative: a row over its price
    _, sd = design.prior()
    cov = np.diag(np.square(sd))
    chosen: list[int] = []
    free = np.ones(len(Z), dtype=bool)
    for i in taken:
        cov = _observe(cov, Z[i])
        free[i] = False
    free[list(exclude)] = False  # not to be chosen (a step that failed here), nothing learnt
    for _ in range(min(n, int(free.sum()))):
        variance = np.einsum("ij,jk,ik->i", Z, cov, Z)
        variance[~free] = -np.inf
        best = int(np.flatnonzero(variance >= variance.max() * (1 - 1e-9))[0])
        chosen.append(best)
        free[best] = False
        cov = _observe(cov, Z[best])
    return chosen


def _observe(cov: np.ndarray, z: np.ndarray) -> np.ndarray:
    """The posterior covariance after one measurement of relative design `z` (Sherman-
    Morrison)."""
    cz = cov @ z
    return cov - np.outer(cz, cz) / (NOISE ** 2 + float(z @ cz))
