"""One hardware id's latency predictor: fitted on a profile's rows, evaluated on held-out grid
points, saved beside the profile (`persist`), and asked by the search (`query.LatencyModel`).

The model is linear in the context beyond the profiled contexts, yet a search is refused at a
context outside them (`check_context`), up to `CONTEXT_MARGIN` of their span; a spec of a draft
size outside the profiled ones is refused too (`check_sizes`). A metric that is undefined
(Kendall's tau of a single held-out row) is NaN in memory and null in predictor.json, which is
strict JSON (`supernet.core.io.atomic_write_json`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from dreams_nas.latency.kinds import DRAFT_AXES, DRAFT_KINDS, TARGET_KINDS
from dreams_nas.latency.model import persist
from dreams_nas.latency.model.draft_regression import latency_metrics
from dreams_nas.latency.model.regressor import make_regressor
from dreams_nas.latency.model.validation import holdout_split, metrics_by_kind
from dreams_nas.supernet.core.errors import InputError, MissingArtefactError
from dreams_nas.supernet.core.io import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_json,
)
from dreams_nas.supernet.core.spec import SIZE_DEFAULTS, SubnetSpec
from dreams_nas.supernet.core.versions import library_versions

# A search may run at most this share of the profiled contexts' span outside them. The context it
# runs at is itself an estimate (the eval prompts' median length plus half the answer), and a
# least-squares line's standard error a tenth of the span beyond its data is only ~15 % above
# its error at the data's edge (variance ~ 1 + 12 (x - mean)^2 / span^2: 4 at the edge, 5.3
# there); farther out, the error grows with the distance and is not worth trusting. A profile
# at one context has no span: any other context is refused.
CONTEXT_MARGIN = 0.1


@dataclass
class LatencyPredictor:
    """A fitted predictor of one hardware id, with how well it predicted unseen rows."""

    hardware_id: str
    model: Any  # the fitted `regressor.LatencyRegressor`
    train_rows: pd.DataFrame
    visual_tokens: int = 0
    metrics: dict[str, float] = field(default_factory=dict)  # pooled over the held-out rows
    # {metric kind: metrics of its held-out rows + n} (`validation.metrics_by_kind`)
    metrics_by_kind: dict[str, dict[str, float]] = field(default_factory=dict)
    holdout: list[dict[str, Any]] = field(default_factory=list)
    n_holdout: int = 0
    holdout_fraction: float = 0.0  # the share of grid points asked to be held out
    seed: int = 0
    stat: str = "median_ms"  # the per-row statistic the model was fitted on
    # what the timed rows depend on besides the hardware id (dtype, software stack, the
    # target's architecture hash): a predictor answers only for these (`check_fingerprint`)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    # a transferred predictor (`dreams-nas profile --transfer-from`): its sources, how many
    # steps were measured here and what was fitted (`transfer.LatencyTransfer.summary`); empty
    # for a predictor fitted on this device's own full profile
    transfer: dict[str, Any] = field(default_factory=dict)
    _sizes: dict[str, tuple[float, float]] | None = field(default=None, init=False, repr=False,
                                                          compare=False)
    draft_fields = DRAFT_AXES  # `query.LatencyModel`: a draft step depends on these alone

    # --- the query (`query.LatencyModel`) ------------------------------------------------
    def predict_rows(self, rows: pd.DataFrame) -> np.ndarray:
        """Milliseconds for rows with columns kind, heads, visual_keep, depth, mlp, draft_vocab,
        context_len, k (without depth, mlp or draft_vocab: 1 there)."""
        return np.asarray(self.model.predict(rows), dtype=float)

    def draft_ms(self, specs: Sequence[SubnetSpec], context_len: int, kind: str = "draft",
                 k: int = 1) -> np.ndarray:
        """One draft step of each spec (its inject_layer and draft_len do not change it):
        kind ``draft`` a hot step (over `k` nodes: a token tree's level), ``draft_first`` the
        cycle's first step, right after the target's verify. A spec whose depth, mlp or
        draft_vocab lies outside the profiled range is refused (`check_sizes`): it would be
        extrapolated."""
        if kind not in DRAFT_KINDS:
            raise ValueError(f"draft kind {kind!r} is not one of {', '.join(DRAFT_KINDS)}")
        specs = list(specs)
        self.check_sizes(specs)
        rows = pd.DataFrame({"kind": kind, "heads": [s.heads for s in specs],
                             "visual_keep": [s.visual_keep for s in specs],
                             "depth": [s.depth for s in specs], "mlp": [s.mlp for s in specs],
                             "draft_vocab": [s.draft_vocab for s in specs],
                             "context_len": int(context_len), "k": int(k)})
        return self.predict_rows(rows)

    def target_ms(self, kind: str, ks: Sequence[int], context_len: int) -> np.ndarray:
        """One target step of `kind` over each k positions: ``decode`` (k = 1), ``verify``
        (k = draft_len + 1), ``verify_tree`` (a tree's nodes + 1), or a cycle's own work
        (``cycle``, ``cycle_tree``: acceptance, cache rollback, bookkeeping)."""
        if kind not in TARGET_KINDS:
            raise ValueError(f"target kind {kind!r} is not one of {', '.join(TARGET_KINDS)}")
        ks = np.atleast_1d(np.asarray(ks, dtype=int))
        rows = pd.DataFrame({"kind": kind, "heads": np.nan, "visual_keep": np.nan,
                             "context_len": int(context_len), "k": ks})
        return self.predict_rows(rows)

    def prices(self, kind: str) -> bool:
        """Whether the profile timed `kind` (a profile may lack the cycle kinds)."""
        return kind in self.model.regressors()

    def size_range(self) -> dict[str, tuple[float, float]]:
        """{depth/mlp/draft_vocab: (lowest, highest)} over the draft rows fitted on (empty
        without any)."""
        if self._sizes is None:
            drafts = self.train_rows[self.train_rows["kind"].isin(DRAFT_KINDS)]
            self._sizes = {} if drafts.empty else {
                name: (float(drafts[name].min()), float(drafts[name].max()))
                for name in SIZE_DEFAULTS}
        return self._sizes

    def check_sizes(self, specs: Sequence[SubnetSpec]) -> None:
        """Refuse specs deeper or shallower, wider or narrower, or with a larger or smaller
        draft vocabulary than any draft row profiled: the regressor would extrapolate their
        cost."""
        for name, (low, high) in self.size_range().items():
            outside = sorted({getattr(s, name) for s in specs
                              if not low - 1e-9 <= getattr(s, name) <= high + 1e-9})
            if outside:
                span = f"{low:g}" if low == high else f"{low:g}..{high:g}"
                raise InputError(
                    f"the latency predictor of {self.hardware_id} was profiled at {name} {span}, "
                    f"not at {name} {', '.join(f'{v:g}' for v in outside)}; rerun "
                    "`dreams-nas profile` with the run's search space to time them")

    # --- the profiled contexts -------------------------------------------------------------
    def contexts(self) -> list[int]:
        """The context lengths the rows were timed at, ascending."""
        return sorted({int(c) for c in self.train_rows["context_len"]})

    def context_range(self) -> tuple[int, int]:
        """(shortest, longest) context length profiled."""
        contexts = self.contexts()
        return contexts[0], contexts[-1]

    def allowed_contexts(self) -> tuple[float, float]:
        """The contexts a search may run at: the profiled range widened by `CONTEXT_MARGIN` of
        its span on each side (none for a profile at one context)."""
        low, high = self.context_range()
        margin = CONTEXT_MARGIN * (high - low)
        return low - margin, high + margin

    def check_context(self, context_len: int, source: str = "") -> None:
        """Refuse a context outside `allowed_contexts`: one line naming the context (and
        `source`, where it comes from), the profiled range and the `dreams-nas profile
        --context-lengths` that spans it."""
        low, high = self.allowed_contexts()
        if low - 1e-9 <= context_len <= high + 1e-9:
            return
        first, last = self.context_range()
        span = f"{first}" if first == last else f"{first}..{last}"
        slack = ("" if first == last else
                 f" (a search may lie up to {CONTEXT_MARGIN:.0%} of that span outside it: "
                 f"{low:g}..{high:g})")
        grid = " ".join(str(c) for c in sorted({*self.contexts(), int(context_len)}))
        raise InputError(
            f"the search runs at context length {int(context_len)}"
            f"{f' ({source})' if source else ''}, outside the contexts the latency "
            f"profile of {self.hardware_id} was timed at: {span}{slack}; its predictions are "
            "not trusted that far from its measurements: re-profile with a context grid "
            f"spanning it, e.g. `dreams-nas profile --context-lengths {grid}`")

    # --- fitting ------------------------------------------------------------------------
    @classmethod
    def fit(cls, rows: pd.DataFrame, hardware_id: str, *, visual_tokens: int = 0,
            holdout: float = 0.2, seed: int = 0, candidates: Any = None,
            stat: str = "median_ms", fingerprint: Mapping[str, Any] | None = None
            ) -> LatencyPredictor:
        """Evaluate on a held-out share of `rows`, then fit the saved model on all of them.

        stat: the per-row statistic fitted and predicted -- the median (default), or ``p10_ms``
        (what `dreams-nas profile` fits): the fastest samples are the ones other load and the
        machine's drift touched least, so they rank and predict steps best on a shared CPU.
        """
        if stat not in ("median_ms", "p10_ms"):
            raise InputError(f"stat={stat!r} must be median_ms or p10_ms")
        rows = pd.DataFrame(rows)
        if stat != "median_ms":
            rows = rows.assign(median_ms=rows[stat])
        return cls._fitted(persist.training_frame(rows, stat), hardware_id,
                           visual_tokens=visual_tokens, holdout=holdout, seed=seed,
                           candidates=candidates, stat=stat, fingerprint=fingerprint)

    @classmethod
    def _fitted(cls, rows: pd.DataFrame, hardware_id: str, *, visual_tokens: int,
                holdout: float, seed: int, candidates: Any = None, stat: str = "median_ms",
                fingerprint: Mapping[str, Any] | None = None) -> LatencyPredictor:
        """`fit` on a training frame (`persist.training_frame`: `median_ms` holds the statistic)."""
        if len(rows) < 4:
            raise InputError(
                f"only {len(rows)} successful measurements to fit a latency predictor on; "
                "profile more (a larger --budget or more --context-lengths)"
            )
        metrics: dict[str, float] = {}
        by_kind: dict[str, dict[str, float]] = {}
        held: list[dict[str, Any]] = []
        n_holdout = 0
        if holdout > 0:
            # whole grid points: a point's draft and draft_first rows on one side (`validation`)
            train, hold = holdout_split(rows, holdout, seed)
            if hold.any():
                probe = make_regressor(visual_tokens, candidates, random_state=seed)
                probe.fit(rows[train], rows.loc[train, "median_ms"].to_numpy())
                measured = rows.loc[hold, "median_ms"].to_numpy()
                predicted = probe.predict(rows[hold])
                metrics = latency_metrics(measured, predicted)
                by_kind = metrics_by_kind(rows[hold], measured, predicted)
                n_holdout = int(hold.sum())
                held = [
                    {"kind": r.kind, "spec_id": r.spec_id or None,
                     "context_len": int(r.context_len), "k": int(r.k),
                     "measured_ms": float(m), "predicted_ms": float(p)}
                    for r, m, p in zip(rows[hold].itertuples(index=False), measured, predicted,
                                       strict=True)
                ]
        model = make_regressor(visual_tokens, candidates, random_state=seed)
        model.fit(rows, rows["median_ms"].to_numpy())
        return cls(hardware_id=hardware_id, model=model, train_rows=rows,
                   visual_tokens=visual_tokens, metrics=metrics, metrics_by_kind=by_kind,
                   holdout=held, n_holdout=n_holdout, holdout_fraction=float(holdout),
                   seed=seed, stat=stat, fingerprint=dict(fingerprint or {}))

    def check_fingerprint(self, expected: Mapping[str, Any], where: str | Path = "") -> None:
        """Refuse to predict for another program (`persist.check_fingerprint`)."""
        persist.check_fingerprint(self.fingerprint, expected, where or self.hardware_id)

    # --- persistence (`persist`) ------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """The predictor.json document (less the skops file's hash, `save` adds it)."""
        regressors = self.model.regressors()
        low, high = self.context_range()
        return {
            "schema_version": persist.PREDICTOR_SCHEMA_VERSION,
            "hardware_id": self.hardware_id, "regressor": regressor_summary(regressors),
            "regressors": regressors, "cv_scores": self.model.cv_scores(),
            "cv_metric": ("root mean squared relative error of ms, grouped K-fold over grid "
                          "points, per draft kind; mean relative error of each row left out, "
                          "per target kind (its table and its surface); lower is better"),
            "metrics": self.metrics, "metrics_by_kind": self.metrics_by_kind,
            "context_range": [low, high], "context_margin": CONTEXT_MARGIN,
            "holdout": self.holdout, "holdout_fraction": self.holdout_fraction,
            "n_train": len(self.train_rows) - self.n_holdout, "n_holdout": self.n_holdout,
            "n_fit": len(self.train_rows), "visual_tokens": self.visual_tokens, "seed": self.seed,
            "stat": self.stat, "fingerprint": self.fingerprint,
            **({"transfer": self.transfer} if self.transfer else {}),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": library_versions(),
        }

    def save(self, directory: str | Path) -> Path:
        """Write predictor_train.csv, predictor.skops and predictor.json (with the skops
        file's hash) to `directory`."""
        directory = Path(directory)
        payload = persist.dump_model(self.model)
        atomic_write_text(directory / "predictor_train.csv", self.train_rows.to_csv(index=False))
        atomic_write_bytes(directory / persist.MODEL_FILE, payload)
        atomic_write_json(directory / "predictor.json",
                          {**self.report(), "skops_sha256": hashlib.sha256(payload).hexdigest()})
        return directory

    @classmethod
    def load(cls, directory: str | Path, expect: Mapping[str, Any] | None = None
             ) -> LatencyPredictor:
        """The saved predictor. expect: fingerprint values the caller needs
        (`persist.check_fingerprint`), checked first."""
        directory = Path(directory)
        meta_path = directory / "predictor.json"
        if not meta_path.is_file():
            raise MissingArtefactError(
                f"no latency predictor in {directory}; run `dreams-nas profile` first")
        meta = read_json(meta_path)
        if not isinstance(meta, dict) or not isinstance(meta.get("hardware_id"), str):
            raise InputError(f"{meta_path} is not a predictor.json (no JSON object with a "
                             f"hardware_id); {persist.REFIT}")
        fingerprint = dict(meta.get("fingerprint") or {})
        persist.check_fingerprint(fingerprint, expect or {}, directory)
        model = persist.load_model(directory, meta)
        rows = persist.read_train_rows(directory / "predictor_train.csv")
        try:
            seed, n_holdout = int(meta.get("seed", 0)), int(meta.get("n_holdout", 0))
            visual_tokens = int(meta.get("visual_tokens", 0))
            holdout_fraction = float(meta.get("holdout_fraction", 0.0))
        except (TypeError, ValueError) as exc:
            raise InputError(f"{meta_path} holds a non-number seed, visual_tokens, n_holdout or "
                             f"holdout_fraction ({exc}); {persist.REFIT}") from None
        by_kind = meta.get("metrics_by_kind")
        return cls(hardware_id=meta["hardware_id"], model=model, train_rows=rows,
                   visual_tokens=visual_tokens, metrics=persist.metrics_of(meta.get("metrics")),
                   metrics_by_kind={str(k): persist.metrics_of(v, counts=("n",))
                                    for k, v in by_kind.items()}
                   if isinstance(by_kind, Mapping) else {},
                   holdout=list(meta.get("holdout") or []), n_holdout=n_holdout,
                   holdout_fraction=holdout_fraction, seed=seed,
                   stat=str(meta.get("stat", "median_ms")), fingerprint=fingerprint,
                   transfer=dict(meta["transfer"]) if isinstance(meta.get("transfer"), Mapping)
                   else {})


def regressor_summary(regressors: Mapping[str, str]) -> str:
    """predictor.json's `regressor`, one line: ``draft linear, draft_first linear; target steps
    interpolated`` (every draft kind's choice, then the target kinds': one word when they agree,
    else each kind's)."""
    drafts = [f"{kind} {name}" for kind, name in regressors.items() if kind in DRAFT_KINDS]
    target = {kind: name for kind, name in regressors.items() if kind not in DRAFT_KINDS}
    parts = [", ".join(drafts)] if drafts else []
    if len(set(target.values())) == 1:
        parts.append(f"target steps {next(iter(target.values()))}")
    elif target:
        parts.append("target steps " + ", ".join(f"{k} {n}" for k, n in target.items()))
    return "; ".join(parts) or "none"
